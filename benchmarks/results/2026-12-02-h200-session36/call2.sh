# For the next device time (written in session 35, not yet run): attempt 83's parts, kernels of the
# 1k backward in CUDA graphs, each tree twice in turn. Carry .scratch/s35. Trees: main's src (off),
# branch early-dq 0713665 (v83/early), and make_v83.py's copies of it.
set -u
for pass in 1 2; do
  for tree in main early one_per_wg count_only pdl_only; do
    src=$PWD/.scratch/s35/v83/$tree/src; [ $tree = main ] && src=$PWD/src
    PYTHONPATH=$src timeout 90 python3 .scratch/s35/graph_cells.py $tree 2>&1 | grep "µs"
  done
done | tee $OUT/v83.log
