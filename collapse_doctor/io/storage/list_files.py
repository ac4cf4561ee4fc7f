"""``@FILE`` inputs: a text file that lists the inputs of a scan, one per line (a sweep's runs).

Blank lines and lines starting with ``#`` are skipped; a relative path is relative to the list file's directory
(so a list kept beside the runs works from anywhere). Any other argument is passed through unchanged, so a path
that really starts with ``@`` is written ``./@name``.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from collapse_doctor.core.errors import InputError


def expand_list_files(paths: Sequence[str | Path]) -> list[str | Path]:
    """``paths`` with every ``@FILE`` replaced by the paths it lists (see the module docstring).

    >>> import tempfile, os
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     Path(tmp, "lr-1e-6").mkdir()
    ...     _ = Path(tmp, "runs.txt").write_text("# sweep\\nlr-1e-6\\n\\ns3://bucket/lr-3e-6\\nseed-*\\n")
    ...     out = expand_list_files(["a.parquet", "@" + os.path.join(tmp, "runs.txt")])
    ...     [str(p).replace(tmp, "TMP") for p in out]
    ['a.parquet', 'TMP/lr-1e-6', 's3://bucket/lr-3e-6', 'TMP/seed-*']
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
        listed = [
            (number, line.strip())
            for number, line in enumerate(lines, 1)
            if line.strip() and not line.strip().startswith("#")
        ]
        if not listed:
            raise InputError(f"{text}: the list file names no input", hint="write one run path per line")
        for number, entry in listed:
            out.append(_listed(text, listing, number, entry))
    return out


def _listed(text: str, listing: Path, number: int, entry: str) -> str:
    """One entry of a list file as a path (relative ones below the list's directory); an error naming the list and
    the line for an entry that is another list or a local path that does not exist."""
    where = f"{text} line {number}"
    if entry.startswith("@"):
        raise InputError(
            f"{where}: {entry}: a list file cannot name another list file",
            hint="list the runs themselves, or pass each list as its own @FILE argument",
        )
    if "://" in entry:
        return entry
    path = Path(entry) if Path(entry).is_absolute() else listing.parent / entry
    if not glob.has_magic(entry) and not path.exists() and not path.is_symlink():
        below = listing.parent.resolve()
        relative = "" if Path(entry).is_absolute() else f" (relative to the list's directory {below})"
        raise InputError(
            f"{where}: {entry}: no such file or directory{relative}",
            hint="fix the path in the list, or remove the line",
        )
    return str(path)
