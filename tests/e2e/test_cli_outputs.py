"""`scan` and `report` write through one dispatcher: several runs, --html from either command, the shared options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from collapse_doctor.cli import options as cli
from collapse_doctor.cli import scan as scan_command
from collapse_doctor.cli.app import app
from collapse_doctor.core.options import ReadOptions, ScanOptions
from tests.helpers.scalar_runs import collapsed_series, trl_series, write_events

runner = CliRunner()


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """A log directory with two runs: ``bad`` (collapsed) and ``good`` (healthy)."""
    write_events(tmp_path / "logs" / "good", trl_series())
    write_events(tmp_path / "logs" / "bad", collapsed_series())
    return tmp_path / "logs"


def test_scan_html_and_report_html_write_several_runs_alike(logs: Path, tmp_path: Path) -> None:
    """Several runs: OUT is an index that links one report per run, written beside it; JUnit holds a suite per run."""
    for command in ("scan", "report"):
        out = tmp_path / command
        out.mkdir()
        result = runner.invoke(app, [command, str(logs), "--html", str(out / "r.html")])
        assert result.exit_code == 1, result.output
        assert sorted(p.name for p in out.iterdir()) == ["r-bad.html", "r-good.html", "r.html"]
        index = (out / "r.html").read_text(encoding="utf-8")
        assert 'href="r-bad.html"' in index and 'href="r-good.html"' in index and "COLLAPSED" in index
        assert "run</th><td>bad" in (out / "r-bad.html").read_text(encoding="utf-8")
    junit = runner.invoke(app, ["scan", str(logs), "--junit", str(tmp_path / "j.xml")])
    assert junit.exit_code == 1 and "wrote " in junit.stderr
    xml = (tmp_path / "j.xml").read_text(encoding="utf-8")
    assert xml.count("<testsuite ") == 2 and 'name="collapse-doctor: bad"' in xml and "<testsuites " in xml


def test_report_of_one_of_several_runs(logs: Path, tmp_path: Path) -> None:
    out = tmp_path / "bad.html"
    result = runner.invoke(app, ["report", str(logs), "--run", "bad", "--html", str(out)])
    assert result.exit_code == 1, result.output
    # The file written is said on stderr; the result on stdout is the run's verdict line.
    assert result.stderr.startswith(f"wrote {out} (") and "MB): COLLAPSED, " in result.stderr
    assert result.stdout.startswith("COLLAPSED") and result.stdout.count("\n") == 1
    assert "run</th><td>bad" in out.read_text(encoding="utf-8")


def test_several_runs_in_every_format_that_holds_them(logs: Path, tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    args = ["scan", str(logs), "--json", str(tmp_path / "s.json"), "--markdown", str(tmp_path / "s.md")]
    result = runner.invoke(app, [*args, "--format", "github"], env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.exit_code == 1, result.output
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["verdict"] == "collapsed" and [r["run"]["name"] for r in data["runs"]] == ["bad", "good"]
    markdown = (tmp_path / "s.md").read_text()
    assert markdown.count("## ") == 2 and summary.read_text() == markdown
    assert result.stdout.count("::notice title=collapse-doctor::") == 2
    text = runner.invoke(app, ["scan", str(logs), "--fail-on", "never"], env={"NO_COLOR": "1"})
    assert text.exit_code == 0
    assert text.stdout.index("run bad:") < text.stdout.index("run good:")


# -- options declared once ---------------------------------------------------------------------------------
GROUPS = {
    "advantages": {cli.INPUT, cli.SCALE},
    "scan": {cli.INPUT, cli.LENGTHS, cli.VERDICT, cli.DETECTORS, cli.RUNS, cli.SCALE},
    "report": {cli.INPUT, cli.LENGTHS, cli.VERDICT, cli.DETECTORS, cli.RUNS, cli.SCALE},
    "compare": {cli.INPUT, cli.LENGTHS, cli.VERDICT, cli.DETECTORS, cli.SCALE},
    "watch": {cli.INPUT, cli.LENGTHS, cli.DETECTORS, cli.RUNS},
}


@pytest.mark.parametrize("command", sorted(GROUPS))
def test_each_command_has_its_groups_of_shared_options(command: str) -> None:
    import typer.main

    group = typer.main.get_command(app)  # typer's own click: no isinstance against `click.Group`
    params = {p.name: p for p in group.commands[command].params}  # type: ignore[attr-defined]
    for option in cli.SHARED_OPTIONS:
        declared = option.annotation.__metadata__[0].help
        if option.group in GROUPS[command]:
            assert params[option.name].help == declared, (command, option.name)
        else:  # absent, or the command's own (watch's --fail-on stops the watch)
            assert option.name not in params or params[option.name].help != declared, (command, option.name)
    assert "debug" in params and "options" not in params


def test_the_command_gets_one_scan_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[ScanOptions] = []

    def fake_scan(paths: list[str], options: ScanOptions, request: object, **kwargs: object) -> tuple[int, list, list]:  # type: ignore[type-arg]
        seen.append(options)
        return 0, [], []

    monkeypatch.setattr(scan_command, "scan_and_write", fake_scan)
    config = tmp_path / "c.toml"
    args = ["--weights", "a=1, b=0.5", "--algo", "grpo", "--fail-on", "critical", "--config", str(config)]
    args += ["--only", "CD1,CD301", "--ignore", "CD402", "--device", "cpu", "--step-col", "s", "--group-col", "g"]
    args += ["--reward-cols", "a, b", "--group-size", "4", "--run", "exp1"]
    result = runner.invoke(app, ["scan", "run/", *args])
    assert result.exit_code == 0, result.output
    read = ReadOptions(step_col="s", group_col="g", reward_cols=("a", "b"), group_size=4, weights={"a": 1.0, "b": 0.5})
    assert seen == [
        ScanOptions(
            read=read,
            algo="grpo",
            device="cpu",
            config=config,
            fail_on="critical",
            only=("CD1", "CD301"),
            ignore=("CD402",),
            run_name="exp1",
        )
    ]
    assert runner.invoke(app, ["scan", "run/"]).exit_code == 0
    assert seen[-1] == ScanOptions()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--weights", "a=x"], "error: --weights: cannot read 'a=x'. Hint: use name=number pairs"),
        (["--algo", "ppo"], "error: --algo 'ppo' is not one of auto, grpo, gdpo"),
        (["--format", "xml"], "error: --format 'xml' is not one of text, json, github"),
    ],
)
def test_bad_option_values_are_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["scan", str(tmp_path), *args])
    assert result.exit_code == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_watch_passes_its_scan_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from collapse_doctor.pipeline import watch

    calls: list[tuple[object, ...]] = []

    def fake_watch(paths: list[str], options: ScanOptions, **kwargs: object) -> watch.WatchState:
        calls.append((paths, options, kwargs["interval"], kwargs["fail_on"], kwargs["max_polls"]))
        state = kwargs["state"]
        assert isinstance(state, watch.WatchState)
        state.polls = 1
        return state

    monkeypatch.setattr(watch, "watch", fake_watch)
    args = ["watch", "out/", "--interval", "0", "--max-polls", "1", "--only", "CD5", "--run", "a", "--fail-on", "info"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert calls == [(["out/"], ScanOptions(only=("CD5",), run_name="a"), 0.0, "info", 1)]
    assert "watched 1 poll(s)" in result.stdout
