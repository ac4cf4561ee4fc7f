"""BotocoreS3 (S3 through botocore alone) against moto's S3 server on 127.0.0.1: what each call answers, with s3fs's
meanings, and how many requests it costs (counted at the client, from botocore's ``before-send`` event)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from collapse_doctor.io.storage import remote
from collapse_doctor.io.storage.remote import RemotePath
from collapse_doctor.io.storage.s3_client import BotocoreS3, RangedObject, glob_pattern
from tests.helpers.s3 import S3Server, s3_server  # noqa: F401  (the session fixture)
from tests.helpers.trl import trl_output_dir

BUCKET = "cd-client"
ROOT = Path(__file__).resolve().parents[4]
BLOB = bytes(range(256)) * 400  # 102,400 bytes, each offset's byte known
KEYS = (
    "run/top.parquet",
    "run/notes.txt",
    "run/completions/completions_00001.parquet",
    "run/completions/completions_00002.parquet",
    "run/completions/completions_00010.parquet",
    "run/sub/deep/x.parquet",
    "run2/z.parquet",
)
MANY = 1001
"""Objects below ``many/``: one more than a LIST page holds."""


@pytest.fixture(scope="module")
def bucket(s3_server: S3Server) -> str:  # noqa: F811
    s3_server.bucket(BUCKET)
    put = s3_server.client.put_object
    for key in KEYS:
        put(Bucket=BUCKET, Key=key, Body=key.encode())
    put(Bucket=BUCKET, Key="blob.bin", Body=BLOB)
    put(Bucket=BUCKET, Key="logs/a.jsonl", Body=b'{"x": 1}\n{"x": 2}\n')
    put(Bucket=BUCKET, Key="marked/", Body=b"")  # a folder marker, as the S3 console writes one
    put(Bucket=BUCKET, Key="marked/in.txt", Body=b"in")
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: put(Bucket=BUCKET, Key=f"many/k_{i:04d}", Body=b"%d" % i), range(MANY)))
    return BUCKET


class Requests:
    """The requests a client sends: ``(method, path and query, Range header or None)``."""

    def __init__(self, store: BotocoreS3) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        store._client.meta.events.register("before-send.s3", self._record)

    def _record(self, request: Any, **kwargs: Any) -> None:
        target = request.url.split("://", 1)[1].partition("/")[2]
        range_header = request.headers.get("Range")
        self.seen.append(
            (request.method, "/" + target, range_header.decode() if isinstance(range_header, bytes) else range_header)
        )

    def take(self) -> list[tuple[str, str, str | None]]:
        seen, self.seen = self.seen, []
        return seen

    def methods(self) -> list[str]:
        return [method for method, _, _ in self.take()]


@pytest.fixture
def store(bucket: str, s3_server: S3Server) -> BotocoreS3:  # noqa: F811
    return BotocoreS3(endpoint_url=s3_server.endpoint)


@pytest.fixture
def requests(store: BotocoreS3) -> Requests:
    return Requests(store)


# --- info and exists ------------------------------------------------------------------------------------------


def test_info_of_an_object_is_one_head(store: BotocoreS3, requests: Requests) -> None:
    info = store.info(f"{BUCKET}/run/top.parquet")
    assert info["name"] == f"{BUCKET}/run/top.parquet" and info["type"] == "file"
    assert info["size"] == len(b"run/top.parquet")
    assert isinstance(info["LastModified"], datetime) and info["LastModified"].tzinfo is not None
    assert info["ETag"].startswith('"')
    assert requests.methods() == ["HEAD"]


@pytest.mark.parametrize("path", [f"{BUCKET}/run", f"{BUCKET}/run/", f"{BUCKET}/run/sub", f"s3://{BUCKET}/run/sub/"])
def test_info_of_a_prefix_is_a_directory(store: BotocoreS3, requests: Requests, path: str) -> None:
    info = store.info(path)
    assert info["type"] == "directory" and info["size"] == 0
    assert info["name"] == path.removeprefix("s3://").rstrip("/")
    assert requests.methods() == ["HEAD", "GET"]  # no such object, then a LIST of at most one key


def test_info_of_a_bucket_and_of_nothing(store: BotocoreS3, requests: Requests) -> None:
    assert store.info(BUCKET) == {"name": BUCKET, "type": "directory", "size": 0, "StorageClass": "BUCKET"}
    assert requests.methods() == ["HEAD"]
    for missing in (f"{BUCKET}/run/missing.parquet", f"{BUCKET}/ru", "cd-no-such-bucket/run", "cd-no-such-bucket"):
        with pytest.raises(FileNotFoundError):
            store.info(missing)
        assert not store.exists(missing)
    assert store.exists(BUCKET) and store.exists(f"{BUCKET}/run") and store.exists(f"{BUCKET}/run/top.parquet")


# --- find and glob --------------------------------------------------------------------------------------------


def test_find_lists_every_object_below_a_prefix_one_list_per_1000(store: BotocoreS3, requests: Requests) -> None:
    found = store.find(f"{BUCKET}/many", detail=True)
    assert list(found) == [f"{BUCKET}/many/k_{i:04d}" for i in range(MANY)]
    assert found[f"{BUCKET}/many/k_0999"]["size"] == 3 and found[f"{BUCKET}/many/k_1000"]["size"] == 4
    assert all(info["type"] == "file" and info["ETag"] for info in found.values())
    listed = requests.take()
    assert [method for method, _, _ in listed] == ["GET", "GET"], listed  # 1001 keys: two pages
    assert all("list-type=2" in target for _, target, _ in listed)


def test_find_stops_at_the_prefix_boundary(store: BotocoreS3) -> None:
    found = store.find(f"{BUCKET}/run", detail=True)
    assert sorted(found) == sorted(f"{BUCKET}/{k}" for k in KEYS if k.startswith("run/"))  # not run2/
    assert store.find(f"{BUCKET}/run/top.parquet", detail=True) == {
        f"{BUCKET}/run/top.parquet": store.info(f"{BUCKET}/run/top.parquet")
    }
    assert store.find(f"{BUCKET}/nothing-here", detail=True) == {}
    # A folder marker is a prefix, never an object of its own (s3fs listed it as a file named `marked/`).
    assert list(store.find(f"{BUCKET}/marked", detail=True)) == [f"{BUCKET}/marked/in.txt"]
    assert store.info(f"{BUCKET}/marked")["type"] == "directory"
    with pytest.raises(FileNotFoundError):
        store.find("cd-no-such-bucket/run", detail=True)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("run/*.parquet", ["run/top.parquet"]),
        (
            "run/**/*.parquet",
            [
                "run/completions/completions_00001.parquet",
                "run/completions/completions_00002.parquet",
                "run/completions/completions_00010.parquet",
                "run/sub/deep/x.parquet",
                "run/top.parquet",
            ],
        ),
        ("**/x.parquet", ["run/sub/deep/x.parquet"]),
        (
            "run/completions/completions_0000?.parquet",
            ["run/completions/completions_00001.parquet", "run/completions/completions_00002.parquet"],
        ),
        ("run/completions/completions_0000[!1].parquet", ["run/completions/completions_00002.parquet"]),
        ("run/completions/completions_000[1-9]?.parquet", ["run/completions/completions_00010.parquet"]),
        ("run*/*.parquet", ["run/top.parquet", "run2/z.parquet"]),
        ("run/*", ["run/completions/", "run/notes.txt", "run/sub/", "run/top.parquet"]),
        ("run/*/", ["run/completions/", "run/sub/"]),
        ("run/s?b/**", ["run/sub/", "run/sub/deep/", "run/sub/deep/x.parquet"]),  # `/**`: the prefix too
        ("run/*.csv", []),
        ("run/notes.txt", ["run/notes.txt"]),
        ("run/missing.txt", []),
    ],
)
def test_glob_matches_as_fsspec_does(store: BotocoreS3, requests: Requests, pattern: str, expected: list[str]) -> None:
    """``*`` and ``?`` stay within a segment, ``**`` spans segments (none too), classes and negation; prefixes
    match as directories (shown here with a trailing ``/``), and a trailing ``/`` matches only them."""
    matched = store.glob(f"{BUCKET}/{pattern}", detail=True)
    shown = [
        name.removeprefix(f"{BUCKET}/") + ("/" if info["type"] == "directory" else "") for name, info in matched.items()
    ]
    assert shown == expected
    if any(c in pattern for c in "*?["):
        # One LIST below the literal start, then matched here (below none: the whole bucket, its 1000+ keys in two).
        assert requests.methods() == ["GET"] * (2 if pattern.startswith("*") else 1)


def test_glob_lists_below_the_literal_start_only(store: BotocoreS3, requests: Requests) -> None:
    store.glob(f"{BUCKET}/run/completions/completions_0000*.parquet", detail=True)
    [(_, target, _)] = requests.take()
    assert "prefix=run%2Fcompletions%2Fcompletions_0000" in target


def test_glob_refuses_what_fsspec_refuses(store: BotocoreS3) -> None:
    with pytest.raises(ValueError, match="'\\*\\*' can only be a whole path segment"):
        store.glob(f"{BUCKET}/run/a**b", detail=True)
    with pytest.raises(ValueError, match="cannot match bucket names"):
        store.glob("cd-*/run/*.parquet", detail=True)


@pytest.mark.parametrize(
    "pattern",
    [
        "run/*.parquet",
        "run/**/*.parquet",
        "**",
        "run/**",
        "a/**/b/*",
        "run/c?_[0-9][!a]*.p*",
        "x[]]y",
        "x[!]]y",
        "x[y",
        "*/*",
    ],
)
def test_glob_patterns_are_fsspecs(pattern: str) -> None:
    """The same regular expression meaning as fsspec's own translation, over keys that tell the cases apart."""
    utils = pytest.importorskip("fsspec.utils")
    keys = [
        "run/a.parquet", "run/sub/a.parquet", "run/cx_1b.parquet", "run/cx_1a.parquet", "run", "run/", "a/b/c",
        "a/x/y/b/c", "a/b/c/d", "x]y", "xay", "x[y", "x/y", "run/c/_1b.p", "/", "",
    ]  # fmt: skip
    ours, theirs = glob_pattern(pattern), fsspec_pattern(utils, pattern)
    assert [k for k in keys if ours.match(k)] == [k for k in keys if theirs.match(k)]


def fsspec_pattern(utils: Any, pattern: str) -> Any:
    import re

    return re.compile(utils.glob_translate(pattern))


# --- reading --------------------------------------------------------------------------------------------------


def test_open_reads_each_range_in_one_request(store: BotocoreS3, requests: Requests) -> None:
    with store.open(f"{BUCKET}/blob.bin", "rb", cache_type="none") as handle:
        assert requests.methods() == ["HEAD"]  # the size, once
        assert handle.seekable() and handle.readable() and handle.seek(0, os.SEEK_END) == len(BLOB)
        handle.seek(1000)
        assert handle.read(10) == BLOB[1000:1010] and handle.tell() == 1010
        handle.seek(-5, os.SEEK_END)
        assert handle.read() == BLOB[-5:] and handle.read(10) == b""  # at the end: no request
        handle.seek(100)
        buffer = bytearray(8)
        assert isinstance(handle, RangedObject)  # a raw binary file: nothing buffered ahead
        assert handle.readinto(buffer) == 8 and bytes(buffer) == BLOB[100:108]
        assert [r for _, _, r in requests.take()] == [
            "bytes=1000-1009",
            f"bytes={len(BLOB) - 5}-{len(BLOB) - 1}",
            "bytes=100-107",
        ]
    with pytest.raises(ValueError, match="closed"):
        handle.read(1)
    with store.open(f"{BUCKET}/blob.bin", "rb", size=len(BLOB)) as known:
        known.seek(len(BLOB) - 3)
        assert known.read(100) == BLOB[-3:]  # clamped to the size: the request asks for what is there
    assert [(m, r) for m, _, r in requests.take()] == [("GET", f"bytes={len(BLOB) - 3}-{len(BLOB) - 1}")]


def test_open_in_text_mode_and_what_cannot_be_opened(store: BotocoreS3) -> None:
    with store.open(f"{BUCKET}/logs/a.jsonl", "r", encoding="utf-8") as handle:
        assert handle.readline() == '{"x": 1}\n' and handle.read() == '{"x": 2}\n'
    with pytest.raises(FileNotFoundError):
        store.open(f"{BUCKET}/logs/b.jsonl", "rb")
    with pytest.raises(IsADirectoryError):
        store.open(f"{BUCKET}/logs", "rb")
    with pytest.raises(ValueError, match="reading only"):
        store.open(f"{BUCKET}/logs/a.jsonl", "wb")


def test_cat_file_ranges(store: BotocoreS3, requests: Requests) -> None:
    path = f"{BUCKET}/blob.bin"
    assert store.cat_file(path) == BLOB
    assert store.cat_file(path, start=10, end=20) == BLOB[10:20]
    assert store.cat_file(path, start=len(BLOB) - 4) == BLOB[-4:]
    assert store.cat_file(path, start=0, end=len(BLOB)) == BLOB
    assert [r for _, _, r in requests.take()] == [
        None,
        "bytes=10-19",
        f"bytes={len(BLOB) - 4}-",
        f"bytes=0-{len(BLOB) - 1}",
    ]
    assert store.cat_file(path, start=20, end=20) == b"" and requests.take() == []  # empty: no request
    assert store.cat_file(path, start=len(BLOB) + 10) == b""  # past the end, as a file read there
    assert (
        store.cat_file(path, start=-3) == BLOB[-3:] and store.cat_file(path, start=5, end=-len(BLOB) + 8) == BLOB[5:8]
    )
    with pytest.raises(FileNotFoundError):
        store.cat_file(f"{BUCKET}/missing.bin")
    with pytest.raises(FileNotFoundError):
        store.cat_file("cd-no-such-bucket/missing.bin", start=0, end=4)


def test_one_client_serves_concurrent_reads(store: BotocoreS3) -> None:
    names = [f"{BUCKET}/many/k_{i:04d}" for i in range(0, MANY, 7)]
    with ThreadPoolExecutor(remote.PREFETCH_THREADS) as pool:
        bodies = list(pool.map(lambda name: store.cat_file(name, start=0, end=8), names))
    assert bodies == [b"%d" % int(name.rsplit("_", 1)[1]) for name in names]


# --- errors ---------------------------------------------------------------------------------------------------


def test_bad_credentials_are_permission_errors(store: BotocoreS3, s3_server: S3Server) -> None:  # noqa: F811
    """S3's own message is the error's text, as s3fs had it: the user reads `access denied (Forbidden)`."""
    s3_server.require_signatures(True)  # the dummy key is not one the server knows
    try:
        errors = []
        for call in (
            lambda: store.info(f"{BUCKET}/run/top.parquet"),  # a HEAD: no body, S3's message is the status's
            lambda: store.find(f"{BUCKET}/run", detail=True),
            lambda: store.cat_file(f"{BUCKET}/run/top.parquet", start=0, end=4),
        ):
            with pytest.raises(PermissionError) as caught:
                call()
            errors.append(caught.value)
    finally:
        s3_server.require_signatures(False)
    assert str(errors[0]) == "Forbidden"
    assert str(errors[2]) == errors[2].__cause__.response["Error"]["Message"]  # type: ignore[union-attr]
    assert "Access Key Id" in str(errors[2])
    line = remote.remote_error(RemotePath.from_url(f"s3://{BUCKET}/run/top.parquet"), errors[0]).one_line()
    assert line.startswith(f"s3://{BUCKET}/run/top.parquet: access denied (Forbidden)")


def test_no_credentials_and_no_endpoint_pass_through(
    bucket: str,
    s3_server: S3Server,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = RemotePath.from_url(f"s3://{BUCKET}/run/top.parquet")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(Exception, match="Unable to locate credentials") as no_keys:
        BotocoreS3(endpoint_url=s3_server.endpoint).info(path.key)
    assert type(no_keys.value).__name__ == "NoCredentialsError"
    assert "no credentials to read it" in remote.remote_error(path, no_keys.value).one_line()
    monkeypatch.undo()

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(Exception, match=f"127.0.0.1:{port}") as unreachable:
        BotocoreS3(endpoint_url=f"http://127.0.0.1:{port}").cat_file(path.key)
    assert type(unreachable.value).__name__ == "EndpointConnectionError"
    assert "cannot reach the storage endpoint" in remote.remote_error(path, unreachable.value).one_line()


def test_region_from_the_environment(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS_REGION counts where AWS_DEFAULT_REGION and the config file name none (the bucket's server: its config
    file is none)."""
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert BotocoreS3()._client.meta.region_name == "eu-west-1"


# --- the command line -----------------------------------------------------------------------------------------

SCAN_IN_PROCESS = """
import json, sys
from collapse_doctor.cli.app import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("fsspec", "s3fs", "aiobotocore", "botocore"))
print("MODULES " + json.dumps(sorted({m.split(".")[0] for m in loaded})))
"""


@pytest.fixture
def trl_prefix(s3_server: S3Server, bucket: str, tmp_path: Path) -> str:  # noqa: F811
    return s3_server.upload(trl_output_dir(tmp_path / "trl"), f"s3://{BUCKET}/trl")


def test_a_scan_of_s3_never_imports_fsspec(trl_prefix: str, tmp_path: Path) -> None:
    """A fresh process that scans a bucket loads botocore and nothing of fsspec, s3fs or aiobotocore."""
    out = tmp_path / "scan.json"
    args = ["scan", trl_prefix, "--json", str(out), "--fail-on", "never", "--device", "cpu"]
    done = subprocess.run(
        [sys.executable, "-c", SCAN_IN_PROCESS, *args],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("MODULES ")]
    assert json.loads(line.removeprefix("MODULES ")) == ["botocore"], done.stderr
    assert json.loads(out.read_text(encoding="utf-8"))["run"]["rollouts"] > 0
