# session 35, call 1: the dQ warp's conversion taken apart (branch dq-last 96ee61e copies, .scratch/s35/v_*), triton 3.6
set -u
S=.scratch/s35
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
start=$(date +%s)
for v in v_on v_nofence v_nowait v_nocopy v_noloop v_nostore v_noconv v_who; do
  (PYTHONPATH=$S/$v/src FLASHTILE_GLUON_BWD_DQ_LAST=1 timeout 200 python3 $S/warm.py no yes > $OUT/warm-$v.log 2>&1 || echo "warm $v failed" >> $OUT/warm-fail.txt) &
done
PYTHONPATH=$S/v_on/src FLASHTILE_GLUON_BWD_DQ_LAST=0 timeout 200 python3 $S/warm.py no yes > $OUT/warm-off.log 2>&1
wait
echo "warm $(( $(date +%s) - start )) s" > $OUT/times.txt
PYTHONPATH=$S/v_who/src timeout 60 python3 $S/who.py > $OUT/who.log 2>&1
for v in off v_on v_nofence v_nowait v_nocopy v_noloop v_nostore v_noconv; do
  tree=$v; on=1; [ $v = off ] && { tree=v_on; on=0; }
  PYTHONPATH=$S/$tree/src FLASHTILE_GLUON_BWD_DQ_LAST=$on timeout 60 python3 -m flashtile bench --headdims 64 128 --seqlens 1k \
    --causal both --modes bwd --providers flashtile --rounds 2 > $OUT/bench-$v.log 2>&1
  echo "== $v"; grep "│" $OUT/bench-$v.log | grep -v " s │" | grep "1k"
done | tee $OUT/table.txt
echo "total $(( $(date +%s) - start )) s" >> $OUT/times.txt
cat $OUT/who.log; cat $OUT/times.txt; cat $OUT/warm-fail.txt 2>/dev/null
