# session 35, call 6: the cost of waiting for a key tile's dQ reductions to be written, once a key tile (timing), triton 3.6
set -u
for pass in 1 2; do
  for tree in main tailwait; do
    src=$PWD/src; [ $tree = tailwait ] && src=$PWD/.scratch/s35/tailwait/src
    PYTHONPATH=$src timeout 120 python3 .scratch/s35/graph_cells.py $tree 2>&1 | grep "µs"
  done
done | tee $OUT/tailwait.log
