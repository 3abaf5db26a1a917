#!/usr/bin/env bash
# One device call for a session's last check: the GPU tests of the kernels touched since
# the last full run, then the speed, decode and variant benchmarks, each under a time
# limit so the whole call fits a short lease. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
timeout 90 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/test_kernels.py \
  -k "d40 or d128 or variants or float32 or deterministic or compile or opcheck or autotune or magnitude or beyond" \
  > "$OUT/t_kernels.log" 2>&1
timeout 90 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_dropout_bias.py tests/test_varlen.py \
  tests/test_kvcache.py tests/test_sdpa.py > "$OUT/t_features.log" 2>&1
timeout 40 python3 benchmarks/speed_table.py --headdims 128 --seqlens 4096 16384 > "$OUT/speed.log" 2>&1
timeout 45 python3 benchmarks/decode.py --batches 32 128 --cache 8192 32768 --heads 32 64 > "$OUT/decode.log" 2>&1
timeout 30 python3 benchmarks/variants.py > "$OUT/variants.log" 2>&1
for f in t_kernels t_features; do tail -1 "$OUT/$f.log"; grep -E "^FAILED" "$OUT/$f.log" | head -8; done
tail -4 "$OUT/speed.log"; cat "$OUT/decode.log" "$OUT/variants.log"
