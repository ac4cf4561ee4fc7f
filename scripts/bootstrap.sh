#!/usr/bin/env bash
# Create .venv on first use and (re)install the project when pyproject.toml changes.
# Safe to run every time: it does nothing when the environment is up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
stamp=.venv/.collapse-doctor-installed

if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($python --version 2>&1)" >&2
  "$python" -m venv .venv
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/constraints.txt -nt "$stamp" ]; then
  echo "bootstrap: installing collapse-doctor, its dev tools and every extra (train, trackers, remote, ray) into .venv (first run takes a few minutes)" >&2
  # The CPU wheel of torch first, where this machine has it: a bare torch requirement would pull a
  # multi-GB CUDA build. Elsewhere pip picks a torch from pyproject's range.
  .venv/bin/python -m pip install -q "torch==2.13.0" 2>/dev/null \
    || echo "bootstrap: torch 2.13.0 not available here; using pyproject's torch range" >&2
  # Every extra too: the retrain tests run TRL on CPU with a tiny model built in code, the tracker tests write
  # real wandb/trackio/mlflow files offline, the object-storage tests run moto's S3 server, the Ray tests a
  # local Ray instance.
  # Pinned by scripts/constraints.txt (what the suite last passed with): resolving every extra from scratch
  # makes pip backtrack for many minutes.
  .venv/bin/python -m pip install -q -e ".[dev,train,trackers,remote,ray]" -c scripts/constraints.txt
  # verl 0.9.1's own estimators are the estimator tests' reference (tests/reference/test_estimators_verl.py). Without
  # its dependencies: they pin transformers < 5.11 and pull GPU packages; core_algos imports on CPU with what the dev
  # extra installs (omegaconf, codetiming, tensordict, orjson) next to ray and packaging.
  .venv/bin/python -m pip install -q --no-deps "verl==0.9.1"
  touch "$stamp"
fi
