"""Write outputs safely: regular files atomically (a temp file beside the target, renamed into place on success).

What an output path names decides how it is written (:func:`atomic_path`):

* a new path or a regular file: a temp file beside it, ``os.replace``-d onto it once the block succeeds, removed
  if it fails (an exception, Ctrl-C, or SIGTERM, which the command line turns into ``SystemExit(143)``);
* a symlink: the same, through the link: the temp file goes beside the link's final target, which is replaced,
  and the link stays a link;
* a character device (``/dev/null``, a terminal) or a FIFO: written directly, never replaced by a regular file;
* ``-`` (:data:`STDOUT`): standard output (written to a temp file first, then copied there);
* a block device, a socket or a directory: refused.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from collapse_doctor.core.errors import OutputError
from collapse_doctor.core.text_safety import printable, shortened
from collapse_doctor.io.storage.remote import RemotePath, as_url, looks_remote

STDOUT = "-"
"""The output path that means standard output, for every output option."""


def is_stdout(output: str | Path | None) -> bool:
    """Whether ``output`` is ``-`` (standard output)."""
    return output is not None and str(output) == STDOUT


NAME_MAX = 255
"""The longest file name (in bytes) most file systems allow, where the file system does not say."""
TEMP_NAME = 64
"""How many bytes of the output's name the temp file beside it repeats (a long name leaves room for the rest)."""


def check_name(output: Path) -> None:
    """Refuse a file name longer than its file system allows (checked before any work, never a crash at the end)."""
    name = os.fsencode(output.name)
    directory = output.parent if str(output.parent) else Path(".")
    try:
        limit = os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = NAME_MAX
    if len(name) > limit:
        raise OutputError(
            f"{printable(output.parent / shortened(output.name))}: the file name is {len(name)} bytes; this file "
            f"system allows {limit}",
            hint="choose a shorter file name",
        )


def check_not_an_input(output: Path, inputs: Sequence[Path]) -> None:
    """Refuse to write over one of the files being read."""
    if is_stdout(output):
        return
    check_name(output)
    target = output.resolve()
    for source in inputs:
        if isinstance(source, RemotePath):
            continue  # outputs are local files (check_writable), never an object in storage
        same = target == source.resolve()
        if not same and output.exists():
            with contextlib.suppress(OSError):
                same = os.path.samefile(output, source)
        if same:
            raise OutputError(f"{output}: refusing to overwrite an input file", hint="choose another output path")


def refuse_shared_paths(outputs: Iterable[tuple[str, Path | None]]) -> None:
    """Two outputs on one path (after resolving symlinks; ``-`` twice is standard output twice): a UsageError
    naming both options."""
    from collapse_doctor.core.errors import UsageError

    seen: dict[str, str] = {}
    for option, path in outputs:
        if path is None:
            continue
        key = "-" if is_stdout(path) else os.path.realpath(path)
        if key in seen:
            raise UsageError(f"{seen[key]} and {option} both write to {path}", hint="give each output its own path")
        seen[key] = option


def check_outputs(outputs: Iterable[tuple[str, Path | None]], inputs: Sequence[Path]) -> None:
    """Fail before any work when an output shares a path with another, is one of ``inputs``, or cannot be
    written; ``outputs`` are ``(option, path)`` pairs (``None``: not asked for), named in the errors' hints."""
    outputs = list(outputs)
    refuse_shared_paths(outputs)
    for option, path in outputs:
        if path is None or is_stdout(path):
            continue
        try:
            check_not_an_input(path, inputs)
        except OutputError as exc:
            raise OutputError(exc.message, hint=f"choose another path for {option}") from None
        try:
            check_writable(path)
        except OutputError as exc:
            if exc.message.endswith("is a directory"):
                raise OutputError(exc.message, hint=f"pass a file path with {option}") from None
            raise


def _kind(path: Path) -> str:
    """``new``, ``file``, ``direct`` (character device, FIFO), ``dir`` or ``other`` (block device, socket)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "new"
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from exc
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "direct"
    if stat.S_ISDIR(mode):
        return "dir"
    return "other"


def check_writable(output: Path) -> None:
    """Fail (:class:`OutputError`) when ``output`` cannot be an output: missing directory, a directory, ..."""
    if is_stdout(output):
        return
    if looks_remote(output):
        raise OutputError(
            f"{as_url(output)}: outputs are written to local files, not to object storage",
            hint="write it to a local path and upload that (aws s3 cp, gsutil cp, az storage blob upload)",
        )
    kind = _kind(output)
    if kind == "dir":
        raise OutputError(
            f"{output}: is a directory", hint="pass a file path (a new or existing file), not a directory"
        )
    if kind == "other":
        raise OutputError(
            f"{output}: is not a regular file, a character device or a FIFO",
            hint="pass a file path (a new or existing file)",
        )
    if kind == "new":
        target = Path(os.path.realpath(output))
        directory = target.parent if output.is_symlink() else (output.parent if str(output.parent) else Path("."))
        if not directory.is_dir():
            raise OutputError(f"{output}: directory {str(directory)!r} does not exist", hint="create it first")


@contextlib.contextmanager
def atomic_path(output: str | Path, *, inputs: Sequence[Path] = ()) -> Iterator[Path]:
    """Yield the path to write ``output`` through; see the module docstring for what each kind of path gets.

    Regular files and new paths: a temp path in the (final target's) directory, moved onto the target only if
    the block succeeds. Character devices and FIFOs: the path itself. ``-``: a temp file copied to stdout.
    An ``OSError`` inside the block (a full disk, ``/dev/full``) becomes one :class:`OutputError`.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "out.txt"
    >>> with atomic_path(target) as tmp:
    ...     _ = tmp.write_text("done")
    >>> target.read_text()
    'done'
    """
    output = Path(output)
    check_not_an_input(output, inputs)
    check_writable(output)
    if is_stdout(output):
        with _temp(output, Path(tempfile.gettempdir())) as tmp:
            yield tmp
            _copy_to_stdout(output, tmp)
        return
    target = Path(os.path.realpath(output)) if output.is_symlink() else output
    if _kind(target) == "direct":
        try:
            yield target
        except OSError as exc:
            raise _write_error(output, exc) from exc
        return
    directory = target.parent if str(target.parent) else Path(".")
    with _temp(output, directory) as tmp:
        yield tmp
        os.replace(tmp, target)


@contextlib.contextmanager
def _temp(output: Path, directory: Path) -> Iterator[Path]:
    """A temp file in ``directory`` (the permissions of a file the user creates), removed unless moved away."""
    # UTF-8 whatever the output's name (pyarrow opens paths as UTF-8): the name's bytes are the rename's business
    name = os.fsencode(output.name)[:TEMP_NAME].decode("utf-8", "replace") if not is_stdout(output) else "stdout"
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise OutputError(f"{output}: cannot write in {str(directory)!r} ({exc.strerror})") from exc
    tmp = Path(temp)
    _LIVE.add(tmp)
    try:
        os.close(fd)
        # mkstemp creates 0o600; the finished file should get the permissions of any file the user creates.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        yield tmp
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
            raise _write_error(output, exc) from exc
        raise
    else:
        with contextlib.suppress(OSError):  # moved onto the target: nothing left; copied to stdout: removed
            tmp.unlink()
    finally:
        _LIVE.discard(tmp)


_LIVE: set[Path] = set()
"""The temp files being written now (what :func:`remove_temp_files` removes)."""


def remove_temp_files() -> None:
    """Remove the temp files being written now: what a process that must end at once (a second Ctrl-C) leaves
    tidy; the targets themselves are untouched (never half-written)."""
    for tmp in list(_LIVE):
        with contextlib.suppress(OSError):
            tmp.unlink()
        _LIVE.discard(tmp)


def _copy_to_stdout(output: Path, tmp: Path) -> None:
    stream = sys.stdout
    stream.flush()
    binary = getattr(stream, "buffer", None)
    with open(tmp, "rb") as source:
        if binary is not None:
            shutil.copyfileobj(source, binary)
            binary.flush()
        else:  # a text-only stream (a test's StringIO): text outputs only
            stream.write(source.read().decode("utf-8"))
            stream.flush()


def _write_error(output: Path, exc: OSError) -> OutputError:
    detail = exc.strerror or " ".join(str(exc).split()) or type(exc).__name__
    return OutputError(f"{output}: cannot write ({detail})")
