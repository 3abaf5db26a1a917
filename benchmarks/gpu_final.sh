#!/usr/bin/env bash
# The GPU check of a whole tree, in two device calls that each fit the 10-minute limit:
#   bash benchmarks/gpu_final.sh tests   # every test file on the GPU (gpu-marked ones included)
#   bash benchmarks/gpu_final.sh bench   # speed, decode bandwidth, variants, memory, sanitizer
# Logs under $OUT; a short summary is printed last.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 FLASHTILE_HYPOTHESIS_PROFILE=gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
case ${1:-tests} in
  tests)
    timeout 560 python3 -m pytest -q -p no:cacheprovider -n "${WORKERS:-8}" --durations=30 tests/ > "$OUT/tests.log" 2>&1
    grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -30; tail -1 "$OUT/tests.log" ;;
  bench)
    timeout 60 python3 benchmarks/speed_table.py --headdims 64 128 --seqlens 1024 16384 --json "$OUT/speed.json" \
      > "$OUT/speed.log" 2>&1
    timeout 60 python3 benchmarks/decode.py > "$OUT/decode.log" 2>&1
    timeout 60 python3 benchmarks/variants.py > "$OUT/variants.log" 2>&1
    timeout 60 python3 benchmarks/memory_scaling.py > "$OUT/memory.log" 2>&1
    timeout 90 compute-sanitizer --tool memcheck python3 benchmarks/sanitize.py > "$OUT/sanitize.log" 2>&1
    tail -22 "$OUT/speed.log"; cat "$OUT/decode.log" "$OUT/variants.log" "$OUT/memory.log"
    grep -E "ERROR SUMMARY|sanitize:" "$OUT/sanitize.log" ;;
esac
