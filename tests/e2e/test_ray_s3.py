"""``--ray`` on a run in object storage: every shard task opens the objects itself (ranged reads,
the endpoint and credentials from the environment the tasks inherit), and the results are the local scan's of the
same URL. A real S3-protocol server on 127.0.0.1 (moto), started before the local Ray instance so that its
workers see ``AWS_ENDPOINT_URL``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.engine import reduce
from tests.helpers.ray_runs import multi_file_run, start_local_ray
from tests.helpers.s3 import S3Server, s3_server  # noqa: F401  (the session fixture)

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'collapse-doctor[ray]')")
pytest.importorskip("moto", reason="the remote extra's test server (moto) is not installed")
pytestmark = pytest.mark.xdist_group("ray")
runner = CliRunner()


@pytest.fixture(scope="module")
def bucket_run(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:  # noqa: F811
    local = multi_file_run(tmp_path_factory.mktemp("ray-s3"))
    url = s3_server.upload(local, s3_server.bucket("ray-runs") + "/parts")
    start_local_ray()
    try:
        yield url
    finally:
        ray.shutdown()


def _scan(url: str, *extra: str) -> dict[str, Any]:
    result = runner.invoke(app, ["scan", url, "--format", "json", *extra])
    assert result.exit_code in (0, 1), result.output
    document = json.loads(result.stdout)
    document.pop("seconds", None)
    return document


def test_shards_read_from_object_storage_give_the_local_result(
    bucket_run: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(reduce, "MIN_SHARD_ROWS", 1500)  # several shards of this small run
    local = _scan(bucket_run)
    on_ray = _scan(bucket_run, "--ray=local")
    assert local["findings"]
    assert on_ray == local  # exactly: the shards' tasks read their steps from the objects themselves
    assert on_ray["run"]["sources"] == local["run"]["sources"] and on_ray["run"]["sources"][0].startswith("s3://")
