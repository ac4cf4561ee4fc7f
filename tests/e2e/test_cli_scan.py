"""`collapse-doctor scan` and `explain` end to end: exit codes, outputs, config (the goldens: test_golden.py)."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import jsonschema
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from collapse_doctor.cli.app import app
from collapse_doctor.report.schemas import schema_text
from tests.helpers import runs
from tests.helpers.tables import WriteTable, make_table

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads(schema_text("scan"))


def scan(*args: str | Path, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["scan", *map(str, args), "--device", "cpu"], env=env)


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    # Outputs name the input relative to the repository, as a user in the checkout would.
    monkeypatch.chdir(ROOT)


def test_exit_codes_follow_fail_on(tmp_path: Path) -> None:
    collapsed = runs.zero_variance_run(tmp_path / "zero.parquet")  # CD102 critical, CD101 info
    assert scan(collapsed).exit_code == 1
    assert scan(collapsed, "--fail-on", "critical").exit_code == 1
    assert scan(collapsed, "--fail-on", "never").exit_code == 0
    assert scan(collapsed, "--only", "CD101", "--fail-on", "info").exit_code == 1
    assert scan(collapsed, "--only", "CD101").exit_code == 0  # a saturated channel alone is information
    assert scan(collapsed, "--ignore", "CD102").exit_code == 0
    sample = ROOT / "sample_logs" / "saturating-format.parquet"  # CD402 warning, CD101 info
    assert scan(sample).exit_code == 1
    assert scan(sample, "--fail-on", "critical").exit_code == 0
    assert scan(ROOT / "sample_logs" / "healthy.parquet", "--fail-on", "info").exit_code == 0
    bad = scan(sample, "--fail-on", "sometimes")
    assert bad.exit_code == 2
    assert "--fail-on 'sometimes' is not one of never, info, warning, critical" in bad.stderr


def test_json_to_stdout_and_schema(tmp_path: Path) -> None:
    result = scan(ROOT / "sample_logs" / "tied-sums.parquet", "--format", "json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    jsonschema.validate(data, SCHEMA)
    assert data["verdict"] == "at_risk"
    assert data["run"]["channels"] == ["format", "correct", "reasoning"]
    assert data["run"]["algorithm"] == "grpo"
    finding = data["findings"][0]
    assert finding["code"] == "CD301" and finding["gdpo_resolves"] is True
    assert len(data["series"]["step"]) == 200
    assert set(data["series"]["rel_gain"]) == {"format", "correct", "reasoning"}


def test_junit_report(tmp_path: Path) -> None:
    out = tmp_path / "junit.xml"
    result = scan(ROOT / "sample_logs" / "saturating-format.parquet", "--junit", out)
    assert result.exit_code == 1
    suite = ET.parse(out).getroot()
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["CD402 dominant channel [format]"].find("failure") is not None
    assert cases["CD101 rel_gain decay [format]"].find("failure") is None  # info: below the gate
    assert cases["CD101 rel_gain decay [correct]"].find("failure") is None
    assert cases["CD301 tied-sum resolution loss"].find("failure") is None
    assert suite.get("failures") == "1" and suite.get("errors") == "0"
    assert int(suite.get("tests")) == len(cases)

    # With --fail-on critical the warning is reported but does not fail.
    scan(ROOT / "sample_logs" / "saturating-format.parquet", "--junit", out, "--fail-on", "critical")
    suite = ET.parse(out).getroot()
    assert suite.get("failures") == "0"


def test_junit_marks_crashed_and_skipped_detectors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from collapse_doctor.judge.detectors import REGISTRY

    monkeypatch.setattr(REGISTRY["CD401"], "detect", lambda self, ctx: 1 / 0)
    path = runs.binary_run(tmp_path / "b.parquet", pass_rates={"a": 0.5, "b": 0.5}, weights={"a": 1, "b": 0.7})
    out = tmp_path / "junit.xml"
    result = scan(path, "--junit", out)
    assert result.exit_code == 1  # a crashed detector fails the gate
    suite = ET.parse(out).getroot()
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert cases["CD401 reward collinearity [a / b]"].find("error") is not None
    assert cases["CD202 advantage bound"].find("skipped") is not None
    assert "ERROR    CD401" in result.stdout


def test_github_format_and_step_summary(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("previous\n")
    result = scan(
        "sample_logs/saturating-format.parquet",
        "--format",
        "github",
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("::error file=sample_logs/saturating-format.parquet,title=CD402 ")
    clause = "rollouts only: 8 of 21 checks ran; 11 need a scalar log"  # what the verdict rests on
    assert lines[-1] == f"::notice title=collapse-doctor::AT RISK ({clause}): 2 finding(s)"
    text = summary.read_text()
    head = "## ⚠️ collapse-doctor: AT RISK (rollouts only: 8 of 21 checks ran; 11 need a scalar log)"
    assert text.startswith(f"previous\n{head}\n\n0% of rollouts gave no gradient under GRPO")
    assert "| warning | CD402 |" in text and "| info | CD101 |" in text


def test_markdown_escapes_log_text(tmp_path: Path, write_table: WriteTable) -> None:
    table = make_table(steps=20, channels=("a|b<script>", "c"))
    out = tmp_path / "summary.md"
    result = scan(write_table(table), "--markdown", out)
    assert result.exit_code in (0, 1), result.output
    text = out.read_text()
    assert "<script>" not in text and "a\\|b&lt;script&gt;" in text


def test_text_output_treats_names_as_text(write_table: WriteTable) -> None:
    table = make_table(steps=20, channels=("[bold]fmt[/bold]", "c"))
    result = scan(write_table(table), env={"NO_COLOR": "1"})
    assert "[bold]fmt[/bold]" in result.stdout


def test_config_discovery_and_overrides(tmp_path: Path) -> None:
    run_dir = tmp_path / "project" / "runs" / "exp1"
    run_dir.mkdir(parents=True)
    path = runs.simulated(run_dir / "sat.parquet", "saturating-format")
    assert scan(path).exit_code == 1

    (tmp_path / "project" / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.collapse-doctor]\nfail_on = "critical"\nignore = ["CD101"]\n'
    )
    result = scan(path, "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0
    assert data["fail_on"] == "critical" and "CD101" not in data["detectors"]

    (run_dir / "collapse-doctor.toml").write_text('[severity]\nCD402 = "critical"\n')
    result = scan(path, "--format", "json")  # the nearer file wins; CD101 is back
    codes = {f["code"]: f["severity"] for f in json.loads(result.stdout)["findings"]}
    assert codes == {"CD101": "info", "CD402": "critical"}

    explicit = tmp_path / "strict.toml"
    explicit.write_text("[thresholds.CD101]\nconstant_share = 0.999\nwarn_ratio = 0.001\n")
    result = scan(path, "--config", explicit, "--format", "json")
    assert "CD101" not in {f["code"] for f in json.loads(result.stdout)["findings"]}
    assert scan(path, "--config", explicit, "--fail-on", "never").exit_code == 0


def test_another_projects_broken_pyproject_above_the_run_is_not_ours(tmp_path: Path) -> None:
    # A pyproject.toml that is not valid TOML, met on the walk up from the run: scanning under it failed (exit 2).
    # Without our table's name in it, it is another project's file: skipped; with it, our config is broken: an error.
    run_dir = tmp_path / "project" / "runs"
    run_dir.mkdir(parents=True)
    path = runs.simulated(run_dir / "sat.parquet", "saturating-format")
    (tmp_path / "project" / "pyproject.toml").write_text('[project\nname = "broken"\n')
    assert scan(path).exit_code == 1  # judged: CD402 at the default --fail-on
    (tmp_path / "project" / "pyproject.toml").write_text('[tool.collapse-doctor\nfail_on = "critical"\n')
    broken = scan(path)
    assert broken.exit_code == 2 and "not valid TOML" in broken.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("fail-on = 'warning'\ncolour = 1\n", "unknown key(s) ['colour']"),
        ("[thresholds.CD101]\nwarn_rat = 0.3\n", "unknown threshold 'thresholds.CD101.warn_rat'"),
        ("[severity]\nCD999 = 'info'\n", "unknown detector code 'severity.CD999'"),
        ("[severity]\nCD101 = 'loud'\n", "'loud' is not one of info, warning, critical"),
        ("persistence = 3\n", "'persistence' must be a number between 0 and 1"),
        ("fail_on = [", "not valid TOML"),
    ],
)
def test_bad_config_is_exit_2(tmp_path: Path, content: str, message: str) -> None:
    config = tmp_path / "collapse-doctor.toml"
    config.write_text(content)
    result = scan(ROOT / "sample_logs" / "healthy.parquet", "--config", config)
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_inputs_through_scan(tmp_path: Path, write_table: WriteTable) -> None:
    text = tmp_path / "notes.parquet"
    text.write_text("nope")
    table = make_table()
    cases = [
        (tmp_path / "missing.parquet", "no such file or directory"),
        (text, "not a Parquet file"),
        (write_table(table.drop_columns(["step"]), "nostep.parquet"), "expected column 'step'"),
        (
            write_table(table.drop_columns(["reward/format", "reward/correct"]), "norew.parquet"),
            "no reward column",
        ),
        (write_table(table.slice(0, 0), "empty.parquet"), "the input has no rows"),
        (
            write_table(table.set_column(2, "reward/format", pa.array([float("inf")] * table.num_rows)), "inf.parquet"),
            "'reward/format' has 96 row(s) with +inf or -inf",
        ),
    ]
    for path, message in cases:
        result = scan(path, "--json", tmp_path / "out.json")
        assert result.exit_code == 2, (path, result.output)
        assert message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "out.json").exists()
    assert scan(ROOT / "sample_logs" / "healthy.parquet", "--only", "CD9").exit_code == 2
    assert scan(ROOT / "sample_logs" / "healthy.parquet", "--algo", "ppo").exit_code == 2
    assert scan(ROOT / "sample_logs" / "healthy.parquet", "--format", "xml").exit_code == 2


def test_scan_refuses_to_overwrite_its_input(tmp_path: Path) -> None:
    path = runs.simulated(tmp_path / "h.parquet", "healthy", steps=20)
    before = path.read_bytes()
    result = scan(path, "--json", path)
    assert result.exit_code == 2 and "refusing to overwrite an input file" in result.stderr
    assert path.read_bytes() == before


def test_explain() -> None:
    result = runner.invoke(app, ["explain", "cd401"])
    assert result.exit_code == 0
    for heading in ("What it detects", "Why it matters", "Evidence", "Remedy", "warn_rho = 0.85"):
        assert heading in result.stdout
    listing = runner.invoke(app, ["explain"])
    from collapse_doctor.judge.detectors import REGISTRY

    assert listing.exit_code == 0 and listing.stdout.count("\nCD") == len(REGISTRY) - 1
    unknown = runner.invoke(app, ["explain", "CD999"])
    assert unknown.exit_code == 2 and "unknown detector code 'CD999'" in unknown.stderr


def test_python_api() -> None:
    from collapse_doctor.core.options import ScanOptions
    from collapse_doctor.pipeline.scan import diagnose

    diagnosis = diagnose(["sample_logs/collinear.parquet"], ScanOptions.of(device="cpu"))
    assert diagnosis.verdict == "at_risk"
    assert [f.code for f in diagnosis.findings] == ["CD401"]
    assert diagnosis.findings[0].remedy.startswith("drop `verifier`: it repeats `correct`, rho=0.9")
    assert json.loads(diagnosis.to_json())["findings"][0]["channels"] == ["correct", "verifier"]
