# session 35, call 4: programmatic dependent launch for the five-product backward's three launches (working tree), triton 3.6
set -u
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader > $OUT/times.txt
start=$(date +%s)
SEL="fused or deterministic or backward or same_bits or replay or by_default"
OMP_NUM_THREADS=2 PYTHONPATH=$PWD/src:$PWD timeout 280 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 12 \
  --timeout=250 -m gpu tests/test_gluon.py -k "$SEL" > $OUT/tests-fused.log 2>&1
echo "tests: $(tail -n 1 $OUT/tests-fused.log)"
echo "tests $(( $(date +%s) - start )) s" >> $OUT/times.txt
PYTHONPATH=$PWD/src timeout 200 python3 benchmarks/probes/pdl_ab.py --headdims 64 128 --rounds 3 > $OUT/pdl-ab.log 2>&1
cat $OUT/pdl-ab.log
for pass in 1 2; do for on in 0 1; do
  PYTHONPATH=$PWD/src FLASHTILE_GLUON_BWD_PDL=$on timeout 60 python3 -m flashtile bench --headdims 64 128 --seqlens 1k \
    --causal both --modes bwd --providers flashtile --rounds 2 > $OUT/bench-pdl$on-pass$pass.log 2>&1
  echo "== PDL=$on pass $pass"; grep "│" $OUT/bench-pdl$on-pass$pass.log | grep -v " s │" | grep "1k"
done; done | tee $OUT/table.txt
echo "total $(( $(date +%s) - start )) s" >> $OUT/times.txt
cat $OUT/times.txt
