"""Where the repository's files are, for tests at any depth."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_LOGS = ROOT / "sample_logs"
GOLDEN = ROOT / "tests" / "golden"
