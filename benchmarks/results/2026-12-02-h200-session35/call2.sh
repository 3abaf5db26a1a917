# session 35, call 2: form 3 (a designated converter a Q tile, key tiles handed by the loader), triton 3.6
set -u
T=.scratch/s35/form3
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
start=$(date +%s)
PYTHONPATH=$T/src OMP_NUM_THREADS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 --timeout=150 $T/tests/test_gluon.py -m gpu -k "DQ_LAST or dq-last" > $OUT/tests.log 2>&1
echo "tests: $(tail -n 1 $OUT/tests.log)"
echo "tests $(( $(date +%s) - start )) s" > $OUT/times.txt
for on in 0 1; do
  PYTHONPATH=$T/src FLASHTILE_GLUON_BWD_DQ_LAST=$on timeout 90 python3 -m flashtile bench --headdims 64 128 --seqlens 1k \
    --causal both --modes bwd --providers flashtile --rounds 2 > $OUT/bench-dq-last$on.log 2>&1
  echo "== DQ_LAST=$on"; grep "│" $OUT/bench-dq-last$on.log | grep -v " s │" | grep "1k"
done | tee $OUT/table.txt
echo "total $(( $(date +%s) - start )) s" >> $OUT/times.txt
cat $OUT/times.txt
