#!/usr/bin/env bash
# One device call: GPU tests, then the speed table. Logs under $OUT (or ./out).
# Usage: bash benchmarks/gpu_check.sh [tests|bench|tune|all] [extra pytest args...]
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
what=${1:-all}; shift || true
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/test_kernels.py "$@" 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
fi
if [[ $what == tune ]]; then
  python3 benchmarks/tune_configs.py "$@" 2>&1 | tee "$OUT/tune.log"
fi
if [[ $what == bench || $what == all ]]; then
  python3 benchmarks/speed_table.py --json "$OUT/speed.json" 2>&1 | tee "$OUT/speed.log" | tail -30
fi
