#!/usr/bin/env bash
# Set up (first run only) and run collapse-doctor on a shipped sample run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
mkdir -p artifacts
exec .venv/bin/collapse-doctor advantages sample_logs/saturating-format.parquet \
  -o artifacts/saturating-format-advantages.parquet --weights format=1,correct=1 "$@"
