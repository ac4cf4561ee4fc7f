#!/usr/bin/env bash
# Issue 15's GPU checks in one run, for a session lent a GPU machine (the device tool's H200, whose python3 holds
# torch with CUDA): the CUDA tests, then `advantages` and `scan` of a 20M-row run on cuda against the same
# commands on that machine's CPU. From the repository root; results go to OUT_DIR (default $OUT, else /tmp).
#   benchmarks/gpu_check.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
"$py" -c "import torch, numpy, pyarrow; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$out/gpu.txt"
"$py" -m pytest -q -p no:cacheprovider -o addopts="" -m cuda \
    tests/unit/engine/test_advantages_cuda.py tests/unit/engine/stats/test_statistics_cuda.py 2>&1 | tee "$out/cuda_tests.txt"
tests=${PIPESTATUS[0]}
"$py" benchmarks/bench_gpu.py --rows 20000000 --repeats 3 2>&1 | tee "$out/gpu_bench.txt"
bench=${PIPESTATUS[0]}
echo "cuda tests exit $tests, benchmark exit $bench" | tee -a "$out/gpu.txt"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
