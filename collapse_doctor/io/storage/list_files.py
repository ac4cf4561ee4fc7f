"""``@FILE`` inputs: a text file that lists the inputs of a scan, one per line (a sweep's runs).

Blank lines and lines starting with ``#`` are skipped; a relative path is relative to the list file's directory
(so a list kept beside the runs works from anywhere). Any other argument is passed through unchanged, so a path
that really starts with ``@`` is written ``./@name``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from collapse_doctor.core.errors import InputError


def expand_list_files(paths: Sequence[str | Path]) -> list[str | Path]:
    """``paths`` with every ``@FILE`` replaced by the paths it lists (see the module docstring).

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = Path(tmp, "runs.txt").write_text("# sweep\\nlr-1e-6\\n\\n/abs/lr-3e-6\\n")
    ...     out = expand_list_files(["a.parquet", "@" + os.path.join(tmp, "runs.txt")])
    ...     [str(p).replace(tmp, "TMP") for p in out]
    ['a.parquet', 'TMP/lr-1e-6', '/abs/lr-3e-6']
    """
    out: list[str | Path] = []
    for raw in paths:
        text = str(raw)
        if not text.startswith("@") or len(text) == 1:
            out.append(raw)
            continue
        listing = Path(text[1:])
        try:
            lines = listing.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise InputError(
                f"{text}: cannot read the list file {listing} ({reason})",
                hint="@FILE names a text file with one input per line; write ./@name for a path that starts with @",
            ) from exc
        listed = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
        if not listed:
            raise InputError(f"{text}: the list file names no input", hint="write one run path per line")
        out += [
            entry if "://" in entry or Path(entry).is_absolute() else str(listing.parent / entry) for entry in listed
        ]
    return out
