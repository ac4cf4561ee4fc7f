#!/usr/bin/env bash
# Set up (first run only), then diagnose a shipped sample run whose format reward saturates.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh || exit 2
.venv/bin/collapse-doctor scan sample_logs/saturating-format.parquet "$@"
rc=$?
if [ "$rc" = 1 ]; then
  echo "(exit code 1: findings at or above --fail-on, the CI gate; this sample is meant to collapse)" >&2
fi
exit "$rc"
