# session 35, call 3: form 4 (claims, no waits; completion wait two steps back), triton 3.6
set -u
T=.scratch/s35/form4
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader > $OUT/gpu.txt
start=$(date +%s)
(PYTHONPATH=.scratch/s35/form4_noconv/src FLASHTILE_GLUON_BWD_DQ_LAST=1 timeout 200 python3 .scratch/s35/warm.py no yes > $OUT/warm-noconv.log 2>&1) &
PYTHONPATH=$T/src OMP_NUM_THREADS=2 timeout 330 python3 -m pytest -q -p no:cacheprovider -n 8 --timeout=300 $T/tests/test_gluon.py -m gpu -k "DQ_LAST or dq-last" > $OUT/tests.log 2>&1
echo "tests: $(tail -n 1 $OUT/tests.log)"
wait
echo "tests $(( $(date +%s) - start )) s" > $OUT/times.txt
for v in off on noconv; do
  tree=$T; on=1; [ $v = off ] && on=0; [ $v = noconv ] && tree=.scratch/s35/form4_noconv
  PYTHONPATH=$tree/src FLASHTILE_GLUON_BWD_DQ_LAST=$on timeout 90 python3 -m flashtile bench --headdims 64 128 --seqlens 1k \
    --causal both --modes bwd --providers flashtile --rounds 2 > $OUT/bench-$v.log 2>&1
  echo "== $v"; grep "│" $OUT/bench-$v.log | grep -v " s │" | grep "1k"
done | tee $OUT/table.txt
echo "total $(( $(date +%s) - start )) s" >> $OUT/times.txt
cat $OUT/times.txt
