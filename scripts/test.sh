#!/usr/bin/env bash
# Set up (first run only), then lint, type-check and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
# The HTML report's browser tests need headless Chromium and chromedriver (Debian packages).
# Installed once when missing (CI runs this as root on a fresh machine); a no-op afterwards.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing chromium and chromium-driver for the browser tests" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "test.sh: chromium/chromedriver missing and cannot apt-get here: the browser tests will fail" >&2
  fi
fi
export COLLAPSE_DOCTOR_BROWSER_TESTS=1  # a missing browser fails those tests instead of skipping them
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -n 2 --dist loadgroup "$@"
