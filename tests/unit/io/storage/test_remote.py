"""RemotePath (object storage URLs as paths) and its reads against moto's S3 server on 127.0.0.1."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collapse_doctor.core.errors import InputError, OutputError
from collapse_doctor.io.rollouts.parquet import ParquetRun
from collapse_doctor.io.storage import remote
from collapse_doctor.io.storage.paths import common_directory
from collapse_doctor.io.storage.remote import RemotePath, expand_url, file_signature, input_path, looks_remote
from tests.helpers.s3 import S3Server, s3_server  # noqa: F401  (the session fixture)

BUCKET = "cd-unit"


def test_a_url_is_a_path_with_the_urls_parts() -> None:
    path = RemotePath.from_url("s3://bucket/run/completions/completions_00001.parquet")
    assert str(path) == "s3://bucket/run/completions/completions_00001.parquet"
    assert (path.name, path.suffix, path.stem) == ("completions_00001.parquet", ".parquet", "completions_00001")
    assert path.parent.parent == RemotePath.from_url("s3://bucket/run") and path.parent.parent.name == "run"
    assert [str(p) for p in path.parents] == ["s3://bucket/run/completions", "s3://bucket/run", "s3://bucket"]
    assert path.bucket.parent == path.bucket  # the bucket is its own parent, as "/" is
    assert str(path.relative_to(RemotePath.from_url("s3://bucket"))) == "run/completions/completions_00001.parquet"
    assert isinstance(path.parent / "x.json", RemotePath) and str(path.with_name("a.txt")).endswith("completions/a.txt")
    assert path.key == "bucket/run/completions/completions_00001.parquet"
    assert pickle.loads(pickle.dumps(path)) == path and path.resolve() is path
    hub = RemotePath.from_url("hf://datasets/org/name/data/train.parquet")
    assert str(hub.bucket) == "hf://datasets/org/name" and hub.parents[-1] == hub.bucket


def test_a_url_never_equals_or_becomes_a_local_path() -> None:
    path = RemotePath.from_url("s3://bucket/a.parquet")
    local = Path("s3://bucket/a.parquet")  # pathlib collapses it to s3:/bucket/a.parquet
    assert path != local and local != path and len({path, local}) == 2
    with pytest.raises(TypeError, match="object storage"):
        os.fspath(path)
    assert looks_remote(local) and not looks_remote(Path("out/s3.json"))
    assert remote.as_url(local) == "s3://bucket/a.parquet"
    assert input_path("runs/a.parquet") == Path("runs/a.parquet") and isinstance(input_path(str(path)), RemotePath)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://host/run.parquet", "http://host/run.parquet: unsupported URL scheme 'http'"),
        ("s3://", "s3://: no bucket in this URL"),
        ("hf://datasets/org", "hf://datasets/org: no repository in this URL"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        RemotePath.from_url(url)
    assert caught.value.message == message


def test_common_directory_of_objects() -> None:
    files = [RemotePath.from_url(f"s3://b/run/{p}") for p in ("rollouts/a.parquet", "rollouts/sub/b.parquet")]
    assert common_directory(files) == RemotePath.from_url("s3://b/run/rollouts")
    other = [files[0], RemotePath.from_url("s3://c/run/x.parquet")]
    assert common_directory(other) == files[0].parent  # two buckets: nothing in common but the scheme


def test_azure_without_an_account_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("AZURE_")]:
        monkeypatch.delenv(name)
    with pytest.raises(InputError) as caught:
        expand_url("az://container/run/")
    line = caught.value.one_line()
    assert line.startswith("az://container/run: ") and "AZURE_STORAGE_CONNECTION_STRING" in line


@pytest.fixture(scope="module")
def bucket(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    """A Parquet object of 8 row groups with a large column no reader needs, and a small JSONL object."""
    rng = np.random.default_rng(0)
    steps, per_step = 64, 256
    n = steps * per_step
    table = pa.table(
        {
            "step": np.repeat(np.arange(steps), per_step),
            "group_id": np.tile(np.repeat(np.arange(per_step // 8), 8), steps),
            "reward/a": rng.random(n).astype(np.float32),
            "reward/b": (rng.random(n) < 0.5).astype(np.float32),
            "notes": [rng.bytes(200).hex() for _ in range(n)],  # incompressible: most of the object
        }
    )
    local = tmp_path_factory.mktemp("objects") / "run.parquet"
    pq.write_table(table, local, row_group_size=n // 8)
    s3_server.bucket(BUCKET)
    s3_server.upload(local, f"s3://{BUCKET}/big")
    s3_server.client.put_object(Bucket=BUCKET, Key="logs/a.jsonl", Body=b'{"x": 1}\n{"x": 2}\n')
    return {"local": local, "url": f"s3://{BUCKET}/big/run.parquet", "size": local.stat().st_size}


def test_parquet_is_read_in_ranges_of_the_columns_needed(
    bucket: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from collapse_doctor.io.storage.s3_client import BotocoreS3

    requests: list[int] = []
    fetch = BotocoreS3._get  # every GET, whole or ranged

    def counting(self: Any, bucket: str, key: str, byte_range: str | None) -> bytes:
        data: bytes = fetch(self, bucket, key, byte_range)
        requests.append(len(data))
        return data

    monkeypatch.setattr(BotocoreS3, "_get", counting)
    run = ParquetRun([bucket["url"]], check_rewards_first=True)
    chunks = list(run.iter_chunks(4096))
    expected = list(ParquetRun([bucket["local"]], check_rewards_first=True).iter_chunks(4096))
    assert len(chunks) == len(expected)
    for got, want in zip(chunks, expected, strict=True):
        np.testing.assert_array_equal(got.rewards, want.rewards)
        np.testing.assert_array_equal(got.group_index, want.group_index)
    size = bucket["size"]
    # Both passes read only step, group_id and the rewards: about 3% of the object, never the notes column,
    # and no request larger than one column chunk of one row group.
    assert sum(requests) < 0.1 * size, (sum(requests), size)
    assert max(requests) < size / 40, (max(requests), size)
    assert len(requests) > 8  # the footer, then column chunks per row group: no whole-object download


def test_listing_gives_sizes_without_a_request_per_object(
    bucket: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    listing = expand_url(f"s3://{BUCKET}/")
    assert listing.directory == RemotePath.from_url(f"s3://{BUCKET}")
    by_name = {p.name: p for p in listing.files}
    assert set(by_name) == {"run.parquet", "a.jsonl"}
    fs = by_name["a.jsonl"].filesystem

    def no_request(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the listing said it already")

    monkeypatch.setattr(fs, "info", no_request)
    assert by_name["run.parquet"].stat().st_size == bucket["size"]
    assert by_name["a.jsonl"].is_file() and not by_name["a.jsonl"].is_dir()
    size, mtime_ns, etag = file_signature(by_name["a.jsonl"])
    assert size == 18 and mtime_ns > 0 and etag


def test_reads_of_objects(bucket: dict[str, Any]) -> None:
    from collapse_doctor.io.logs.tensorboard import read_from
    from collapse_doctor.io.rollouts.jsonl import read_jsonl

    path = RemotePath.from_url(f"s3://{BUCKET}/logs/a.jsonl")
    assert read_jsonl(path) == [{"x": 1}, {"x": 2}]
    assert read_from(path, 9) == b'{"x": 2}\n'  # what an incremental reader has not seen yet
    with path.open("r", encoding="utf-8") as handle:
        assert handle.readline() == '{"x": 1}\n'
    assert path.exists() and path.parent.is_dir() and not path.with_name("b.jsonl").exists()
    with pytest.raises(InputError, match=f"s3://{BUCKET}/logs/b.jsonl: no such object or prefix"):
        path.with_name("b.jsonl").read_bytes()
    with pytest.raises(OutputError, match="writing to object storage is not supported"):
        path.open("wb")


def test_a_listing_that_fails_is_a_change_watch_reports(bucket: dict[str, Any]) -> None:
    url = "s3://cd-no-such-bucket/run/"
    [(key, (size, mtime, error))] = remote.snapshot_url(url).items()
    assert (key, size, mtime) == (url, -1, -1)
    assert error.startswith("s3://cd-no-such-bucket/run: no such bucket s3://cd-no-such-bucket")


def test_a_listing_answers_for_what_is_below_its_prefix() -> None:
    """After one listing of s3://b/run, what is below it is known without a request: an object (its size), a prefix
    above objects, or nothing there; keys outside the prefix are not covered (asked of the storage)."""
    listings = remote._Listings()
    listings.record(
        "s3", "b/run/", {"b/run/completions/c_1.parquet": {"name": "b/run/completions/c_1.parquet", "size": 7}}
    )
    at = RemotePath.from_url
    assert listings.lookup(at("s3://b/run/completions/c_1.parquet")) == {
        "name": "b/run/completions/c_1.parquet",
        "size": 7,
    }
    assert listings.lookup(at("s3://b/run/completions"))["type"] == "directory"  # type: ignore[index]
    assert listings.lookup(at("s3://b/run"))["type"] == "directory"  # type: ignore[index]
    assert listings.lookup(at("s3://b/run/collapse-doctor.toml")) is remote._ABSENT
    assert listings.lookup(at("s3://b/other.toml")) is None and listings.covering(at("s3://b/other.toml")) is None
    assert listings.lookup(at("gs://b/run/x")) is None, "another scheme is another storage"
