# session 34, last call: 728fb88 + unswizzled dQ-warp boxes (4 values a lane), under the carried Triton 3.9
set -u
bash tools/triton_parts.sh unpack 3.9.0 > $OUT/unpack.log 2>&1 || { tail -3 $OUT/unpack.log; exit 1; }
export TRITON_BACKENDS_IN_TREE=1 PYTHONPATH=$PWD/.triton-parts/3.9.0/site:$PWD/src
OMP_NUM_THREADS=2 timeout 110 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 8 --timeout=60 tests/test_gluon.py -m gpu -k "DQ_LAST or dq-last" > $OUT/tests.log 2>&1; tail -n 1 $OUT/tests.log
for on in 0 1; do
  FLASHTILE_GLUON_BWD_DQ_LAST=$on timeout 60 python3 -m flashtile bench --headdims 64 128 --seqlens 1k --causal both \
    --modes bwd --providers flashtile --rounds 2 > $OUT/bench-dq-last$on.log 2>&1
  echo "== DQ_LAST=$on"; grep "│" $OUT/bench-dq-last$on.log | grep -v " s │" | grep "1k"
done
