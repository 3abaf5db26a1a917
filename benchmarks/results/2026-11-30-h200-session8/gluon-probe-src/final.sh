#!/usr/bin/env bash
# Session 8's last device call: d256 backward configs and the atomic-dQ experiment (GPU tests, then
# A/B speed), and the Gluon forward probe. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
step() { local start=$SECONDS; "$@"; echo "$((SECONDS - start)) s  ${*:2:8}" >> "$OUT/times.txt"; }
pt() { OMP_NUM_THREADS=2 PYTHONPATH=$PWD/src:$PWD python3 -m pytest -q -p no:cacheprovider -p no:benchmark --timeout=200 "$@"; }
# 1. GPU tests, two sets at once: the d256 (and d192, padded to 256) grid on the new configs; the
#    d40/d64/d128 grid with dQ through atomics.
start=$SECONDS
(timeout 170 bash -c "$(declare -f pt); pt -n 7 tests/test_kernels.py -m gpu -k 'gpu_grid and (d256 or d192)'" > "$OUT/tests-d256.log" 2>&1) &
(FLASHTILE_ATOMIC_DQ=1 timeout 170 bash -c "$(declare -f pt); pt -n 7 tests/test_kernels.py -m gpu -k 'gpu_grid and (d40 or d64 or d128)'" > "$OUT/tests-atomic.log" 2>&1) &
wait; echo "$((SECONDS - start)) s  tests" >> "$OUT/times.txt"
# 2. Gluon forward prototypes
step timeout 100 python3 gluon_proto/probe.py > "$OUT/gluon.log" 2>&1
# 3. atomic dQ A/B (backward), then d256 new against the old configs
for a in 0 1 0 1; do
  echo "== FLASHTILE_ATOMIC_DQ=$a" >> "$OUT/atomic.log"
  step env FLASHTILE_ATOMIC_DQ=$a timeout 45 python3 benchmarks/speed_table.py --headdims 64 128 --seqlens 4096 16384 \
    --impls flashtile >> "$OUT/atomic.log" 2>&1
done
step timeout 50 python3 benchmarks/speed_table.py --headdims 256 --seqlens 4096 16384 --impls flashtile > "$OUT/d256.log" 2>&1
echo "== OLD" >> "$OUT/d256.log"
step env PYTHONPATH=$PWD/.old/src timeout 50 python3 benchmarks/speed_table.py --headdims 256 --seqlens 4096 16384 \
  --impls flashtile >> "$OUT/d256.log" 2>&1
tail -2 "$OUT/tests-d256.log" "$OUT/tests-atomic.log"; grep -E "FAILED" "$OUT"/tests-*.log | head
cat "$OUT/gluon.log" | grep -v Warn; grep -E "^==|^ *(64|128|256) " "$OUT/atomic.log" "$OUT/d256.log"; cat "$OUT/times.txt"
