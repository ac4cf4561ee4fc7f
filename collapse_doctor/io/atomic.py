"""Write outputs atomically: into a temp file beside the target, renamed into place on success."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from collapse_doctor.errors import OutputError


def check_not_an_input(output: Path, inputs: Sequence[Path]) -> None:
    """Refuse to write over one of the files being read."""
    target = output.resolve()
    for source in inputs:
        same = target == source.resolve()
        if not same and output.exists():
            with contextlib.suppress(OSError):
                same = os.path.samefile(output, source)
        if same:
            raise OutputError(f"{output}: refusing to overwrite an input file", hint="choose another output path")


@contextlib.contextmanager
def atomic_path(output: str | Path, *, inputs: Sequence[Path] = ()) -> Iterator[Path]:
    """Yield a temp path in the output's directory; move it onto ``output`` only if the block succeeds.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_path(target) as tmp:
    ...     _ = tmp.write_text("done")
    >>> target.read_text()
    'done'
    """
    output = Path(output)
    check_not_an_input(output, inputs)
    directory = output.parent if str(output.parent) else Path(".")
    if not directory.is_dir():
        raise OutputError(f"{output}: directory {str(directory)!r} does not exist", hint="create it first")
    if output.is_dir():
        raise OutputError(
            f"{output}: is a directory", hint="pass a file path (a new or existing file), not a directory"
        )
    try:
        fd, name = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise OutputError(f"{output}: cannot write in {str(directory)!r} ({exc.strerror})") from exc
    os.close(fd)
    tmp = Path(name)
    # mkstemp creates 0o600; the finished file should get the permissions of any file the user creates.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield tmp
        os.replace(tmp, output)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):
            raise OutputError(f"{output}: cannot write ({exc.strerror or exc})") from exc
        raise
