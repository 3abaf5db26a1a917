# session 36, call 4: attempt 84 with the Delta warps' rows a thread each (v84/rowwise): its GPU tests, then the 1k kernels
set -u
S=$PWD/.scratch/s36; T=$S/v84/rowwise
start=$(date +%s)
( cd $T && OMP_NUM_THREADS=2 PYTHONPATH=$T/src:$T timeout 120 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 12 \
  --timeout=100 -m gpu tests/test_gluon.py -k "backward_on_persistent_programs and own-delta" > $OUT/tests-rowwise-own.log 2>&1 )
echo "tests own-delta cases: $(tail -n 1 $OUT/tests-rowwise-own.log) ($(( $(date +%s) - start )) s)"
for pass in 1 2; do
  for tree in own0 rowwise hop; do
    src=$S/v84/$tree/src; on=1; [ $tree = own0 ] && { src=$S/own/src; on=0; }
    FLASHTILE_GLUON_BWD_OWN_DELTA=$on PYTHONPATH=$src timeout 60 python3 $S/graph_cells.py $tree 2>&1 | grep -E "µs|Error" | tail -n 5
  done
done | tee $OUT/graph-rowwise.log
echo "graph done $(( $(date +%s) - start )) s"
SEL="fused or deterministic or backward or same_bits or replay or by_default"
( cd $T && FLASHTILE_GLUON_BWD_OWN_DELTA=1 OMP_NUM_THREADS=2 PYTHONPATH=$T/src:$T timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 12 \
  --timeout=180 -m gpu tests/test_gluon.py -k "$SEL" > $OUT/tests-rowwise-own1.log 2>&1 )
echo "tests fused selection, OWN_DELTA=1: $(tail -n 1 $OUT/tests-rowwise-own1.log)"
grep -E "^FAILED|^ERROR" $OUT/tests-rowwise-own1.log | head -n 10
echo "total $(( $(date +%s) - start )) s"
