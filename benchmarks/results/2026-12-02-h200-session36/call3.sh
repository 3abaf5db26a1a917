# session 36, call 3: attempt 84's cost taken apart (make_v84.py's copies, timing only), kernels of the 1k backward in CUDA graphs
set -u
for pass in 1 2; do
  for tree in own0 own1 nocompute noload hop; do
    src=$PWD/.scratch/s36/v84/$tree/src; on=1
    case $tree in own0) src=$PWD/.scratch/s36/own/src; on=0;; own1) src=$PWD/.scratch/s36/own/src;; esac
    FLASHTILE_GLUON_BWD_OWN_DELTA=$on PYTHONPATH=$src timeout 60 python3 .scratch/s36/graph_cells.py $tree 2>&1 | grep -E "µs|Error" | tail -n 5
  done
done | tee $OUT/v84.log
