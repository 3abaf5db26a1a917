# session 35, call 5: the persistent non-causal 1k backward's last round (main 7829519's kernels), triton 3.6
set -u
PYTHONPATH=$PWD/src timeout 300 python3 benchmarks/probes/persistent_tail.py --rounds 3 > $OUT/persistent-tail.log 2>&1
cat $OUT/persistent-tail.log
