# session 34: the dQ warp's variants under the carried Triton 3.9, non-causal and causal 1k through flashtile bench
export TRITON_BACKENDS_IN_TREE=1
for v in v_atomonly v_relaxed; do
  echo "== $v"
  for c in no yes; do
    PYTHONPATH=$PWD/.triton-parts/3.9.0/site:$PWD/.scratch/$v/src FLASHTILE_GLUON_BWD_DQ_LAST=1 timeout 100 \
      python3 -m flashtile bench --headdims 64 128 --seqlens 1k --causal $c --modes bwd --providers flashtile --rounds 3 2>&1 | grep "│" | grep -v " s │" | grep "1k"
  done
done
