"""s3:// inputs end to end against a real S3-protocol server on 127.0.0.1 (moto's server mode).

The runs are written locally by the usual helpers, uploaded, and every command's result over the bucket is
compared with the same command over the local files (the paths aside).
"""

from __future__ import annotations

import html as htmllib
import json
import logging
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.core.options import ScanOptions
from collapse_doctor.io.storage import remote
from collapse_doctor.pipeline.watch import WatchState, watch
from tests.helpers.runs import binary_run
from tests.helpers.s3 import ENVIRONMENT, S3Server, s3_server  # noqa: F401  (the session fixture)
from tests.helpers.trl import trl_output_dir

runner = CliRunner()
CPU = ["--device", "cpu"]
BUCKET = "cd-runs"


@pytest.fixture(scope="module")
def runs(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # noqa: F811
    """Local runs and their copies in the bucket: a canonical Parquet run cut in parts, and a TRL output dir
    (per-step completions, TensorBoard events, a checkpoint's trainer_state.json)."""
    root = tmp_path_factory.mktemp("local")
    canonical = root / "canonical"
    canonical.mkdir()
    binary_run(canonical / "part-0.parquet", pass_rates={"format": 0.97, "correct": 0.4}, steps=40, seed=1)
    binary_run(canonical / "notes.txt", pass_rates={"x": 0.5}, steps=1)  # a file no format reads: ignored
    trl = trl_output_dir(root / "trl", saturate_at=10)
    s3_server.bucket(BUCKET)
    s3_server.upload(canonical, f"s3://{BUCKET}/canonical")
    s3_server.upload(trl, f"s3://{BUCKET}/trl")
    return {"canonical": canonical, "trl": trl}


def _keys(server: S3Server) -> list[str]:
    listed = server.client.list_objects_v2(Bucket=BUCKET)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def _scan_json(args: list[str], local: Path, url: str) -> Any:
    result = runner.invoke(app, ["scan", *args, "--format", "json", *CPU])
    assert result.exit_code in (0, 1), result.output
    text = result.stdout.replace(url.rstrip("/"), str(local))
    data = json.loads(text)
    data.pop("seconds", None)
    return data


def _same_as_local(local_args: list[str], remote_args: list[str], local: Path, url: str) -> Any:
    local_data = _scan_json(local_args, local, str(local))
    remote_data = _scan_json(remote_args, local, url)
    assert remote_data == local_data
    return remote_data


def test_scan_of_a_prefix_equals_the_local_scan(runs: dict[str, Path]) -> None:
    for name in ("canonical", "trl"):
        url = f"s3://{BUCKET}/{name}/"
        data = _same_as_local([str(runs[name])], [url], runs[name], url)
        assert data["run"]["rollouts"] > 0
    # The TRL dir's scalar log (events) and rollouts were both read from the bucket.
    assert data["run"]["scalar_points"] > 0 and data["findings"]


class _Requests(logging.Handler):
    """The requests the in-process S3 server answers, from werkzeug's access log: ``(method, target, status)``."""

    LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/[\d.]+" (\d{3})')

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        found = self.LINE.search(re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()))
        if found:
            self.seen.append((found[1], found[2], found[3]))


def test_a_trl_layout_costs_one_request_per_object(runs: dict[str, Path], s3_server: S3Server) -> None:  # noqa: F811
    """TRL writes one small completions file per step: each is read whole in one GET (fetched concurrently), the
    prefix is listed once, nothing is asked twice, and config files are looked for in the listing, not probed."""
    url = f"s3://{BUCKET}/trl"
    objects = [k for k in _keys(s3_server) if k.startswith("trl/")]
    log = logging.getLogger("werkzeug")
    handler, level = _Requests(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        remote._LISTINGS = remote._Listings()  # a fresh process: nothing listed yet
        data = _same_as_local([str(runs["trl"])], [url], runs["trl"], url)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert data["verdict"] in ("healthy", "at_risk", "collapsed")
    scan = [r for r in handler.seen if "list-type" in r[1] or f"/{BUCKET}/trl" in r[1]]
    gets = [r for r in scan if r[0] == "GET" and "list-type" not in r[1]]
    lists = [r for r in scan if "list-type" in r[1]]
    heads = [r for r in scan if r[0] == "HEAD"]
    read = {target.split("?")[0] for _, target, _ in gets}
    # Every object read is read once, in one GET; the prefix costs one HEAD (it is no object) and two listings
    # (is it a prefix, then what is below it); the checkpoint's trainer_state.json is not read (events win).
    assert len(gets) == len(read) == len(objects) - 1, (len(gets), len(read), len(objects))
    assert len(lists) == 2 and len(heads) == 1, (lists, heads)
    assert len(scan) <= len(objects) + 3


def test_text_output_equals_the_local_one(runs: dict[str, Path]) -> None:
    url = f"s3://{BUCKET}/trl"
    local = runner.invoke(app, ["scan", str(runs["trl"]), *CPU], env={"NO_COLOR": "1"})
    remote_run = runner.invoke(app, ["scan", url, *CPU], env={"NO_COLOR": "1"})
    assert remote_run.exit_code == local.exit_code, remote_run.output

    # The same text once the URL reads as the local path (the header that sums up the inputs aside).
    def body(text: str) -> list[str]:
        lines = text.splitlines()
        return lines[lines.index("Run") :]

    assert body(remote_run.stdout.replace(url, str(runs["trl"]))) == body(local.stdout)
    assert f"{url}/runs/" in remote_run.stdout  # the events were read from the bucket


def test_a_glob_and_a_single_object(runs: dict[str, Path]) -> None:
    trl = runs["trl"]
    url = f"s3://{BUCKET}/trl/completions/*.parquet"
    _same_as_local(
        [str(trl / "completions" / "*.parquet")], [url], trl / "completions", f"s3://{BUCKET}/trl/completions"
    )
    one = f"s3://{BUCKET}/canonical/part-0.parquet"
    data = _same_as_local(
        [str(runs["canonical"] / "part-0.parquet")], [one], runs["canonical"], f"s3://{BUCKET}/canonical"
    )
    assert data["run"]["sources"] == [str(runs["canonical"] / "part-0.parquet")]


def test_a_glob_across_prefixes_is_the_same_sweep_as_locally(runs: dict[str, Path]) -> None:
    # Two runs under one prefix: the local glob and the bucket's are a sweep of `canonical` and `trl`, named alike.
    root = runs["canonical"].parent
    data = _same_as_local([str(root / "**" / "*.parquet")], [f"s3://{BUCKET}/**/*.parquet"], root, f"s3://{BUCKET}")
    assert sorted(r["run"]["name"] for r in data["runs"]) == ["canonical", "trl"]


def test_report_and_advantages_read_the_bucket(runs: dict[str, Path], tmp_path: Path, s3_server: S3Server) -> None:  # noqa: F811
    before = _keys(s3_server)
    url = f"s3://{BUCKET}/trl"
    html = tmp_path / "report.html"
    result = runner.invoke(app, ["report", url, "--html", str(html), *CPU])
    assert result.exit_code == 0, result.output  # the saturated channel is an info finding
    page = html.read_text(encoding="utf-8")
    # The run card summarises the inputs under their root, the URL whole (never folded into "s3:/"): the rollouts
    # prefix read as one dataset, named, and the event file; the list folded under it, one item per input.
    folded = re.search(r'<details class="inputs"><summary>(.*?)</summary><ul class="files">(.*?)</ul>', page)
    assert folded is not None, page
    summary, listed = (htmllib.unescape(re.sub(r"<[^>]+>", "", part)) for part in folded.groups())
    (events,) = [k.removeprefix("trl/") for k in _keys(s3_server) if k.startswith("trl/runs/")]
    assert summary == f"{url}/: completions, 1 event file under {events.rpartition('/')[0]}/", summary
    items = [htmllib.unescape(re.sub(r"<[^>]+>", "", item)) for item in re.findall(r"<li>(.*?)</li>", folded[2])]
    assert items == ["completions", events], listed
    assert "CD101" in page

    exported, expected = tmp_path / "remote.parquet", tmp_path / "local.parquet"
    for source, out in ((url, exported), (str(runs["trl"]), expected)):
        done = runner.invoke(app, ["advantages", source, "-o", str(out), *CPU])
        assert done.exit_code == 0, done.output
    assert pq.read_table(exported).equals(pq.read_table(expected))
    assert _keys(s3_server) == before  # nothing written next to the inputs


def test_watch_polls_the_prefix_and_reads_new_objects_once(
    runs: dict[str, Path],
    s3_server: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    prefix = f"s3://{BUCKET}/watched"
    local = trl_output_dir(tmp_path / "out")
    held = sorted((local / "completions").glob("*.parquet"))[20:]
    for path in sorted((local / "completions").glob("*.parquet"))[:20]:
        s3_server.upload(path, f"{prefix}/completions")
    s3_server.upload(local / "runs", f"{prefix}/runs")

    def trainer_writes_on(state: WatchState) -> None:
        if state.polls == 1:
            for path in held:
                s3_server.upload(path, f"{prefix}/completions")

    state = watch([prefix], ScanOptions(device="cpu"), interval=0, max_polls=3, on_poll=trainer_writes_on)
    # Poll 1 scans 20 files, poll 2 sees the 10 new objects and reduces only them, poll 3 sees no change.
    assert (state.polls, state.scans, state.files_reduced) == (3, 2, 30)
    assert state.last_step == 30 and state.last_error is None


def test_watch_sees_an_object_rewritten_with_the_same_size(s3_server: S3Server, tmp_path: Path) -> None:  # noqa: F811
    url = f"s3://{BUCKET}/rewritten/value.bin"
    s3_server.client.put_object(Bucket=BUCKET, Key="rewritten/value.bin", Body=b"aaaa")
    first = remote.snapshot_url(url)
    s3_server.client.put_object(Bucket=BUCKET, Key="rewritten/value.bin", Body=b"bbbb")
    second = remote.snapshot_url(url)
    assert first[url][0] == second[url][0] == 4 and first != second  # same size, new ETag


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://no-such-bucket-here/run/", "s3://no-such-bucket-here/run: no such bucket s3://no-such-bucket-here"),
        (f"s3://{BUCKET}/canonical/missing.parquet", f"s3://{BUCKET}/canonical/missing.parquet: no such object"),
        (f"s3://{BUCKET}/canonical/*.jsonl", f"s3://{BUCKET}/canonical/*.jsonl: pattern matches no object"),
        ("ftp://host/run.parquet", "ftp://host/run.parquet: unsupported URL scheme 'ftp'"),
    ],
)
def test_missing_inputs_are_one_line(runs: dict[str, Path], url: str, expected: str) -> None:
    result = runner.invoke(app, ["scan", url, *CPU])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {expected}") and result.stderr.count("\n") == 1, result.stderr


def _error(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    return result.stderr


def test_bad_credentials_are_access_denied(runs: dict[str, Path], s3_server: S3Server) -> None:  # noqa: F811
    s3_server.require_signatures(True)  # the dummy key is not one the server knows
    try:
        line = _error(["scan", f"s3://{BUCKET}/canonical/", *CPU])
    finally:
        s3_server.require_signatures(False)
    assert line.startswith(f"error: s3://{BUCKET}/canonical: access denied (")
    assert "Hint: check that these credentials may list and read it" in line


def test_no_credentials(runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    line = _error(["scan", f"s3://{BUCKET}/canonical/", *CPU])
    assert line.startswith(f"error: s3://{BUCKET}/canonical: no credentials to read it (Unable to locate credentials)")
    assert "AWS_PROFILE" in line


def test_unreachable_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for name, value in ENVIRONMENT.items():  # credentials of its own: alone (not after the server's tests) too
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    line = _error(["scan", f"s3://{BUCKET}/canonical/", *CPU])
    assert line.startswith(f"error: s3://{BUCKET}/canonical: cannot reach the storage endpoint (")
    assert f"127.0.0.1:{port}" in line and "AWS_ENDPOINT_URL" in line


def test_without_the_remote_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "botocore", None)  # `import botocore` fails, as without the extra
    monkeypatch.setattr(remote, "_FILESYSTEMS", {})
    line = _error(["scan", f"s3://{BUCKET}/canonical/", *CPU])
    assert line == (
        f"error: s3://{BUCKET}/canonical: reading s3:// URLs needs the botocore package (not installed). "
        "Hint: pip install 'collapse-doctor[s3]' ('collapse-doctor[remote]': every cloud)\n"
    )


def test_outputs_in_object_storage_are_refused(
    runs: dict[str, Path],
    s3_server: S3Server,  # noqa: F811
) -> None:
    before = _keys(s3_server)
    for args in (
        ["scan", f"s3://{BUCKET}/canonical/", "--json", f"s3://{BUCKET}/canonical/scan.json", *CPU],
        ["advantages", f"s3://{BUCKET}/canonical/", "-o", f"s3://{BUCKET}/out.parquet", *CPU],
    ):
        line = _error(args)
        assert "outputs are written to local files, not to object storage" in line
    assert _keys(s3_server) == before
