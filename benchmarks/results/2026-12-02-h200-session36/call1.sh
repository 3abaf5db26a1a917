# session 36, call 1: attempt 84 (branch own-delta 4792d6a, copied to .scratch/s36/own), triton 3.6
set -u
T=$PWD/.scratch/s36/own
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader > $OUT/times.txt
start=$(date +%s)
for pass in 1 2; do for on in 0 1; do
  FLASHTILE_GLUON_BWD_OWN_DELTA=$on PYTHONPATH=$T/src timeout 70 python3 .scratch/s36/graph_cells.py own$on 2>&1 | grep -E "µs|Error|error" | tail -n 6
done; done | tee $OUT/graph.log
echo "graph $(( $(date +%s) - start )) s" >> $OUT/times.txt
cd $T
SEL="fused or deterministic or backward or same_bits or replay or by_default"
FLASHTILE_GLUON_BWD_OWN_DELTA=1 OMP_NUM_THREADS=2 PYTHONPATH=$T/src:$T timeout 330 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 12 \
  --timeout=300 -m gpu tests/test_gluon.py -k "$SEL" > $OUT/tests-own1.log 2>&1
echo "tests: $(tail -n 1 $OUT/tests-own1.log)"
grep -E "^FAILED|^ERROR" $OUT/tests-own1.log | head -n 15
echo "total $(( $(date +%s) - start )) s" >> $OUT/times.txt
cat $OUT/times.txt
