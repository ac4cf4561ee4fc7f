"""S3 through botocore alone: the six filesystem calls :mod:`collapse_doctor.io.storage.remote` makes of a bucket.

``s3://`` URLs were read through fsspec's s3fs. Importing s3fs with aiobotocore and making its session cost about
0.44 s in every process that reads a bucket, and fsspec's own import another 0.1 s; botocore alone, its import
and ``create_client("s3")`` together, costs about 0.23 s (2 cores, botocore 1.43). On TRL's one-file-per-step
layout that difference was most of what kept a scan from S3 above twice the time of the local scan
(docs/benchmarks.md, "Object storage"). What remote.py asks of a filesystem is little: :meth:`BotocoreS3.info`,
``exists``, ``find``, ``glob``, ``cat_file`` and ``open``. This module answers those calls with botocore's
synchronous client and s3fs's meanings, so :class:`~collapse_doctor.io.storage.remote.RemotePath` behaves as it
did: names are ``bucket/key``; a prefix with objects below it is a ``directory``; ``end`` is exclusive; an opened
object is an unbuffered handle, each read one ranged GET; glob patterns are fsspec's (``*`` and ``?`` stay within
one path segment, ``**`` spans any number of them, ``[...]`` is a character class). It never imports fsspec.

Errors are those s3fs raised: S3's "no such key/bucket" answers become :class:`FileNotFoundError`, its "access
denied" answers :class:`PermissionError`, each with S3's own message. botocore's other exceptions (no credentials,
an unreachable endpoint, a bad profile) pass through unchanged, for
:func:`~collapse_doctor.io.storage.remote.remote_error` to name by their class.

One client serves every thread (botocore clients are thread safe), with a connection pool as large as the
concurrent fetches of :func:`~collapse_doctor.io.storage.remote.prefetch`, so none waits for a connection.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import re
from collections.abc import Callable, Iterator
from typing import IO, Any, Literal, cast

__all__ = ["BotocoreS3", "RangedObject", "glob_pattern"]

_MISSING_CODES = frozenset({"404", "NoSuchKey", "NoSuchBucket", "NoSuchVersion", "NotFound"})
_DENIED_CODES = frozenset(
    {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "Forbidden"}
)
_MAGIC = re.compile(r"[*?\[]")
PAGE_SIZE = 1000
"""Keys per LIST request: S3's maximum, so a prefix of n objects costs ceil(n / 1000) requests."""


class BotocoreS3:
    """The S3 calls RemotePath makes, through one botocore client (module docstring).

    ``endpoint_url`` points it at an S3-compatible server (``None``: AWS). Credentials and the region come from
    botocore's usual chain: environment keys, ``AWS_PROFILE`` and the shared files, instance and container roles;
    the region also from ``AWS_REGION``. A bucket in another region is followed by botocore itself.
    """

    def __init__(self, *, endpoint_url: str | None = None, max_pool_connections: int = 16) -> None:
        import botocore.config
        import botocore.exceptions
        import botocore.session

        session = botocore.session.get_session()
        region = (
            session.get_config_variable("region")
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or None
        )
        # A pool no smaller than botocore's default (10); retries in botocore's "standard" mode (AWS_MAX_ATTEMPTS
        # still sets their number).
        config = botocore.config.Config(
            max_pool_connections=max(10, max_pool_connections), retries={"mode": "standard"}
        )
        self._client: Any = session.create_client("s3", region_name=region, endpoint_url=endpoint_url, config=config)
        self._client_error: type[Exception] = botocore.exceptions.ClientError

    # --- what is there ----------------------------------------------------------------------------------------

    def info(self, path: str) -> dict[str, Any]:
        """What S3 says about ``bucket/key``: an object (one HEAD), else a prefix with something below it (one
        LIST of at most one key), a bare bucket name (HEAD of the bucket); else :class:`FileNotFoundError`."""
        bucket, key = _split(path)
        if not key:
            with self._translated():
                self._client.head_bucket(Bucket=bucket)
            return {"name": bucket, "type": "directory", "size": 0, "StorageClass": "BUCKET"}
        with contextlib.suppress(FileNotFoundError):
            return self._head(bucket, key)
        if self._has_objects_below(bucket, key):
            return _directory(bucket, key)
        raise FileNotFoundError(f"{bucket}/{key}: no such object or prefix")

    def exists(self, path: str) -> bool:
        """Whether :meth:`info` finds an object or prefix (errors other than "not found" are raised)."""
        try:
            self.info(path)
        except FileNotFoundError:
            return False
        return True

    def find(self, path: str, *, detail: Literal[True] = True) -> dict[str, dict[str, Any]]:
        """``{"bucket/key": info}`` of every object below the prefix ``path`` (one LIST per 1000 objects), sorted;
        the object itself when ``path`` names one and nothing is below it; ``{}`` when neither."""
        bucket, key = _split(path)
        prefix = f"{key}/" if key else ""
        entries = self._listing(bucket, prefix)
        if not entries and key:
            with contextlib.suppress(FileNotFoundError):
                return {f"{bucket}/{key}": self._head(bucket, key)}
            return {}
        return {name: info for name, info in sorted(entries.items()) if info["type"] == "file"}

    def glob(self, path: str, *, detail: Literal[True] = True) -> dict[str, dict[str, Any]]:
        """``{"bucket/key": info}`` of the objects and prefixes whose names match the pattern ``path``, with
        fsspec's glob semantics (module docstring; a pattern ending in ``/`` matches prefixes only). Everything
        below the pattern's literal start is listed once (one LIST per 1000 objects), then matched here."""
        directories_only = path.endswith("/")
        bucket, key = _split(path)
        if _MAGIC.search(bucket):
            raise ValueError(f"{path}: a pattern cannot match bucket names (name the bucket)")
        magic = _MAGIC.search(key)
        if magic is None:
            try:
                info = self.info(path)
            except FileNotFoundError:
                return {}
            return {info["name"]: info}
        literal = key[: magic.start()]
        root = literal[: literal.rfind("/") + 1]
        entries = self._listing(bucket, literal)
        candidates = {n: i for n, i in entries.items() if i["type"] == "file"}
        candidates.update(_directories_below(bucket, root, entries))
        if root and entries:  # the pattern's fixed directory is one of fsspec's candidates too (`run/**`)
            candidates[f"{bucket}/{root.rstrip('/')}"] = _directory(bucket, root.rstrip("/"))
        matches = glob_pattern(key).match
        # As fsspec does, a pattern ending in `/**` takes a prefix as its name and a slash: `run/**` matches
        # `run/sub` (`run/sub/`), not only what lies below it.
        slash = "/" if key.endswith("/**") else ""
        skip = len(bucket) + 1
        return {
            name: info
            for name, info in sorted(candidates.items())
            if (
                matches(name[skip:] + slash)
                if info["type"] == "directory"
                else not directories_only and matches(name[skip:])
            )
        }

    # --- reading ----------------------------------------------------------------------------------------------

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """The object's bytes from ``start`` to ``end`` (exclusive; negative counts from the end, as a slice
        does; ``None``: the object's start or end), in one GET (with a Range header unless both are ``None``)."""
        bucket, key = _split(path)
        if start is None and end is None:
            return self._get(bucket, key, None)
        if (start or 0) < 0 or (end is not None and end < 0):
            size = int(self.info(path)["size"])
            start, end = slice(start, end).indices(size)[:2]
        begin = start or 0
        if end is not None and end <= begin:
            return b""
        return self._get(bucket, key, f"bytes={begin}-" if end is None else f"bytes={begin}-{end - 1}")

    def open(
        self, path: str, mode: str = "rb", cache_type: str = "none", *, size: int | None = None, **text: Any
    ) -> IO[Any]:
        """A read-only, seekable handle on the object: each read is one ranged GET of what it asks for, nothing
        is fetched ahead (``cache_type`` is accepted for fsspec's signature; there is no other). Its size is
        ``size`` when known, else one HEAD now (so a missing object fails here, not at the first read). Text
        modes wrap it in :class:`io.TextIOWrapper` (``text``: its ``encoding``, ``errors``, ``newline``)."""
        if mode not in ("rb", "r", "rt"):
            raise ValueError(f"{path}: objects are opened for reading only (mode {mode!r})")
        bucket, key = _split(path)
        if size is None:
            info = self.info(path)
            if info["type"] != "file":
                raise IsADirectoryError(f"{bucket}/{key}: a prefix, not an object")
            size = int(info["size"])

        def fetch(begin: int, end: int) -> bytes:
            return self._get(bucket, key, f"bytes={begin}-{end - 1}")

        handle = RangedObject(fetch, size, f"{bucket}/{key}")
        return cast(IO[Any], handle if mode == "rb" else io.TextIOWrapper(handle, **text))

    # --- requests ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        """S3's "not found" and "access denied" answers as the OSErrors s3fs raised (module docstring)."""
        try:
            yield
        except self._client_error as exc:
            error = _as_os_error(exc)
            if error is None:
                raise
            raise error from exc

    def _head(self, bucket: str, key: str) -> dict[str, Any]:
        with self._translated():
            head = self._client.head_object(Bucket=bucket, Key=key)
        return _object(bucket, key, head.get("ContentLength", 0), head) | {
            "VersionId": head.get("VersionId"),
            "ContentType": head.get("ContentType"),
        }

    def _has_objects_below(self, bucket: str, key: str) -> bool:
        with self._translated():
            listed = self._client.list_objects_v2(Bucket=bucket, Prefix=f"{key}/", MaxKeys=1)
        return bool(listed.get("KeyCount") or listed.get("Contents") or listed.get("CommonPrefixes"))

    def _listing(self, bucket: str, prefix: str) -> dict[str, dict[str, Any]]:
        """Every key starting with ``prefix``, as ``{"bucket/key": info}``; a key ending in ``/`` (a folder marker
        some tools write) is a directory of that name."""
        out: dict[str, dict[str, Any]] = {}
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, PaginationConfig={"PageSize": PAGE_SIZE}
        )
        with self._translated():
            for page in pages:
                for entry in page.get("Contents", ()):
                    info = _listed(bucket, entry)
                    if info["name"] != bucket:  # a marker `/` at the bucket's top names nothing
                        out[info["name"]] = info
        return out

    def _get(self, bucket: str, key: str, byte_range: str | None) -> bytes:
        """One GET of the object (``byte_range``: a Range header's value); a range that starts past the end reads
        nothing, as a file read there does."""
        request: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if byte_range is not None:
            request["Range"] = byte_range
        try:
            with self._translated():
                response = self._client.get_object(**request)
        except self._client_error as exc:
            if _code(exc) == "InvalidRange":
                return b""
            raise
        body = response["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data


class RangedObject(io.RawIOBase):
    """A read-only, seekable binary file over an object of known ``size``: every read is one call of
    ``fetch(start, end)`` (one ranged GET) for exactly the bytes asked for, so a reader such as pyarrow's Parquet
    reader, which asks for the footer and then the column chunks it needs, downloads only those."""

    mode = "rb"

    def __init__(self, fetch: Callable[[int, int], bytes], size: int, name: str) -> None:
        super().__init__()
        self._fetch = fetch
        self._position = 0
        self.size = size
        self.name = name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        bases = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}
        if whence not in bases:
            raise ValueError(f"invalid whence ({whence})")
        position = bases[whence] + offset
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        self._position = position
        return position

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes from the current position (all to the end when negative), in one request."""
        if size is None or size < 0:
            return self.readall()
        return self._read(size)

    def readall(self) -> bytes:
        return self._read(self.size - self._position)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._read(len(view))
        view[: len(data)] = data
        return len(data)

    def _read(self, wanted: int) -> bytes:
        if self.closed:
            raise ValueError(f"{self.name}: I/O operation on a closed object handle")
        wanted = min(wanted, self.size - self._position)
        if wanted <= 0:
            return b""
        data = self._fetch(self._position, self._position + wanted)
        self._position += len(data)
        return data


# --- names and patterns -------------------------------------------------------------------------------------


def _split(path: str) -> tuple[str, str]:
    """``("bucket", "key")`` of ``bucket/key`` (an ``s3://`` prefix and slashes at either end ignored).

    >>> _split("cd-runs/trl/completions/"), _split("s3://cd-runs"), _split("cd-runs/")
    (('cd-runs', 'trl/completions'), ('cd-runs', ''), ('cd-runs', ''))
    """
    if "://" in path:
        path = path.split("://", 1)[1]
    bucket, _, key = path.strip("/").partition("/")
    return bucket, key.strip("/")


def _listed(bucket: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The info of one entry of a LIST answer: an object, or a directory for a folder marker (a key ending in
    ``/``)."""
    key = entry["Key"]
    if key.endswith("/"):
        return _directory(bucket, key.rstrip("/"))
    return _object(bucket, key, entry.get("Size", 0), entry)


def _object(bucket: str, key: str, size: int, answer: dict[str, Any]) -> dict[str, Any]:
    """An object's info as s3fs gives it, from a HEAD answer or a LIST entry (``answer``) and its size."""
    return {
        "name": f"{bucket}/{key}",
        "type": "file",
        "size": int(size),
        "LastModified": answer.get("LastModified"),
        "ETag": answer.get("ETag", ""),
        "StorageClass": answer.get("StorageClass", "STANDARD"),
    }


def _directory(bucket: str, key: str) -> dict[str, Any]:
    return {"name": f"{bucket}/{key}".rstrip("/"), "type": "directory", "size": 0, "StorageClass": "DIRECTORY"}


def _directories_below(bucket: str, root: str, entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The prefixes strictly below ``root`` (a key prefix ending in ``/``, or ``""``) that the listed ``entries``
    lie in, as directory infos: S3 has no directories, only keys with slashes."""
    out: dict[str, dict[str, Any]] = {}
    skip = len(bucket) + 1
    for name, info in entries.items():
        key = name[skip:]
        if info["type"] == "directory" and len(key) >= len(root):
            out[name] = info
        slash = key.find("/", len(root))
        while slash >= 0:
            if slash > 0:
                out.setdefault(f"{bucket}/{key[:slash]}", _directory(bucket, key[:slash]))
            slash = key.find("/", slash + 1)
    return out


def glob_pattern(pattern: str) -> re.Pattern[str]:
    """The regular expression of a glob over keys, with fsspec's meanings: ``*`` is any run of characters and
    ``?`` any one character within a segment (never ``/``), a segment that is only ``*`` is a non-empty one,
    ``**`` alone as a segment is any number of segments (none included), ``[...]`` and ``[!...]`` are character
    classes. ``**`` inside a longer segment is refused, as fsspec refuses it.

    >>> match = glob_pattern("run/**/completions_*.parquet").match
    >>> [bool(match(k)) for k in ("run/completions_1.parquet", "run/a/b/completions_2.parquet", "run/x.parquet")]
    [True, True, False]
    >>> [bool(glob_pattern("run/*.parquet").match(k)) for k in ("run/a.parquet", "run/sub/a.parquet")]
    [True, False]
    """
    segments = pattern.split("/")
    parts: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            parts.append(".*" if last else "(?:.+/)?")  # the optional group carries its own slash
            continue
        if "**" in segment:
            raise ValueError(f"{pattern}: '**' can only be a whole path segment")
        parts.append("[^/]+" if segment == "*" else _segment_pattern(segment))
        if not last:
            parts.append("/")
    return re.compile("".join(parts) + r"\Z", re.DOTALL)


def _segment_pattern(segment: str) -> str:
    """The regular expression of one segment of a glob (no ``/`` in it): wildcards stay within the segment."""
    out: list[str] = []
    index = 0
    while index < len(segment):
        char = segment[index]
        if char == "*":
            if not out or out[-1] != "[^/]*":
                out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (close := _class_end(segment, index)) > 0:
            # fnmatch translates a lone class exactly as the shell reads it: ranges, `!` negation, a leading `]`.
            out.append(fnmatch.translate(segment[index : close + 1]).removeprefix("(?s:").removesuffix(r")\Z"))
            index = close + 1
            continue
        else:
            out.append(re.escape(char))
        index += 1
    return "".join(out)


def _class_end(segment: str, start: int) -> int:
    """The index of the ``]`` that closes the class opened at ``start``; -1 when none does (the ``[`` is then a
    literal character). A ``]`` right after ``[`` or ``[!`` belongs to the class."""
    index = start + 1
    if index < len(segment) and segment[index] == "!":
        index += 1
    if index < len(segment) and segment[index] == "]":
        index += 1
    return segment.find("]", index)


# --- errors -------------------------------------------------------------------------------------------------


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _status(exc: BaseException) -> int:
    response = getattr(exc, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _as_os_error(exc: BaseException) -> OSError | None:
    """:class:`FileNotFoundError` or :class:`PermissionError` for S3's answer ``exc``, whose text is S3's message
    (``Forbidden``, ``The AWS Access Key Id you provided does not exist in our records.``), as s3fs raised them, so
    the line a user reads (``access denied (Forbidden)``) stays what it was; None for any other answer, which is
    raised as it is."""
    code, status = _code(exc), _status(exc)
    response = getattr(exc, "response", None) or {}
    message = str(response.get("Error", {}).get("Message") or exc)
    if code in _MISSING_CODES or (status == 404 and code not in _DENIED_CODES):
        return FileNotFoundError(message)
    if code in _DENIED_CODES or status == 403:
        return PermissionError(message)
    return None
