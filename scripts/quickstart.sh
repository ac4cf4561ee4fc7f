#!/usr/bin/env bash
# Set up (first run only), then diagnose a shipped sample run whose format reward saturates.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh || exit 2
.venv/bin/collapse-doctor scan sample_logs/saturating-format.parquet "$@"
rc=$?
if [ "$rc" = 1 ]; then
  echo "(exit code 1: a finding at or above --fail-on, the CI gate; in this sample \`format\` drowns \`correct\` while it saturates)" >&2
fi
exit "$rc"
