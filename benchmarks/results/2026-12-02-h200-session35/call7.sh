# session 35, call 7: dQ's conversion beside the fused grid's last programs (branch early-dq working tree), triton 3.6
set -u
start=$(date +%s)
OMP_NUM_THREADS=2 PYTHONPATH=$PWD/src:$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 12 \
  --timeout=120 -m gpu tests/test_gluon.py -k "backward_on_persistent_programs or replay" > $OUT/tests.log 2>&1
echo "tests: $(tail -n 1 $OUT/tests.log) ($(( $(date +%s) - start )) s)"
for pass in 1 2; do for on in 0 1; do
  FLASHTILE_GLUON_BWD_EARLY_DQ=$on PYTHONPATH=$PWD/src timeout 60 python3 .scratch/s35/graph_cells.py early$on 2>&1 | grep "µs"
done; done | tee $OUT/graph.log
echo "total $(( $(date +%s) - start )) s"
