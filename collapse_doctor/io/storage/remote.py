"""Object storage inputs: ``s3://``, ``gs://``, ``az://`` and ``hf://`` URLs read like local files.

A URL becomes a :class:`RemotePath`: a :class:`pathlib.PosixPath` whose parts are the URL's (``s3:``, the
bucket, the key's parts), so ``name``, ``suffix``, ``parent``, ``relative_to``, sorting and hashing are
pathlib's own, and every reader, the format registry and discovery take it where they take a local file.
What touches the data is overridden and goes through the URL's filesystem: ``open("rb")`` (ranged
reads: each read is one ranged GET, nothing is fetched ahead), ``read_bytes``, ``read_text``, ``stat`` (size,
modification time; the listing's when the path came from one, so no request), ``exists``, ``is_file`` and
``is_dir``. ``resolve()`` is the path itself. Anything else that would reach the local file system fails
loudly: ``os.fspath`` of a RemotePath is a TypeError, never a local path named ``s3:/...``.

A filesystem is made once per scheme and environment. S3 goes through botocore alone
(:class:`~collapse_doctor.io.storage.s3_client.BotocoreS3`, the ``s3`` extra: s3fs with aiobotocore and fsspec cost
over half a second of import in every process that reads a bucket); the other clouds through their fsspec
filesystems (gcsfs, adlfs, huggingface_hub: the ``gcs``, ``azure`` and ``hf`` extras; ``remote``: all four). Both
answer the same six calls (:class:`ObjectStore`). Endpoints and credentials come from the usual places:
botocore's chain for S3 (environment keys, ``AWS_PROFILE``, instance roles) with ``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL`` passed explicitly; Google's application default credentials (and ``STORAGE_EMULATOR_HOST``)
for GCS; the ``AZURE_STORAGE_*`` variables for Azure; ``HF_TOKEN`` / the cached login (and ``HF_ENDPOINT``) for the Hub.
Every failure (no credentials, no such bucket or object, access denied, unreachable endpoint, missing extra)
is one :class:`~collapse_doctor.core.errors.InputError` naming the URL, with a hint.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import stat as stat_module
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PosixPath
from typing import IO, Any, Literal, Protocol, TypeVar

from collapse_doctor.core.errors import InputError, OutputError

__all__ = [
    "REMOTE_SCHEMES",
    "RemoteListing",
    "RemotePath",
    "as_url",
    "expand_url",
    "file_signature",
    "input_path",
    "is_url",
    "looks_remote",
    "parquet_source",
    "prefetch",
    "snapshot_url",
]

REMOTE_SCHEMES: dict[str, str] = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "hf": "hf",
}
"""URL schemes read, each with its storage family."""
WHOLE_OBJECT_BYTES = 4 * 2**20
"""Objects up to this size are read whole, in one request: a small Parquet file in ranged reads costs a request for
its magic bytes, its footer length, its footer and each column chunk (nine for TRL's per-step completions files),
each a round trip of tens of milliseconds on S3, about what 4 MiB take at one connection's throughput. Larger
objects are read in ranges, so columns no reader needs are never fetched."""
PREFETCH_THREADS = 16
"""Concurrent GETs of :func:`prefetch` (requests to object storage are latency-bound; a synchronous filesystem such
as the Hub's gets its concurrency from the threads, an asynchronous one gathers them on its loop)."""

_PACKAGE = {"s3": "botocore", "gcs": "gcsfs", "azure": "adlfs", "hf": "huggingface_hub"}
_ROOT = {"s3": "bucket", "gcs": "bucket", "azure": "container", "hf": "repository"}
_ENV_PREFIXES = {
    "s3": ("AWS_",),
    "gcs": ("GOOGLE_", "GCLOUD", "CLOUDSDK_", "STORAGE_EMULATOR_HOST"),
    "azure": ("AZURE_",),
    "hf": ("HF_", "HUGGING_FACE_"),
}
_CREDENTIALS_HINT = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance role is "
    "available; AWS_ENDPOINT_URL selects an S3-compatible server",
    "gcs": "set GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login`",
    "azure": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or "
    "AZURE_STORAGE_SAS_TOKEN (or log in for DefaultAzureCredential)",
    "hf": "set HF_TOKEN, or run `hf auth login` (private and gated repositories need a token)",
}
_ENDPOINT_HINT = {
    "s3": "check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) and the network",
    "gcs": "check the network (and STORAGE_EMULATOR_HOST, if set)",
    "azure": "check the account name and the network",
    "hf": "check the network (and HF_ENDPOINT, if set)",
}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
_COLLAPSED_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")
_HF_KINDS = ("datasets", "spaces", "models")
_NO_CREDENTIALS = (
    "NoCredentialsError",
    "PartialCredentialsError",
    "CredentialRetrievalError",
    "DefaultCredentialsError",
    "RefreshError",
    "ClientAuthenticationError",
    "CredentialUnavailableError",
    "LocalTokenNotFoundError",
)
_UNREACHABLE = (
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ClientConnectorError",
    "ServerTimeoutError",
    "ServiceRequestError",
    "FSTimeoutError",
)
_T = TypeVar("_T")


def is_url(text: str | Path) -> bool:
    """Whether ``text`` is a URL (``scheme://...``) rather than a local path (any scheme: unknown ones are refused
    by :func:`input_path` with a message, not looked up as local files).

    >>> is_url("s3://bucket/run/"), is_url("hf://datasets/org/name"), is_url("runs/a.parquet"), is_url("C:/x")
    (True, True, False, False)
    """
    return isinstance(text, RemotePath) or bool(_URL.match(str(text)))


def looks_remote(path: str | Path) -> bool:
    """Whether an output path names object storage: a URL, or one that ``pathlib.Path`` collapsed
    (``Path("s3://b/k")`` is ``s3:/b/k``); outputs are local files only.

    >>> looks_remote(Path("s3://bucket/scan.json")), looks_remote("gs://b/k"), looks_remote(Path("out/scan.json"))
    (True, True, False)
    """
    text = str(path)
    found = _URL.match(text) or _COLLAPSED_URL.match(text)
    return isinstance(path, RemotePath) or (found is not None and found.group(1).lower() in REMOTE_SCHEMES)


def as_url(path: str | Path) -> str:
    """The URL an output path was given as (``s3:/b/k``, as ``pathlib`` collapses it, back to ``s3://b/k``)."""
    text = str(path)
    return _COLLAPSED_URL.sub(lambda m: f"{m.group(1)}://", text, count=1)


def input_path(text: str | Path) -> Path:
    """A local :class:`~pathlib.Path`, or a :class:`RemotePath` for an object storage URL (an InputError for a
    URL of another scheme)."""
    if isinstance(text, Path) and not isinstance(text, RemotePath):
        return text
    return RemotePath.from_url(str(text)) if is_url(text) else Path(text)


class RemotePath(PosixPath):
    """An object or prefix in object storage, used by the readers as a :class:`pathlib.Path` (module docstring).

    Build one with :meth:`from_url`; paths derived from it (``parent``, ``/``, ``with_name``) are RemotePaths
    of the same filesystem. ``parent`` stops at the bucket (container, Hub repository), as ``/`` is its own
    parent locally.
    """

    _remote_info: dict[str, Any] | None = None
    """What the listing that found this object said about it (size, modification time, ETag)."""

    @classmethod
    def from_url(cls, url: str) -> RemotePath:
        """The path of ``url``; an InputError for an unknown scheme or a URL without a bucket."""
        found = _URL.match(url)
        scheme = found.group(1).lower() if found else ""
        if scheme not in REMOTE_SCHEMES:
            raise InputError(
                f"{url}: unsupported URL scheme {scheme!r}",
                hint="collapse-doctor reads local paths and s3://, gs://, az:// and hf:// URLs",
            )
        path = cls(f"{scheme}://{url[found.end() :] if found else ''}")
        if len(path.parts) < 1 + path._root_depth:
            what = _ROOT[path.family]
            raise InputError(f"{url}: no {what} in this URL", hint=f"write it as {scheme}://{what}/path")
        return path

    # --- what the URL is -------------------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        """``s3``, ``gs``, ``az``, ``hf``, ... as written."""
        return self.parts[0][:-1]

    @property
    def family(self) -> str:
        """The storage family: ``s3``, ``gcs``, ``azure`` or ``hf``."""
        return REMOTE_SCHEMES[self.scheme]

    @property
    def key(self) -> str:
        """The path the filesystem knows the object by: ``bucket/key`` (``datasets/org/name/file``)."""
        return "/".join(self.parts[1:])

    @property
    def bucket(self) -> RemotePath:
        """The bucket (container, Hub repository) the object is in (``root`` is pathlib's: empty here)."""
        return type(self)(f"{self.scheme}://" + "/".join(self.parts[1 : 1 + self._root_depth]))

    @property
    def _root_depth(self) -> int:
        if self.parts[0] == "hf:" and len(self.parts) > 1 and self.parts[1] in _HF_KINDS:
            return 3  # hf://datasets/<org>/<name>
        return 2 if self.parts[0] == "hf:" else 1  # hf://<org>/<model>, s3://<bucket>

    def _is_url(self) -> bool:
        return bool(self.parts) and self.parts[0].endswith(":") and self.parts[0][:-1] in REMOTE_SCHEMES

    def __str__(self) -> str:
        parts = self.parts
        if self._is_url():
            return f"{parts[0]}//" + "/".join(parts[1:])
        return "/".join(parts) or "."  # a relative path (relative_to between two URLs)

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __fspath__(self) -> str:
        raise TypeError(f"{self} is in object storage and has no local file system path")

    def as_posix(self) -> str:
        return str(self)

    def as_uri(self) -> str:
        return str(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and self.parts == other.parts

    def __hash__(self) -> int:
        return hash(("remote", self.parts))

    @property
    def parent(self) -> RemotePath:
        if self._is_url() and len(self.parts) <= 1 + self._root_depth:
            return self
        return super().parent

    @property
    def parents(self) -> Sequence[RemotePath]:
        out: list[RemotePath] = []
        current = self
        while (above := current.parent) != current:
            out.append(above)
            current = above
        return tuple(out)

    # --- reading ----------------------------------------------------------------------------------------------

    @property
    def filesystem(self) -> ObjectStore:
        """The filesystem of this URL's scheme (made once per scheme and environment)."""
        return filesystem(self)

    def _query(self, action: Callable[[], _T]) -> _T:
        try:
            return action()
        except InputError:
            raise
        except Exception as exc:
            raise remote_error(self, exc) from exc

    def info(self) -> dict[str, Any]:
        """What the storage says about the object or prefix (an InputError when it is missing or unreadable).

        Below a prefix this process listed (:func:`expand_url`), the listing answers without a request: an object
        it holds, a prefix above some of them, or nothing (missing)."""
        if self._remote_info is None:
            listed = _LISTINGS.lookup(self)
            if listed is _ABSENT:
                raise InputError(
                    f"{self}: no such object or prefix (not in the listing of {_LISTINGS.covering(self)})",
                    hint=f"check the key; list {self.parent}/ to see what is there",
                ) from FileNotFoundError(self.key)
            if isinstance(listed, dict):
                self._remote_info = listed
            else:
                self._remote_info = self._query(lambda: dict(self.filesystem.info(self.key)))
        return self._remote_info

    @property
    def listed(self) -> bool:
        """Whether a listing this process made covers this key (then :meth:`info` needs no request)."""
        return _LISTINGS.covering(self) is not None

    def _lookup(self) -> dict[str, Any] | None:
        """:meth:`info`, or ``None`` where pathlib's ``exists()`` says False (missing, or not ours to see)."""
        try:
            return self.info()
        except InputError as exc:
            if isinstance(exc.__cause__, (FileNotFoundError, PermissionError)):
                return None
            raise

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        info = self.info()
        mode = (stat_module.S_IFDIR | 0o555) if info.get("type") == "directory" else (stat_module.S_IFREG | 0o444)
        mtime = _mtime(info)
        whole = int(mtime)
        return os.stat_result(
            (mode, 0, 0, 1, 0, 0, int(info.get("size") or 0), whole, whole, whole),
            {"st_atime": mtime, "st_mtime": mtime, "st_ctime": mtime, "st_mtime_ns": int(mtime * 1e9)},
        )

    def lstat(self) -> os.stat_result:
        return self.stat()

    def exists(self, *, follow_symlinks: bool = True) -> bool:
        return self._lookup() is not None

    def is_file(self) -> bool:
        info = self._lookup()
        return info is not None and info.get("type") == "file"

    def is_dir(self) -> bool:
        info = self._lookup()
        return info is not None and info.get("type") == "directory"

    def is_symlink(self) -> bool:
        return False

    def resolve(self, strict: bool = False) -> RemotePath:
        return self

    def absolute(self) -> RemotePath:
        return self

    def expanduser(self) -> RemotePath:
        return self

    def samefile(self, other_path: str | os.PathLike[str]) -> bool:
        return isinstance(other_path, RemotePath) and self == other_path

    def open(  # type: ignore[override]
        self,
        mode: str = "r",
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
    ) -> IO[Any]:
        """Open for reading. Every read is one ranged request (``cache_type="none"``): pyarrow asks for the
        footer and then one column chunk at a time, so a Parquet object is never downloaded whole."""
        if set(mode) & set("wax+"):
            raise OutputError(f"{self}: writing to object storage is not supported", hint="write to a local file")
        text = {k: v for k, v in (("encoding", encoding), ("errors", errors), ("newline", newline)) if v is not None}
        handle: IO[Any] = self._query(lambda: self.filesystem.open(self.key, mode, cache_type="none", **text))
        return handle

    def read_bytes(self) -> bytes:
        """The whole object in one GET (with its size known, from the listing or :meth:`info`, the read names the
        range: the filesystem then sends no HEAD first)."""
        return self.read_from(0)

    def read_from(self, start: int) -> bytes:
        """The object's bytes from offset ``start`` to its end, in one GET."""
        size = int(self.info().get("size") or 0)
        if start >= size:
            return b""
        return self._query(lambda: bytes(self.filesystem.cat_file(self.key, start=start, end=size)))

    @property
    def small(self) -> bool:
        """Whether the object is read whole (at most :data:`WHOLE_OBJECT_BYTES`): one request instead of the
        ranged reads of a footer and its column chunks."""
        return int(self.info().get("size") or 0) <= WHOLE_OBJECT_BYTES

    def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
        return self.read_bytes().decode(encoding or "utf-8", errors or "strict")

    def signature(self) -> tuple[int, int, str]:
        """``(size, modification time in ns, version)``: what ``watch`` judges a change by (the version is the
        ETag or generation, so a rewrite within the same second is seen)."""
        info = self.info()
        return int(info.get("size") or 0), int(_mtime(info) * 1e9), _version(info)

    def with_info(self, info: dict[str, Any]) -> RemotePath:
        """This path, knowing what a listing said about it (no request for its size or type later)."""
        self._remote_info = info
        return self


def _mtime(info: dict[str, Any]) -> float:
    for key in ("LastModified", "last_modified", "updated", "mtime", "timeCreated", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    last_commit = info.get("last_commit")
    date = getattr(last_commit, "date", None)
    return date.timestamp() if isinstance(date, datetime) else 0.0


def _version(info: dict[str, Any]) -> str:
    for key in ("ETag", "etag", "generation", "md5Hash", "blob_id", "VersionId"):
        value = info.get(key)
        if value:
            return str(value)
    lfs = info.get("lfs")
    return str(lfs.get("sha256", "")) if isinstance(lfs, dict) else ""


# --- filesystems --------------------------------------------------------------------------------------------

_LIBRARY_LOGGERS = ("fsspec", "s3fs", "gcsfs", "adlfs", "azure", "huggingface_hub", "aiobotocore", "botocore")


class ObjectStore(Protocol):
    """What :class:`RemotePath` asks of a scheme's filesystem: six calls of fsspec's filesystem API, with its
    meanings (names ``bucket/key``; ``info``'s ``type`` is ``file`` or ``directory``; ``cat_file``'s ``end`` is
    exclusive; ``open(..., cache_type="none")`` reads each range when asked). An fsspec filesystem is one;
    :class:`~collapse_doctor.io.storage.s3_client.BotocoreS3` is S3's."""

    def info(self, path: str) -> dict[str, Any]: ...

    def exists(self, path: str) -> bool: ...

    def find(self, path: str, *, detail: Literal[True]) -> dict[str, dict[str, Any]]: ...

    def glob(self, path: str, *, detail: Literal[True]) -> dict[str, dict[str, Any]]: ...

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes: ...

    def open(self, path: str, mode: str = "rb", cache_type: str = "none", **text: Any) -> IO[Any]: ...


_FILESYSTEMS: dict[tuple[str, tuple[tuple[str, str], ...]], ObjectStore] = {}


def _storage_options(family: str) -> dict[str, Any]:
    """The fsspec filesystem options of a family other than S3."""
    # Listings are never cached: watch lists the same prefix again and again and must see what changed.
    if family in ("gcs", "azure"):
        return {"use_listings_cache": False}
    return {}


def _make_filesystem(path: RemotePath) -> ObjectStore:
    """A new filesystem for ``path``'s scheme: botocore's client for S3, fsspec's filesystem for the others (an
    ImportError when the extra's package is missing)."""
    if path.family == "s3":
        from collapse_doctor.io.storage.s3_client import BotocoreS3

        # botocore reads these itself in recent versions, but not every version does.
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return BotocoreS3(endpoint_url=endpoint or None, max_pool_connections=PREFETCH_THREADS)
    import fsspec

    made: ObjectStore = fsspec.filesystem(path.scheme, skip_instance_cache=True, **_storage_options(path.family))
    return made


def filesystem(path: RemotePath) -> ObjectStore:
    """The filesystem for ``path``'s scheme, made once per scheme and set of the family's environment variables (a
    changed ``AWS_PROFILE`` or endpoint gets a new one)."""
    family = path.family
    prefixes = _ENV_PREFIXES[family]
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(prefixes)))
    key = (path.scheme, env)
    found = _FILESYSTEMS.get(key)
    if found is not None:
        return found
    package = _PACKAGE[family]
    for name in _LIBRARY_LOGGERS:
        # Retries are logged as warnings with tracebacks; without a handler of their own Python prints them on
        # stderr (logging.lastResort). The error that ends the read is the one line the user gets.
        library = logging.getLogger(name)
        if not library.handlers:
            library.addHandler(logging.NullHandler())
    try:
        made = _make_filesystem(path)
    except ImportError as exc:
        raise InputError(
            f"{path}: reading {path.scheme}:// URLs needs the {package} package (not installed)",
            hint=f"pip install 'collapse-doctor[{family}]' ('collapse-doctor[remote]': every cloud)",
        ) from exc
    except Exception as exc:
        raise remote_error(path, exc) from exc
    _FILESYSTEMS[key] = made
    return made


def remote_error(path: RemotePath, exc: BaseException) -> InputError:
    """One line naming the URL for what the storage raised: missing bucket or object, access denied, no
    credentials, unreachable endpoint, or anything else (its first line)."""
    family = path.family
    detail = " ".join(str(exc).split())[:240] or type(exc).__name__
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, FileNotFoundError):
        root = path.bucket
        what = _ROOT[family]
        if root != path and not _exists(root):
            return InputError(
                f"{path}: no such {what} {root}", hint=f"check the {what} name (and the account/endpoint)"
            )
        return InputError(
            f"{path}: no such object or prefix", hint=f"check the key; list {path.parent}/ to see what is there"
        )
    if names & set(_NO_CREDENTIALS) or ("credential" in detail.lower() and not isinstance(exc, PermissionError)):
        return InputError(f"{path}: no credentials to read it ({detail})", hint=_CREDENTIALS_HINT[family])
    if isinstance(exc, PermissionError):
        return InputError(
            f"{path}: access denied ({detail})",
            hint="check that these credentials may list and read it; " + _CREDENTIALS_HINT[family],
        )
    if names & set(_UNREACHABLE) or isinstance(exc, (ConnectionError, TimeoutError)):
        return InputError(f"{path}: cannot reach the storage endpoint ({detail})", hint=_ENDPOINT_HINT[family])
    return InputError(f"{path}: cannot read ({type(exc).__name__}: {detail})", hint=_ENDPOINT_HINT[family])


def _exists(root: RemotePath) -> bool:
    try:
        return bool(root.filesystem.exists(root.key))
    except Exception:  # a bucket we may not list: say "no such object", not a second error
        return True


# --- listing ------------------------------------------------------------------------------------------------


_ABSENT = object()


class _Listings:
    """The prefixes listed in this process, each with the objects below it and the prefixes between them: what
    :meth:`RemotePath.info` answers from. A new listing of a prefix replaces the old one (``watch`` lists before
    every scan), so what it says is as fresh as the scan's own view of the run."""

    def __init__(self) -> None:
        self._by_prefix: dict[tuple[str, str], tuple[dict[str, dict[str, Any]], set[str]]] = {}

    def record(self, scheme: str, prefix: str, objects: dict[str, dict[str, Any]]) -> None:
        prefix = prefix.rstrip("/")
        directories = {prefix}
        for name in objects:
            parts = name.split("/")
            for end in range(len(prefix.split("/")), len(parts)):
                directories.add("/".join(parts[:end]))
        self._by_prefix[(scheme, prefix)] = (dict(objects), directories)

    def _listing_of(self, path: RemotePath) -> tuple[str, dict[str, dict[str, Any]], set[str]] | None:
        """The listed prefix that covers ``path``, with its objects and prefixes; None when none does."""
        key = path.key
        for (scheme, prefix), (objects, directories) in self._by_prefix.items():
            if scheme == path.scheme and (key == prefix or key.startswith(prefix + "/")):
                return prefix, objects, directories
        return None

    def covering(self, path: RemotePath) -> str | None:
        """The listed prefix (as a URL) whose listing covers ``path``, if any."""
        found = self._listing_of(path)
        return None if found is None else f"{path.scheme}://{found[0]}"

    def lookup(self, path: RemotePath) -> dict[str, Any] | object | None:
        """The listing's info of ``path``, :data:`_ABSENT` when a listing covers it and has nothing there, None when
        no listing covers it."""
        found = self._listing_of(path)
        if found is None:
            return None
        _, objects, directories = found
        if path.key in objects:
            return dict(objects[path.key])
        if path.key in directories:
            return {"name": path.key, "type": "directory", "size": 0}
        return _ABSENT


_LISTINGS = _Listings()


@dataclass(frozen=True)
class RemoteListing:
    """What a URL names: one object, a prefix (a directory: the objects below it) or a glob's matches."""

    files: list[RemotePath]
    directory: RemotePath | None = None
    """The prefix, when the URL named one."""
    pattern: bool = False


def _files(fs_listing: dict[str, dict[str, Any]], scheme: str) -> list[RemotePath]:
    out = [
        RemotePath(f"{scheme}://{name}").with_info(dict(info))
        for name, info in fs_listing.items()
        if info.get("type", "file") == "file"
    ]
    return sorted(out)


def expand_url(url: str | Path) -> RemoteListing:
    """List what ``url`` names (InputErrors name the URL): a glob's matching objects (``**`` is recursive), a
    prefix's objects (recursively; ``s3://bucket/run`` and ``s3://bucket/run/`` are the same prefix), or one
    object. A RemotePath that came from a listing is kept as it is (no request)."""
    path = url if isinstance(url, RemotePath) else RemotePath.from_url(str(url))
    if path._remote_info is not None and path._remote_info.get("type") == "file":
        return RemoteListing(files=[path])
    fs = path.filesystem
    if glob.has_magic(path.key):
        matched = path._query(lambda: fs.glob(path.key, detail=True))
        files = _files(matched, path.scheme)
        if not files:
            raise InputError(f"{path}: pattern matches no object")
        return RemoteListing(files=files, pattern=True)
    info = path.info()
    if info.get("type") != "directory":
        return RemoteListing(files=[path])
    found = path._query(lambda: fs.find(path.key, detail=True))
    _LISTINGS.record(path.scheme, path.key, {name: dict(i) for name, i in found.items() if i.get("type") == "file"})
    return RemoteListing(files=_files(found, path.scheme), directory=path)


def snapshot_url(url: str) -> dict[str, tuple[int, int, str]]:
    """``{object URL: (size, mtime ns, version)}`` of what ``url`` names, from one listing (a LIST request per
    1000 objects; no request per object). When listing fails the URL maps to ``(-1, -1, error)``, so a change
    of the error is a change, and the scan that follows reports it."""
    try:
        return {str(p): p.signature() for p in expand_url(url).files}
    except InputError as exc:
        return {url: (-1, -1, exc.one_line())}


def file_signature(path: Path) -> tuple[int, int, str]:
    """``(size, mtime ns, version)`` of a local file (version ``""``) or an object; ``(-1, -1, "")`` when a
    local file cannot be read."""
    if isinstance(path, RemotePath):
        return path.signature()
    try:
        stat = path.stat()
    except OSError:
        return (-1, -1, "")
    return stat.st_size, stat.st_mtime_ns, ""


def parquet_source(path: Path, data: bytes | None = None) -> Any:
    """What pyarrow opens a Parquet file from: a local path as it is; a small object (or ``data``, its bytes
    fetched already) as a buffer, read in one request; a large one as a ranged handle (pyarrow then reads the
    footer and the column chunks it needs, each one ranged request)."""
    import pyarrow as pa

    if data is not None:
        return pa.BufferReader(data)
    if not isinstance(path, RemotePath):
        return path
    return pa.BufferReader(path.read_bytes()) if path.small else path.open("rb")


@contextlib.contextmanager
def prefetch(paths: Sequence[Path]) -> Iterator[Callable[[Path], bytes | None]]:
    """Fetch the small objects among ``paths`` concurrently, one GET each, while the reader parses them in its own
    order: yields ``fetched(path)``, the object's bytes once they arrived (None for a local file, a large object,
    or one whose fetch failed: the reader then reads it itself and reports what fails). What a reader of many small
    objects (TRL's one file per step) uses, so parsing overlaps the requests still in flight."""
    small = [p for p in paths if isinstance(p, RemotePath) and p.small]
    if len(small) < 2:
        yield lambda path: None
        return
    from concurrent.futures import ThreadPoolExecutor

    def fetch(path: RemotePath) -> bytes | None:
        try:
            return path.read_bytes()
        except InputError:
            return None

    with ThreadPoolExecutor(min(PREFETCH_THREADS, len(small)), thread_name_prefix="collapse-doctor-fetch") as pool:
        pending: dict[Path, Any] = {p: pool.submit(fetch, p) for p in small}

        def fetched(path: Path) -> bytes | None:
            future = pending.pop(path, None)
            return None if future is None else future.result()

        try:
            yield fetched
        finally:
            for future in pending.values():
                future.cancel()
