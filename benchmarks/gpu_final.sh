#!/usr/bin/env bash
# The GPU check of a whole tree, in three device calls that each fit the 10-minute limit:
#   bash benchmarks/gpu_final.sh tests   # every test file on the GPU (gpu-marked ones included);
#                                        # TESTS="tests/a.py tests/b.py" picks files or node ids;
#                                        # the whole suite takes three calls now: tests-a, tests-b, tests-c
#   bash benchmarks/gpu_final.sh bench   # speed, decode bandwidth, variants, masks, memory, sanitizer
#   bash benchmarks/gpu_final.sh extra   # old-vs-new speed (OLD_SRC), ring attention (2 GPUs)
#   bash benchmarks/gpu_final.sh io      # the IO model against Nsight Compute's DRAM bytes
#   bash benchmarks/gpu_final.sh verify  # host time per call, the speed grid 1k-16k (FA2, cuDNN), decode,
#                                        # variants (varlen included), masks, backward kernel times: 8 files, ~230 s;
#                                        # OLD_SRC (a src/ tree, as for extra) adds kernel times and masks of it;
#                                        # TMA_AB=1 adds the grid with FLASHTILE_TMA=1
#   bash benchmarks/gpu_final.sh checks  # compute-sanitizer, and the Hypothesis GPU property test on GPU 1
#   bash benchmarks/gpu_final.sh gluon   # the Gluon Hopper forward (FLASHTILE_GLUON=1): its GPU tests, then the
#                                        # d64/d128/d256 grid at 1k, 4k, 16k with both Gluon kernels forced on and
#                                        # both off beside FA2 and cuDNN; ~450 s
#   bash benchmarks/gpu_final.sh gluon-bwd  # the Gluon backward probe (benchmarks/probes/gluon_bwd): its oracle
#                                        # cases against autograd, its timing beside SDPA, then the library's
#                                        # backward grid (tests/test_gluon.py -k backward); ~300 s
#   bash benchmarks/gpu_final.sh triton39   # every Gluon GPU test, then probes/fused_bwd.py (five products
#                                        # against seven), under Triton 3.9 carried by tools/triton_parts.sh
#   bash benchmarks/gpu_final.sh fused39    # the five-product backward under Triton 3.9 (carried as for triton39):
#                                        # its GPU tests and the seven-product ones, probes/fused_bwd.py,
#                                        # flashtile bench d128 (fused forced) beside cuDNN and FA2, then
#                                        # racecheck of the fused kernel; ~450 s
#   bash benchmarks/gpu_final.sh fused36    # the same under the image's Triton 3.6, the reduction a TMA store
#                                        # rewritten in the PTX (kernels/tma_reduce_ptx.py); ~560 s
#   bash benchmarks/gpu_final.sh fast-launch  # probes/fast_launch.py (host time, compiled-kernel path on/off),
#                                        # the whole speed grid with Flex, the d40 padded rows; ~400 s
#   bash benchmarks/gpu_final.sh launch39   # under Triton 3.9 (carried as for fused39): Gluon backward GPU tests,
#                                        # probes/fast_launch.py, the fused kernel's d64 tile sweep; ~350 s
#   bash benchmarks/gpu_final.sh fwd-ab     # a Gluon forward branch's gate (fwd-ffma): forward GPU tests, then the
#                                        # forward sweep on this tree and on OLD_SRC (main's src/); ~250 s
#   bash benchmarks/gpu_final.sh d256-bwd   # branch wide-pipe's gate: the d256 backward GPU tests, then its sweep
#                                        # on this tree and on OLD_SRC (main's src/); ~150 s
#   bash benchmarks/gpu_final.sh padded     # branch gluon-padded's gate: d40/d96/d192 Gluon GPU tests, then
#                                        # probes/padded_head_dims.py; ~200 s
#   bash benchmarks/gpu_final.sh listed     # the block-sparse Gluon kernels: their GPU tests, masks.py under auto
#                                        # (Flex beside), then with every Gluon kernel off; ~350 s
#   bash benchmarks/gpu_final.sh dq-stats   # the dQ kernels' own row stats (FLASHTILE_GLUON_DQ_STATS=1): the Gluon
#                                        # backward's GPU tests with it on, then probes/backward_ab.py 0 vs 1; ~450 s
#   bash benchmarks/gpu_final.sh tree-ab    # flashtile bench's 1k causal cells (d128, d256) of OLD_SRC and this tree,
#                                        # alternating twice, FA2 beside: host-bound cells across trees; ~200 s
#   bash benchmarks/gpu_final.sh fwd3       # attempts 48 and 60: the d64 forward on three consumer warpgroups: its GPU
#                                        # tests, probes/fwd_consumers.py, the d64 forward bench; ~480 s
#   bash benchmarks/gpu_final.sh dead-tiles # session 26: the forward's consumers skip K/V tiles none of their rows
#                                        # sees: d64 forward GPU tests, probes/fwd_tree_ab.py (OLD_SRC against
#                                        # this tree, CUDA graphs), the d64 forward bench; ~400 s
#   bash benchmarks/gpu_final.sh dead-tiles-wide  # the same at d128 and d256 (two consumers); ~250 s
#   bash benchmarks/gpu_final.sh lead-parts # attempt 67: a causal head's overhanging Q parts moved to its first
#                                        # tile: probes/fwd_tree_ab.py OLD_SRC against this tree (d64, d128),
#                                        # then the forward's GPU tests (FORWARD_SELECTION); ~300 s
#   bash benchmarks/gpu_final.sh bwd-vs-graph  # the 1k and 4k backward cells at d64 and d128 as CUDA graphs, eagerly
#                                        # and through the API (probes/bench_vs_graph.py --backward); ~150 s
#   bash benchmarks/gpu_final.sh bwd-1k     # session 31's last call: the persistent five-product GPU tests, the
#                                        # backward's auto-dispatch and replay tests, then flashtile bench's 1k
#                                        # cells at d64 and d128 beside FA2 and cuDNN in 3 rounds; ~250 s
#   bash benchmarks/gpu_final.sh fused-persistent  # attempt 76: the five-product backward on persistent programs
#                                        # (FLASHTILE_GLUON_BWD_PERSISTENT=1): its GPU tests and the fused ones with
#                                        # it forced (attempts 78 and 79 too), then probes/fused_persistent.py (seven /
#                                        # tile / persistent / lean: attempt 78 / dynamic: attempt 79); ~500 s
#   bash benchmarks/gpu_final.sh forward39  # the forward's GPU tests and probes/fwd_in_turn_check.py under a
#                                        # carried Triton (3.9.0 unless TRITON_VERSION), as triton39; ~300 s
#   bash benchmarks/gpu_final.sh four       # attempt 69: the d64 forward on four consumer warpgroups: the consumers
#                                        # probe (--four) and its GPU tests; ~450 s
#   bash benchmarks/gpu_final.sh forward-grid # session 27's last call: the forward's GPU tests (every d64 one, the
#                                        # causal ones at the other head dims; FORWARD_SELECTION="..." picks
#                                        # others, as session 30's non-causal ones), then the speed table's grid; ~400 s
#   bash benchmarks/gpu_final.sh defer-dk   # attempt 66: the fused backward's dK product in flight through the
#                                        # consumers' meeting: its GPU tests forced on, probes/defer_dk.py; ~250 s
#   bash benchmarks/gpu_final.sh preprocess-zeroes # session 33: the preprocess zeroes the dQ sum and counter: the
#                                        # backward's GPU tests, api_backward_profile.py on this tree and
#                                        # OLD_SRC, the d128 16k targets and the 1k cells in rounds; ~450 s
#   bash benchmarks/gpu_final.sh targets    # the d128 16k cells of the cuDNN target, flashtile beside cuDNN, FA2
#                                        # and Flex, as medians of 5 interleaved rounds (flashtile bench --rounds);
#                                        # ~150 s
#   bash benchmarks/gpu_final.sh tail       # the fused backward's tail split (FLASHTILE_GLUON_BWD_TAIL, written in
#                                        # session 20 after its device time): its GPU tests, then
#                                        # probes/fused_tail.py (oracle, then 0 against 1 in CUDA graphs); ~200 s
#   bash benchmarks/gpu_final.sh causal-gap # the causal five-product backward's extra time (session 20): the fixed
#                                        # cost per program (probes/fused_program_cost.py, d128 and d64), the
#                                        # causal schedule without the causal code (probes/causal_schedule_only.py),
#                                        # then Nsight Compute's stall statistics of probes/fused_bwd_ncu.py; ~420 s
#   bash benchmarks/gpu_final.sh timeline   # probes/step_timeline.py: each kernel of an eager document-mask step,
#                                        # its start, length and the GPU's idle gap before it; ~60 s
#   bash benchmarks/gpu_final.sh gluon-all  # every Gluon GPU test (grids, auto dispatch, CUDA graph), then the
#                                        # d128 1k and 16k bench cells beside cuDNN with the Gluon backward forced
#                                        # on; ~420 s (the sanitizer's Gluon section runs in `checks`)
#   bash benchmarks/gpu_final.sh probes  # the five-product backward against the seven-product one (needs
#                                        # Triton 3.8+, see fused39), then the Gluon config sweep
#                                        # (probes/gluon_sweep.py); ~400 s
#   bash benchmarks/gpu_final.sh dq-swizzle  # the fused backward's dQ staging box under the 32-byte swizzle: its
#                                        # GPU tests, probes/dq_swizzle.py (128/64/32/0 in turn), ncu's excess
#                                        # shared-memory wavefronts; ~300 s
#   bash benchmarks/gpu_final.sh auto-grid # a change of auto's picks (session 32): the GPU tests that run the
#                                        # backward's and the causal d64 forward's picks under auto, then the
#                                        # grid as `grid`; ~450 s
#   bash benchmarks/gpu_final.sh causal-1k # session 32's last call: the CUDA-graph replay tests, the 1k backward
#                                        # as a graph, eagerly and through the API (bench_vs_graph.py), the
#                                        # causal 1k cells in 3 rounds beside FA2 and cuDNN, and the d128 one on
#                                        # the seven-product kernels; ~350 s
#   bash benchmarks/gpu_final.sh dynamic-host # whether session 32's host cost belongs to the backward's dynamic
#                                        # scheduler: its GPU tests forced on, then probes/api_backward_profile.py
#                                        # in rotated rounds on this tree and (given) OLD_SRC, e.g. 620bcbc's src/
#                                        # whose counter is the dQ sum's extra row; ~300 s
#   bash benchmarks/gpu_final.sh branch-backward # a backward host-path branch's gate (BRANCH_DIR, its checkout
#                                        # carried): its GPU tests of the backward, then api_backward_profile.py
#                                        # on it and on this tree in turn; ~350 s
#   bash benchmarks/gpu_final.sh grid      # the speed table's grid, flashtile bench beside FA2, cuDNN, Flex; ~210 s
#   bash benchmarks/gpu_final.sh host      # short calls' host time: the replay tests, then probes/host_profile.py
#                                        # --calibrate at d128 and d256 (flashtile beside SDPA); ~90 s
#   bash benchmarks/gpu_final.sh host-path # session 23's host path: the GPU tests of the faces and the Gluon forward; ~300 s
#   bash benchmarks/gpu_final.sh host-ab   # OLD_SRC against this tree, alternating three times: host us per causal
#                                        # forward with grad at d128 and d256, 1k, SDPA beside (host_profile.py); ~120 s
#   bash benchmarks/gpu_final.sh hoist     # attempt 56 at d64 and 1k (lse2 loaded during S^T): GPU tests with it
#                                        # forced, probes/hoist_stats.py d64 and d128, 1k-16k; ~200 s
#   bash benchmarks/gpu_final.sh exp-poly  # the fused backward with part of its exponentials on the FMA units
#                                        # (FLASHTILE_GLUON_BWD_EXP_POLY): GPU tests, probes/exp_poly.py; ~250 s
#   bash benchmarks/gpu_final.sh ncu-source  # ncu's per-instruction stalls and bank conflicts of the fused
#                                        # backward (non-causal, causal), summarised; ~60 s
#   bash benchmarks/gpu_final.sh ncu-fwd   # the same source view of the d64 Gluon forward (HEADDIM=...); ~60 s
#   bash benchmarks/gpu_final.sh spread    # attempt 74 (on under auto since session 30): the d64
#                                        # forward's timeline with the one-part tiles' programs traced, then
#                                        # probes/fwd_spread.py (0 against 1), then its GPU tests forced on; ~300 s
#   bash benchmarks/gpu_final.sh early-coords  # attempt 77 (on for causal d64 since session 32): the persistent forward's consumers
#                                        # read each item's coordinates from the loader: its GPU tests forced on
#                                        # (d64), the timeline at 1k with it off and on, then
#                                        # probes/fwd_early_coords.py (0 against 1, 7 rounds); ~200 s
#   bash benchmarks/gpu_final.sh loops   # block-mask loops (attempt 22: runs of full tiles): masks.py (Flex
#                                        # included), mask_tiles.py ranges (as built / run loop / tile by
#                                        # tile); the decode append kernel (attempt 23): launch_overhead.py's
#                                        # decode rows; masks.py and launch_overhead.py of OLD_SRC when
#                                        # given; ~5 files, ~300 s
# At most 8 files come back from a device call: each mode writes few (times.txt included).
# Logs under $OUT; a short summary is printed last.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
# An OLD_SRC that did not reach the device (git-ignored paths travel only when carried) would
# fail each A/B step late, after the new tree's steps used the call's time.
if [[ -n "${OLD_SRC:-}" && ! -d "$OLD_SRC/flashtile" ]]; then
  echo "OLD_SRC=$OLD_SRC holds no flashtile/: was it carried to this machine?" >&2; exit 2
fi
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 FLASHTILE_HYPOTHESIS_PROFILE=gpu
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
# step CMD...: run it and log its wall time to times.txt (the budget of each call is planned from these)
step() { local start=$SECONDS; "$@"; echo "$((SECONDS - start)) s  ${*:2:6}" >> "$OUT/times.txt"; }
# use_carried_triton VERSION: unpack the Triton that tools/triton_parts.sh carried here and put it
# first on PYTHONPATH for the rest of the mode (its version appended to gpu.txt); exits on failure.
use_carried_triton() {
  bash tools/triton_parts.sh unpack "$1" > "$OUT/triton-unpack.log" 2>&1 || { cat "$OUT/triton-unpack.log"; exit 1; }
  export TRITON_BACKENDS_IN_TREE=1 PYTHONPATH=$PWD/.triton-parts/$1/site:$PWD/src
  python3 -c "import triton; print('triton', triton.__version__)" >> "$OUT/gpu.txt"
}
# gluon_tests LOG LIMIT TIMEOUT PYTEST_ARGS...: a selection of the GPU tests on $WORKERS workers (12
# unless set), two torch threads each, the whole run under LIMIT seconds and each test under
# TIMEOUT; its output to $OUT/LOG. (PYTHONPATH: src/, or a carried Triton's site and src/.)
gluon_tests() {
  OMP_NUM_THREADS=2 PYTHONPATH=$PYTHONPATH:$PWD timeout "$2" python3 -m pytest -q -p no:cacheprovider \
    -p no:benchmark -n "${WORKERS:-12}" --timeout="$3" "${@:4}" > "$OUT/$1" 2>&1
}
# The backward's GPU tests the five-product kernel touches (its grid, the seven-product ones, the
# deterministic call, CUDA-graph replay, the auto rule): fused39's and launch39's selection.
FUSED_SELECTION="fused or deterministic or backward or same_bits or replay or by_default"
# The whole suite no longer fits one call (session 13: 1323 of 2111 tests in 470 s on 8 workers,
# about 5300 worker-seconds in all), nor two (session 14: tests-a, the two heaviest files, in 528
# s on 10 workers; the rest cut at 330 s after 1505 of 1698 tests on 12): tests-a runs the two
# heaviest files, tests-b the Gluon and TMA files, tests-c the rest.
HEAVY_TESTS="tests/test_kernels.py tests/test_properties.py"
GLUON_TESTS="tests/test_gluon.py tests/test_gluon_listed.py tests/test_tma.py"
# The dense forward's GPU tests a forward kernel change touches (session 27: 480 tests, ~150 s on 12
# workers): every d64 one, and the causal ones at the other head dims on the consumers auto picks.
FORWARD_SELECTION=${FORWARD_SELECTION:-"(forward_grid or three_consumers or persistent or overhang) and ((causal and not two-consumers) or d64)"}
# The faces' test files (the calls users make: attention(), SDPA, nn modules, the checked-call cache).
FACE_TESTS="tests/test_call_cache.py tests/test_api.py tests/test_sdpa.py tests/test_nn.py"
case ${1:-tests} in
  tests-a|tests-b|tests-c)
    case $1 in
      tests-a) files=$HEAVY_TESTS ;;
      tests-b) files=$GLUON_TESTS ;;
      tests-c) files=$(ls tests/test_*.py | grep -v -x -F -f <(tr ' ' '\n' <<< "$HEAVY_TESTS $GLUON_TESTS") \
               | tr '\n' ' ') ;;
    esac
    TESTS=$files bash "$0" tests ;;
  tests)
    # Results stream to report.tsv as each test ends (tools/stream_report.py), so a run cut
    # off by the time limit still names its failures. test_compile_check compiles for sm_90
    # on the CPU: CI's job, skipped here. Two torch threads per worker: 16 workers with a
    # thread per core each oversubscribed the CPUs and slowed the CPU-side tests 10-fold.
    # --dist load hands the tests out one per worker in collection order, which conftest.py
    # puts longest first on a GPU machine (the property shards).
    # Tests marked large_memory (tens of GB each) run alone afterwards: beside 15 other workers
    # two of them filled a GPU and made their neighbours fail with out-of-memory errors.
    run_tests() {
      OMP_NUM_THREADS=2 FLASHTILE_REPORT=$OUT/report.tsv PYTHONPATH=$PWD/src:$PWD timeout "$1" \
        python3 -m pytest -q -p no:cacheprovider -p no:benchmark -p tools.stream_report "${@:2}" \
        --timeout=300 --ignore=tests/test_compile_check.py --durations=30 ${TESTS:-tests/} >> "$OUT/tests.log" 2>&1
    }
    start=$SECONDS
    run_tests "${TEST_LIMIT:-520}" -n "${WORKERS:-8}" --dist load -m "not large_memory"
    run_tests $(( ${TEST_LIMIT:-520} + 60 - (SECONDS - start) )) -m large_memory
    cut -f1 "$OUT/report.tsv" | sort | uniq -c
    grep -v "^passed\|^skipped" "$OUT/report.tsv" | head -30
    sort -t$'\t' -k2 -rn "$OUT/report.tsv" | head -8 ;;
  bench)
    step env timeout 60 python3 benchmarks/speed_table.py --headdims 64 128 --seqlens 1024 16384 --json "$OUT/speed.json" \
      > "$OUT/speed.log" 2>&1
    step env timeout 90 python3 benchmarks/decode.py > "$OUT/decode.log" 2>&1
    step env timeout 100 python3 benchmarks/variants.py > "$OUT/variants.log" 2>&1
    step env timeout 150 python3 benchmarks/masks.py > "$OUT/masks.log" 2>&1
    step env timeout 50 python3 benchmarks/memory_scaling.py > "$OUT/memory.log" 2>&1
    tail -22 "$OUT/speed.log"; cat "$OUT/decode.log" "$OUT/variants.log" "$OUT/masks.log" "$OUT/memory.log"
    cat "$OUT/times.txt" ;;
  verify)
    # What needs the GPU after CPU-only changes: host time per call (dense, varlen, decode with
    # and without append), the speed grid d64/d128 N 1k-16k against FA2 and cuDNN in one run,
    # decode bandwidth (32:8 and 64:8 heads), the variants (varlen included) and the masks.
    step env timeout 90 python3 benchmarks/launch_overhead.py > "$OUT/launch.log" 2>&1
    step env timeout 200 python3 benchmarks/speed_table.py --headdims 64 128 --impls flashtile sdpa-flash sdpa-cudnn \
      --json "$OUT/speed.json" > "$OUT/speed.log" 2>&1
    if [[ -n "${TMA_AB:-}" ]]; then  # the grid again with K/V through tensor descriptors (kernels/tma.py)
      echo "== FLASHTILE_TMA=1" >> "$OUT/speed.log"
      step env FLASHTILE_TMA=1 FLASHTILE_GLUON=0 FLASHTILE_GLUON_BWD=0 timeout 120 python3 benchmarks/speed_table.py --headdims 64 128 --impls flashtile \
        sdpa-flash >> "$OUT/speed.log" 2>&1
    fi
    step env timeout 80 python3 benchmarks/decode.py --no-flex --batches 1 4 32 128 --heads 32 64 \
      > "$OUT/decode.log" 2>&1
    # Batch 32 with two splits (4 programs per SM) against one: does the paged cache's 78% rise?
    step env timeout 60 python3 benchmarks/decode.py --no-flex --batches 32 --heads 32 --programs-per-sm 4 \
      >> "$OUT/decode.log" 2>&1
    step env timeout 100 python3 benchmarks/variants.py > "$OUT/variants.log" 2>&1
    step env timeout 160 python3 benchmarks/masks.py > "$OUT/masks.log" 2>&1
    step env timeout 60 python3 benchmarks/kernel_times.py >> "$OUT/variants.log" 2>&1
    if [[ -n "${OLD_SRC:-}" ]]; then  # the same two on an older src/ tree (see extra), for an A/B in one call
      { echo "== OLD_SRC=$OLD_SRC"; } | tee -a "$OUT/variants.log" >> "$OUT/masks.log"
      step env PYTHONPATH="$OLD_SRC" timeout 60 python3 benchmarks/kernel_times.py >> "$OUT/variants.log" 2>&1
      step env PYTHONPATH="$OLD_SRC" timeout 120 python3 benchmarks/masks.py --no-flex >> "$OUT/masks.log" 2>&1
    fi
    cat "$OUT/launch.log"; grep -E -A20 "^== |  d causal" "$OUT/speed.log"; grep -v "Warn\|fn = " "$OUT/decode.log"
    cat "$OUT/variants.log"
    cat "$OUT/masks.log" "$OUT/times.txt" ;;
  loops)
    # Attempt 22 changes the block-mask kernels' full-tile loops only: the masks against the
    # built-in and Flex, the three ways of walking full tiles, and OLD_SRC's masks beside them.
    step env timeout 150 python3 benchmarks/masks.py > "$OUT/masks.log" 2>&1
    step env timeout 200 python3 benchmarks/mask_tiles.py ranges --headdims 128 --seqlens 16384 \
      > "$OUT/mask-tiles.log" 2>&1
    # decode with and without the append, batch 1 and 32: host / do_bench / CUDA-graph ms
    launch() { python3 benchmarks/launch_overhead.py --seqlen 1024 --varlen 2 1024 --decode-batches 1 32; }
    step env timeout 90 bash -c "$(declare -f launch); launch" > "$OUT/launch.log" 2>&1
    if [[ -n "${OLD_SRC:-}" ]]; then
      echo "== OLD_SRC=$OLD_SRC" | tee -a "$OUT/masks.log" >> "$OUT/launch.log"
      step env PYTHONPATH="$OLD_SRC" timeout 100 python3 benchmarks/masks.py --no-flex >> "$OUT/masks.log" 2>&1
      step env PYTHONPATH="$OLD_SRC" timeout 90 bash -c "$(declare -f launch); launch" >> "$OUT/launch.log" 2>&1
    fi
    cat "$OUT/masks.log" "$OUT/mask-tiles.log"; grep -E "^== |decode|case" "$OUT/launch.log"; cat "$OUT/times.txt" ;;
  gluon)
    # Its own grid, then test_kernels.py's other GPU tests (grid limits, 2^31 elements, torch.compile,
    # opcheck, large inputs) with the switch on.
    FLASHTILE_GLUON=1 WORKERS=${WORKERS:-8} gluon_tests tests-gluon.log "${TEST_LIMIT:-240}" 200 tests/test_gluon.py \
      tests/test_kernels.py -m gpu -k "gluon_forward or (not gluon and not gpu_grid)"
    echo "== FLASHTILE_GLUON=1 FLASHTILE_GLUON_BWD=1" > "$OUT/speed.log"
    step env FLASHTILE_GLUON=1 FLASHTILE_GLUON_BWD=1 timeout 180 python3 benchmarks/speed_table.py --headdims 64 128 256 --seqlens 1024 4096 16384 \
      --impls flashtile sdpa-flash sdpa-cudnn --json "$OUT/speed-gluon.json" >> "$OUT/speed.log" 2>&1
    echo "== FLASHTILE_GLUON=0 FLASHTILE_GLUON_BWD=0" >> "$OUT/speed.log"
    step env FLASHTILE_GLUON=0 FLASHTILE_GLUON_BWD=0 timeout 120 python3 benchmarks/speed_table.py --headdims 64 128 256 --seqlens 1024 4096 16384 --impls flashtile \
      >> "$OUT/speed.log" 2>&1
    tail -3 "$OUT/tests-gluon.log"; grep -E "^== |  d causal|^ *(64|128|256) " "$OUT/speed.log"; cat "$OUT/times.txt" ;;
  gluon-bwd)
    step timeout "${PROBE_LIMIT:-150}" python3 benchmarks/probes/gluon_bwd/check_bwd.py > "$OUT/gluon-bwd.log" 2>&1
    # The library's path (launch.py's hook, bwd.py's preprocess, bshd views, lengths whose last
    # tile has a warpgroup's half wholly past the end): the backward grid of tests/test_gluon.py.
    WORKERS=${WORKERS:-8} gluon_tests tests-gluon-bwd.log "${TEST_LIMIT:-240}" 300 tests/test_gluon.py -m gpu -k backward
    grep -v "Warn" "$OUT/gluon-bwd.log" | tail -40; tail -3 "$OUT/tests-gluon-bwd.log"; cat "$OUT/times.txt" ;;
  triton39)
    # The Gluon kernels under a newer Triton (TRITON_VERSION, default 3.9.0) carried in parts by
    # tools/triton_parts.sh (its comment says how; the last carrying call runs this mode): unpack,
    # every Gluon GPU test, then the five-product backward against the seven-product one; ~450 s.
    version=${TRITON_VERSION:-3.9.0}
    use_carried_triton "$version"
    gluon_tests "tests-gluon-$version.log" "${TEST_LIMIT:-240}" 200 tests/test_gluon.py -m gpu
    step timeout 200 python3 benchmarks/probes/fused_bwd.py > "$OUT/five-product-$version.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-gluon-$version.log"; grep -v "Warn" "$OUT/five-product-$version.log" | tail -20
    cat "$OUT/times.txt" ;;
  fwd-ab)
    # The merge gate of a branch that changes the Gluon forward (fwd-ffma: the softmax scale
    # folded into one FFMA per score): the forward grid, dispatch and replay tests, then
    # gluon_sweep's forward candidates as CUDA graphs on this tree and on OLD_SRC (main's src/,
    # carried); ~250 s.
    gluon_tests tests-fwd.log "${TEST_LIMIT:-120}" 100 tests/test_gluon.py -m gpu \
      -k "forward_grid or replay or by_default or leaves"
    step timeout 100 python3 benchmarks/probes/gluon_sweep.py --which fwd --headdims 128 64 256 > "$OUT/sweep-fwd.log" 2>&1
    if [[ -n "${OLD_SRC:-}" ]]; then
      echo "== OLD_SRC=$OLD_SRC" >> "$OUT/sweep-fwd.log"
      step env PYTHONPATH="$OLD_SRC" timeout 100 python3 benchmarks/probes/gluon_sweep.py --which fwd \
        --headdims 128 64 256 >> "$OUT/sweep-fwd.log" 2>&1
    fi
    tail -2 "$OUT/tests-fwd.log"; grep "^fwd\|^==" "$OUT/sweep-fwd.log"; cat "$OUT/times.txt" ;;
  d256-bwd)
    # The merge gate of branch wide-pipe (the wide dK/dV kernel issuing each next tile's first
    # product before waiting): the d256 backward GPU tests, then gluon_sweep's d256 backward
    # candidates as CUDA graphs on this tree and on OLD_SRC (main's src/, carried), ~150 s.
    gluon_tests tests-d256-bwd.log "${TEST_LIMIT:-100}" 60 tests/test_gluon.py -m gpu \
      -k "(backward_grid and d256) or (lse_gradient and 256) or (same_bits and 256) or (replay and 256)"
    step timeout 60 python3 benchmarks/probes/gluon_sweep.py --which bwd --headdims 256 > "$OUT/sweep-d256-bwd.log" 2>&1
    if [[ -n "${OLD_SRC:-}" ]]; then
      echo "== OLD_SRC=$OLD_SRC" >> "$OUT/sweep-d256-bwd.log"
      step env PYTHONPATH="$OLD_SRC" timeout 60 python3 benchmarks/probes/gluon_sweep.py --which bwd --headdims 256 \
        >> "$OUT/sweep-d256-bwd.log" 2>&1
    fi
    tail -2 "$OUT/tests-d256-bwd.log"; grep "^bwd\|^==" "$OUT/sweep-d256-bwd.log"; cat "$OUT/times.txt" ;;
  padded)
    # The merge gate of branch gluon-padded (head dims between 64, 128 and 256 on the next
    # kernel's width): the Gluon grids' d40/d96/d192 cases and the host-side tests, then
    # probes/padded_head_dims.py (oracle errors, Gluon against Triton through the API); ~200 s.
    gluon_tests tests-padded.log "${TEST_LIMIT:-120}" 100 tests/test_gluon.py -m gpu -k "d40 or d96 or d192"
    step timeout 150 python3 benchmarks/probes/padded_head_dims.py > "$OUT/padded.log" 2>&1
    tail -2 "$OUT/tests-padded.log"; grep -v "Warn" "$OUT/padded.log"; cat "$OUT/times.txt" ;;
  fused39|fused36)
    # gluon_bwd_fused.py adds dQ by TMA reductions: Gluon's own from Triton 3.8 (fused39: 3.9 comes
    # in parts, tools/triton_parts.sh), or under the image's 3.6 a TMA store that
    # tma_reduce_ptx.py rewrites into one (fused36). Flex is left out of the bench: torch.compile
    # is not expected to work with a Triton newer than torch's own.
    if [[ $1 == fused39 ]]; then
      version=${TRITON_VERSION:-3.9.0}
      use_carried_triton "$version"
    fi
    gluon_tests tests-fused.log "${TEST_LIMIT:-170}" 150 tests/test_gluon.py -m gpu -k "$FUSED_SELECTION"
    step timeout 140 python3 benchmarks/probes/fused_bwd.py --api > "$OUT/fused-probe.log" 2>&1
    # The bench with the fused kernel forced (auto leaves it off until hopper.FUSED_UNDER_AUTO),
    # then the race checker on it (its warpgroups share K's buffer and the dS buffers). 8 files.
    step env FLASHTILE_GLUON_BWD_FUSED=1 timeout 130 python3 -m flashtile bench --headdims 128 64 --seqlens 1k 4k 16k \
      --modes bwd --providers flashtile sdpa-cudnn sdpa-flash --json "$OUT/bench-fused.json" > "$OUT/bench-fused.log" 2>&1
    step env timeout 120 compute-sanitizer --tool racecheck python3 benchmarks/probes/sanitize_gluon_bwd.py \
      --headdim 128 --fused > "$OUT/racecheck-fused.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-fused.log"; grep -v "Warn\|leaked\|nanobind\|skipped remainder" "$OUT/fused-probe.log"
    grep -A20 "bwd: TFLOP" "$OUT/bench-fused.log"; grep -E "RACECHECK SUMMARY|sanitize:" "$OUT/racecheck-fused.log"
    cat "$OUT/times.txt" ;;
  fast-launch)
    # kernels/fast_launch.py: host time of short calls with the compiled-kernel path on and off
    # (outputs compared bit for bit first), the whole speed grid (docs/performance.md's table and
    # the README plot), then the d40 backward's Triton row that session 12's run did not reach.
    step timeout 200 python3 benchmarks/probes/fast_launch.py > "$OUT/fast-launch.log" 2>&1
    step timeout 300 python3 -m flashtile bench --headdims 64 128 256 --seqlens 1k 4k 16k \
      --providers flashtile sdpa-flash sdpa-cudnn flex --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
    step timeout 90 python3 benchmarks/probes/padded_head_dims.py --headdims 40 > "$OUT/padded-d40.log" 2>&1
    cat "$OUT/gpu.txt"; grep -v "Warn\|warn" "$OUT/fast-launch.log"; grep -v "Warn" "$OUT/bench.log" | tail -60
    grep -v "Warn" "$OUT/padded-d40.log" | tail -12; cat "$OUT/times.txt" ;;
  launch39)
    # Under Triton 3.9 (carried as for fused39): the Gluon backward's GPU tests through
    # kernels/fast_launch.py, its host-time A/B, then the fused kernel's d64 tile sweep.
    use_carried_triton "${TRITON_VERSION:-3.9.0}"
    gluon_tests tests-gluon39.log "${TEST_LIMIT:-170}" 150 tests/test_gluon.py -m gpu -k "$FUSED_SELECTION"
    step timeout 40 python3 benchmarks/probes/fast_launch.py --launch-only > "$OUT/fast-launch39.log" 2>&1
    step timeout "${SWEEP_LIMIT:-150}" python3 benchmarks/probes/fused_bwd.py --headdims 64 --tiles 64,128,2 64,128,3 128,128,2 \
      > "$OUT/fused-d64-tiles.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-gluon39.log"; grep -v "Warn\|warn" "$OUT/fast-launch39.log"
    grep -v "Warn\|warn\|leaked\|nanobind\|skipped remainder" "$OUT/fused-d64-tiles.log"; cat "$OUT/times.txt" ;;
  listed)
    # The block-sparse Gluon kernels (gluon_fwd._fwd_listed_kernel, gluon_bwd._dkdv_listed_kernel and
    # _dq_listed_kernel): their GPU tests; then masks.py under auto (the mask_mod rows on them where
    # hopper.LISTED_UNDER_AUTO, Flex beside) and with every Gluon kernel off (the same rows on the
    # Triton kernels, in the same run); ~350 s.
    gluon_tests tests-listed.log "${TEST_LIMIT:-200}" 200 tests/test_gluon_listed.py -m gpu
    step timeout 150 python3 benchmarks/masks.py > "$OUT/masks-auto.log" 2>&1
    step env FLASHTILE_GLUON=0 FLASHTILE_GLUON_BWD=0 timeout 100 python3 benchmarks/masks.py --no-flex \
      > "$OUT/masks-triton.log" 2>&1
    cat "$OUT/gpu.txt"; grep -E "passed|failed|error" "$OUT/tests-listed.log" | tail -12
    echo "== auto"; grep -v "Warn\|warn" "$OUT/masks-auto.log" | tail -20
    echo "== Gluon off"; grep -v "Warn\|warn" "$OUT/masks-triton.log" | tail -12; cat "$OUT/times.txt" ;;
  dq-stats)
    # The dQ kernels working out the backward's row stats (FLASHTILE_GLUON_DQ_STATS=1, off under
    # auto until this has run): the Gluon backward's GPU tests, the block-sparse ones and the
    # windows on block masks with it on, then probes/backward_ab.py (0 against 1 in one process:
    # gradients compared, then kernel time from CUDA graphs and eager step time); ~450 s.
    # The forward grid is left out (the switch does not touch the forward); the backward grid runs
    # again with the switch off, for the launch order (dQ before dK/dV) both settings now share.
    FLASHTILE_GLUON_DQ_STATS=1 gluon_tests tests-dq-stats.log "${TEST_LIMIT:-260}" 200 tests/test_gluon.py \
      tests/test_gluon_listed.py tests/test_window_block_mask.py -m gpu -k "not gluon_forward_grid"
    FLASHTILE_GLUON_DQ_STATS=0 gluon_tests tests-dq-stats-off.log 120 200 tests/test_gluon.py -m gpu \
      -k "gluon_backward_grid or lse_gradient or same_bits"
    step timeout 180 python3 benchmarks/probes/backward_ab.py --rounds 3 > "$OUT/backward-ab.log" 2>&1
    cat "$OUT/gpu.txt"; grep -E "passed|failed|error" "$OUT/tests-dq-stats.log" | tail -12
    echo "== switch off"; grep -E "passed|failed|error" "$OUT/tests-dq-stats-off.log" | tail -6
    tail -16 "$OUT/backward-ab.log"; cat "$OUT/times.txt" ;;
  host-path)
    # Session 23's leaner host path (a plain call's checks remembered in call_cache.py, the autograd
    # Function's six arguments, the dense forward's launch plans): the GPU tests of the faces and
    # of the Gluon forward (grids, auto dispatch, CUDA-graph replay, causal head groups); ~300 s.
    gluon_tests tests-host-path.log 150 120 $FACE_TESTS
    gluon_tests tests-host-path-gluon.log 240 200 tests/test_gluon.py -m gpu \
      -k "forward or replay or by_default or causal_grids"
    cat "$OUT/gpu.txt"; tail -n 3 "$OUT/tests-host-path.log" "$OUT/tests-host-path-gluon.log"; cat "$OUT/times.txt" ;;
  host-ab)
    # The host path of OLD_SRC against this tree's, alternating three times: probes/host_profile.py
    # --only-calibrate's host us per causal forward with grad at d128 and d256, 1k (each the median of 5
    # rounds), with SDPA flash and cuDNN timed beside as the machine's own yardstick; ~120 s.
    [[ -n "${OLD_SRC:-}" ]] || { echo "host-ab needs OLD_SRC (a src/ tree carried here)" >&2; exit 2; }
    for round in 1 2 3; do
      for tree in "$OLD_SRC" "$PWD/src"; do
        for d in 128 256; do
          echo "== round $round d$d, PYTHONPATH=$tree" >> "$OUT/host-ab.log"
          step env PYTHONPATH="$tree" timeout 60 python3 benchmarks/probes/host_profile.py --headdim "$d" \
            --only-calibrate >> "$OUT/host-ab.log" 2>&1
        done
      done
    done
    cat "$OUT/gpu.txt"; grep -E "^==|calibrate" "$OUT/host-ab.log"; cat "$OUT/times.txt" ;;
  tree-ab)
    # Host-bound cells of two trees, alternating in one call (session 18: the 1k causal backward at
    # d128 and d256 read 20-24% below session 16's while FA2 and cuDNN read as before): flashtile
    # bench's 1k causal cells on OLD_SRC, this tree, OLD_SRC, this tree, FA2 beside; ~200 s.
    [[ -n "${OLD_SRC:-}" ]] || { echo "tree-ab needs OLD_SRC (a src/ tree carried here)" >&2; exit 2; }
    for round in 1 2; do
      for tree in "$OLD_SRC" "$PWD/src"; do
        echo "== round $round, PYTHONPATH=$tree" >> "$OUT/tree-ab.log"
        step env PYTHONPATH="$tree" timeout 90 python3 -m flashtile bench --headdims 128 256 --seqlens 1k \
          --causal yes --providers flashtile sdpa-flash >> "$OUT/tree-ab.log" 2>&1
      done
    done
    grep -E "^== |│ *(128|256) " "$OUT/tree-ab.log"; cat "$OUT/times.txt" ;;
  fwd3)
    # Attempts 48 (session 19; session 20: 0.91-0.98x two consumers) and 60 (session 23: 128-key
    # tiles, each tile's products in turn): the d64 forward on three consumer warpgroups
    # (FLASHTILE_GLUON_FWD_CONSUMERS=3). Its GPU tests and the two-consumer forward grid they sit
    # beside, then probes/fwd_consumers.py (each variant against the oracle, then CUDA-graph
    # TFLOP/s against two consumers), then flashtile bench's d64 forward with three consumers
    # forced beside cuDNN and FA2; ~480 s.
    gluon_tests tests-fwd3.log "${TEST_LIMIT:-150}" 150 tests/test_gluon.py -m gpu -k "three_consumers or forward_grid"
    step timeout 240 python3 benchmarks/probes/fwd_consumers.py > "$OUT/fwd-consumers.log" 2>&1
    step env FLASHTILE_GLUON=1 FLASHTILE_GLUON_FWD_CONSUMERS=3 timeout 90 python3 -m flashtile bench --headdims 64 \
      --seqlens 1k 4k 16k --modes fwd --providers flashtile sdpa-cudnn sdpa-flash --json "$OUT/bench-fwd3.json" \
      > "$OUT/bench-fwd3.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-fwd3.log"; grep -v "Warn\|warn" "$OUT/fwd-consumers.log"
    grep -A12 "fwd: TFLOP" "$OUT/bench-fwd3.log"; cat "$OUT/times.txt" ;;
  dynamic)
    # Attempt 63 (written after session 24's device time): persistent programs on the dynamic
    # scheduler. Every persistent GPU test (fixed turns, dynamic; the shapes the review added),
    # then probes/fwd_persistent.py, causal and not, three rounds; ~400 s.
    # (--timeout-method=thread: a test stuck in a CUDA wait is named, which the signal method cannot do)
    gluon_tests tests-dynamic.log "${TEST_LIMIT:-200}" 150 tests/test_gluon.py -m gpu -k "persistent or dynamic" \
      --timeout-method=thread
    step timeout 300 python3 benchmarks/probes/fwd_persistent.py > "$OUT/fwd-dynamic.log" 2>&1
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-dynamic.log"; grep -v "Warn\|warn" "$OUT/fwd-dynamic.log"; cat "$OUT/times.txt" ;;
  auto-dynamic)
    # Session 25: persistent programs under auto for every causal forward (on the dynamic
    # scheduler) and non-causal d64 / d128 to 4k keys. The Gluon forward's GPU tests under auto
    # (grids, replay, auto dispatch, causal groups, the persistent and dynamic cases), then the
    # grid as in `grid`; ~500 s.
    gluon_tests tests-auto-dynamic.log 250 150 tests/test_gluon.py -m gpu \
      -k "forward or replay or by_default or causal_grids or persistent or dynamic" --timeout-method=thread
    tail -n 3 "$OUT/tests-auto-dynamic.log"
    OUT=$OUT bash "$0" grid ;;
  faces-grid)
    # After a change of what auto chooses: the faces' GPU tests (the calls users make, under auto),
    # then the grid as in `grid`; ~350 s.
    gluon_tests tests-faces.log 150 120 $FACE_TESTS
    tail -n 3 "$OUT/tests-faces.log"
    OUT=$OUT bash "$0" grid ;;
  early-kv)
    # Attempt 64 (session 25, after the grid): persistent programs of one Q buffer copying the next
    # tile's first K/V tiles before the wait for this one's output (hopper.PERSISTENT_EARLY_KV).
    # Its GPU tests (d128 and d256, fixed turns and dynamic), then probes/fwd_persistent.py at d256,
    # two rounds; ~150 s.
    gluon_tests tests-early-kv.log 90 80 tests/test_gluon.py -m gpu -k "early" --timeout-method=thread
    step timeout 100 python3 benchmarks/probes/fwd_persistent.py --headdims 256 --rounds 2 > "$OUT/fwd-early-kv.log" 2>&1
    tail -2 "$OUT/tests-early-kv.log"; grep -v "Warn\|warn" "$OUT/fwd-early-kv.log"; cat "$OUT/times.txt" ;;
  dead-tiles)
    # Attempt 65 (session 26): the dense forward's consumers skip the K/V tiles none of their rows
    # sees (a d64 Q tile's parts past the sequence's end; under CAUSAL the tiles past a part's own diagonal).
    # The d64 Gluon forward's GPU tests (grid, three consumers, persistent and dynamic), then
    # probes/fwd_tree_ab.py, OLD_SRC against this tree (CUDA graphs, 3 rounds), then flashtile
    # bench's d64 forward beside FA2, cuDNN and Flex; ~400 s.
    [[ -n "${OLD_SRC:-}" ]] || { echo "dead-tiles needs OLD_SRC (a src/ tree carried here)" >&2; exit 2; }
    gluon_tests tests-dead-tiles.log "${TEST_LIMIT:-180}" 150 tests/test_gluon.py -m gpu \
      -k "(forward_grid or three_consumers or persistent) and d64" --timeout-method=thread
    step timeout 240 python3 benchmarks/probes/fwd_tree_ab.py --trees "$OLD_SRC" "$PWD/src" --headdims 64 \
      > "$OUT/fwd-tree-ab.log" 2>&1
    step timeout 120 python3 -m flashtile bench --headdims 64 --seqlens 1k 4k 16k --modes fwd \
      --providers flashtile sdpa-flash sdpa-cudnn flex --json "$OUT/bench-d64-fwd.json" > "$OUT/bench-d64-fwd.log" 2>&1
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-dead-tiles.log"; grep -v "Warn\|warn" "$OUT/fwd-tree-ab.log" | tail -8
    grep -A12 "fwd: TFLOP" "$OUT/bench-d64-fwd.log"; cat "$OUT/times.txt" ;;
  lead-parts)
    # Attempt 67 (session 27): under CAUSAL a head's Q tiles start LEAD_PART-row parts before its first
    # row, so the parts that overhang its end sit in the tile that sees the fewest keys instead of the
    # one that sees the most (q_tile_of_program). The timing first (OLD_SRC against this tree, CUDA
    # graphs, 3 rounds: d64 1k-16k, d128 4k and 16k, whose epilogue's store branch changed), then the
    # forward's GPU tests (FORWARD_SELECTION).
    [[ -n "${OLD_SRC:-}" ]] || { echo "lead-parts needs OLD_SRC (a src/ tree carried here)" >&2; exit 2; }
    step timeout 200 python3 benchmarks/probes/fwd_tree_ab.py --trees "$OLD_SRC" "$PWD/src" --headdims 64 \
      > "$OUT/fwd-tree-ab.log" 2>&1
    step timeout 120 python3 benchmarks/probes/fwd_tree_ab.py --trees "$OLD_SRC" "$PWD/src" --headdims 128 \
      --seqlens 4096 16384 > "$OUT/fwd-tree-ab-d128.log" 2>&1
    gluon_tests tests-lead-parts.log "${TEST_LIMIT:-230}" 150 tests/test_gluon.py -m gpu \
      -k "$FORWARD_SELECTION" --timeout-method=thread
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-lead-parts.log"
    grep -v "Warn\|warn" "$OUT/fwd-tree-ab.log" | tail -8; grep -v "Warn\|warn" "$OUT/fwd-tree-ab-d128.log" | tail -5
    cat "$OUT/times.txt" ;;
  spread)
    # Attempt 74: persistent programs of a count coprime with a head's Q tiles (FLASHTILE_GLUON_FWD_SPREAD).
    # First the timeline at 1k with and without it (gluon_fwd traces programs 0-7, among them program 5,
    # which in fixed turns on 132 SMs takes only the heads' last tiles, one live part of three), then the
    # oracle and the timing (probes/fwd_spread.py), then the d64 forward's GPU tests with it forced on.
    for s in 0 1; do
      FLASHTILE_GLUON_FWD_SPREAD=$s step timeout 60 python3 benchmarks/probes/fwd_timeline.py --seqlens 1024 \
        --save "$OUT/stamps-spread$s" > "$OUT/timeline-spread$s.log" 2>&1
    done
    step timeout 200 python3 benchmarks/probes/fwd_spread.py > "$OUT/fwd-spread.log" 2>&1
    FLASHTILE_GLUON_FWD_SPREAD=1 gluon_tests tests-spread.log "${TEST_LIMIT:-150}" 150 tests/test_gluon.py -m gpu \
      -k "(forward_grid or three_consumers or persistent) and d64" --timeout-method=thread
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-spread.log"; grep -v "Warn\|warn" "$OUT/fwd-spread.log" | tail -6
    for s in 0 1; do grep "item to item" "$OUT/timeline-spread$s.log"; done
    cat "$OUT/times.txt" ;;
  early-coords)
    # Attempt 77: the consumers of persistent programs read each item's batch, head, first row and K/V
    # tiles from slots the loader fills beside its Q (FLASHTILE_GLUON_FWD_EARLY_COORDS), instead of
    # working them out between one item's output and the next one's first product. First its GPU
    # tests (the persistent and lead-part tests forced on; EARLY_COORDS_SELECTION picks others, e.g.
    # "early_coords" for every head dim), then the timeline at 1k with it off and on (the step to the
    # next item), then the oracle and the timing (probes/fwd_early_coords.py: d64, 1k 2k 4k, causal
    # and not, the settings in turn, ROUNDS rounds).
    gluon_tests tests-early-coords.log "${TEST_LIMIT:-100}" 150 tests/test_gluon.py -m gpu \
      -k "${EARLY_COORDS_SELECTION:-early_coords and (d64 or d40)}" --timeout-method=thread
    for s in 0 1; do
      FLASHTILE_GLUON_FWD_EARLY_COORDS=$s step timeout 60 python3 benchmarks/probes/fwd_timeline.py --seqlens 1024 \
        > "$OUT/timeline-early-coords$s.log" 2>&1
    done
    step timeout 150 python3 benchmarks/probes/fwd_early_coords.py --rounds "${ROUNDS:-7}" > "$OUT/fwd-early-coords.log" 2>&1
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-early-coords.log"; grep -v "Warn\|warn" "$OUT/fwd-early-coords.log" | tail -8
    for s in 0 1; do echo "== early coords $s"; grep "item to item\|item transition\|    to \|past its tiles" "$OUT/timeline-early-coords$s.log"; done
    cat "$OUT/times.txt" ;;
  bwd-vs-graph)
    # Where the 1k backward cells' time goes (session 28 wrote it; not yet run): probes/bench_vs_graph.py
    # --backward at d64 and d128, 1k and 4k keys: hopper.backward as a CUDA graph and eagerly, the
    # API's torch.autograd.grad as the bench calls it, FA2 beside; ~150 s.
    for d in 64 128; do
      step timeout 100 python3 benchmarks/probes/bench_vs_graph.py --backward --headdim "$d" \
        --seqlens 1024 4096 > "$OUT/bwd-vs-graph-d$d.log" 2>&1
    done
    cat "$OUT/gpu.txt"; for d in 64 128; do grep -v "Warn\|warn" "$OUT/bwd-vs-graph-d$d.log" | tail -7; done
    cat "$OUT/times.txt" ;;
  bwd-1k)
    # Attempt 76 under auto (persistent five-product programs at 1k rows but causal d128, the fused
    # kernel for d64 causal at every length): its GPU tests of many tiles a program and the backward's
    # auto dispatch, then the 1k cells beside FA2 and cuDNN, the providers in turn each round.
    gluon_tests tests-bwd-1k.log "${TEST_LIMIT:-120}" 120 tests/test_gluon.py -m gpu \
      -k "persistent_programs_matches or by_default or replay or lse_gradient"
    step timeout "${BENCH_LIMIT:-200}" python3 -m flashtile bench --headdims 64 128 --seqlens 1k --rounds 3 \
      --providers flashtile sdpa-flash sdpa-cudnn --json "$OUT/bench-1k.json" > "$OUT/bench-1k.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-bwd-1k.log"; grep -v "Warn\|warn" "$OUT/bench-1k.log" | tail -24
    cat "$OUT/times.txt" ;;
  fused-persistent)
    # Attempt 76: persistent five-product programs. The fused kernel's GPU tests with it forced on (the
    # grid, every switch setting, the LSE gradient) beside its own test of many tiles a program, which
    # build the variants; then the probe (its oracle checks, then seven / tile / persistent in turn,
    # kernels alone). Session 31's first call ran the probe first: its builds on a cold machine took
    # the whole 200 s.
    FLASHTILE_GLUON_BWD_PERSISTENT=1 gluon_tests tests-persistent.log "${TEST_LIMIT:-230}" 200 tests/test_gluon.py \
      -m gpu -k "${PERSISTENT_SELECTION:-fused_backward_grid or switch_setting or persistent_programs_matches or lse_gradient}"
    step timeout "${PROBE_LIMIT:-250}" python3 benchmarks/probes/fused_persistent.py ${PROBE_ARGS:-} \
      > "$OUT/fused-persistent.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-persistent.log"; grep -v "Warn\|warn" "$OUT/fused-persistent.log" | tail -14
    cat "$OUT/times.txt" ;;
  forward39)
    # The dense forward's GPU tests (FORWARD_SELECTION: Q in registers, four consumers) under a newer
    # Triton carried as for triton39, whose ptxas allocates the in-turn path's registers apart from
    # 3.6's; then probes/fwd_in_turn_check.py under it (session 28); ~300 s.
    version=${TRITON_VERSION:-3.9.0}
    use_carried_triton "$version"
    gluon_tests "tests-forward-$version.log" "${TEST_LIMIT:-260}" 150 tests/test_gluon.py -m gpu \
      -k "$FORWARD_SELECTION" --timeout-method=thread
    step timeout 120 python3 benchmarks/probes/fwd_in_turn_check.py > "$OUT/in-turn-check-$version.log" 2>&1
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-forward-$version.log"; grep -v "Warn\|warn" "$OUT/in-turn-check-$version.log"
    cat "$OUT/times.txt" ;;
  four)
    # Attempt 69 (session 28): the d64 forward on four consumer warpgroups (256-row tiles of 64-key
    # tiles, FLASHTILE_GLUON_FWD_CONSUMERS=4): probes/fwd_consumers.py --four (the oracle, then auto's
    # three against four in 2, 3 and 4 stages, CUDA graphs, 3 rounds), then its GPU tests; ~450 s.
    step timeout 280 python3 benchmarks/probes/fwd_consumers.py --four --seqlens ${SEQLENS:-512 1024 2048 4096 16384} \
      > "$OUT/fwd-four.log" 2>&1
    gluon_tests tests-four.log "${TEST_LIMIT:-200}" 150 tests/test_gluon.py -m gpu -k "four-consumers" \
      --timeout-method=thread
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-four.log"; grep -v "Warn\|warn" "$OUT/fwd-four.log" | tail -14
    cat "$OUT/times.txt" ;;
  forward-grid)
    # A forward kernel change's last check (session 27: attempts 67 and 68): the forward's GPU tests
    # (FORWARD_SELECTION), then the grid (as `grid`).
    gluon_tests tests-forward.log "${TEST_LIMIT:-200}" 150 tests/test_gluon.py -m gpu -k "$FORWARD_SELECTION" \
      --timeout-method=thread
    step timeout 330 python3 -m flashtile bench --headdims 64 128 256 --seqlens 1k 4k 16k \
      --providers flashtile sdpa-flash sdpa-cudnn flex --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-forward.log"; grep -v "Warn" "$OUT/bench.log" | tail -60
    cat "$OUT/times.txt" ;;
  dead-tiles-wide)
    # Attempt 65 on the two-consumer forward (d128, d256; each consumer still ran at least one tile),
    # session 26: measured within noise at d128 and 0.96-1.03x at d256, so not kept; the mode stays
    # for the next forward change there. The forward's GPU tests at the other head dims (grid,
    # persistent and dynamic), then probes/fwd_tree_ab.py at d128 and d256, OLD_SRC against this
    # tree; ~250 s.
    [[ -n "${OLD_SRC:-}" ]] || { echo "dead-tiles-wide needs OLD_SRC (a src/ tree carried here)" >&2; exit 2; }
    gluon_tests tests-dead-tiles-wide.log "${TEST_LIMIT:-150}" 150 tests/test_gluon.py -m gpu \
      -k "(forward_grid or persistent) and not d64 and not d40" --timeout-method=thread
    step timeout 240 python3 benchmarks/probes/fwd_tree_ab.py --trees "$OLD_SRC" "$PWD/src" --headdims 128 256 \
      > "$OUT/fwd-tree-ab-wide.log" 2>&1
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-dead-tiles-wide.log"; grep -v "Warn\|warn" "$OUT/fwd-tree-ab-wide.log" | tail -14
    cat "$OUT/times.txt" ;;
  defer-dk)
    # Attempt 66 (session 26): the five-product backward's dK product left in flight through the
    # consumers' meeting (FLASHTILE_GLUON_BWD_DEFER_DK). The fused backward's GPU tests with it
    # forced on, then probes/defer_dk.py (oracle, then 0 against 1 in CUDA graphs); ~250 s.
    FLASHTILE_GLUON_BWD_DEFER_DK=1 gluon_tests tests-defer-dk.log "${TEST_LIMIT:-120}" 100 tests/test_gluon.py -m gpu \
      -k "fused" --timeout-method=thread
    step timeout 200 python3 benchmarks/probes/defer_dk.py --headdims 64 128 --seqlens 4096 16384 \
      > "$OUT/defer-dk.log" 2>&1
    tail -2 "$OUT/tests-defer-dk.log"; grep -v "Warn\|warn" "$OUT/defer-dk.log" | tail -12; cat "$OUT/times.txt" ;;
  persistent)
    # Attempt 61 (session 24): the dense Gluon forward on persistent programs
    # (FLASHTILE_GLUON_FWD_PERSISTENT=1). Its GPU tests, then probes/fwd_persistent.py (each head
    # dim against the oracle, then CUDA-graph TFLOP/s against a program per tile), then flashtile
    # bench's forward with it and the Gluon forward forced (d64 1k runs Triton's under auto)
    # beside cuDNN and FA2; ~400 s.
    gluon_tests tests-persistent.log "${TEST_LIMIT:-150}" 150 tests/test_gluon.py -m gpu -k "persistent"
    step timeout 240 python3 benchmarks/probes/fwd_persistent.py > "$OUT/fwd-persistent.log" 2>&1
    step env FLASHTILE_GLUON=1 FLASHTILE_GLUON_FWD_PERSISTENT=1 timeout 120 python3 -m flashtile bench \
      --headdims 64 128 256 --seqlens 1k 4k --modes fwd --providers flashtile sdpa-cudnn sdpa-flash \
      --json "$OUT/bench-persistent.json" > "$OUT/bench-persistent.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-persistent.log"; grep -v "Warn\|warn" "$OUT/fwd-persistent.log"
    grep -A16 "fwd: TFLOP" "$OUT/bench-persistent.log"; cat "$OUT/times.txt" ;;
  tail)
    # The tail split: the last programs of a non-causal fused grid in parts (hopper.tail_split).
    gluon_tests tests-tail.log "${TEST_LIMIT:-150}" 150 tests/test_gluon.py -m gpu -k "tail_split or fused_backward_grid"
    step timeout 200 python3 benchmarks/probes/fused_tail.py > "$OUT/fused-tail.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-tail.log"; grep -v "Warn\|warn" "$OUT/fused-tail.log"; cat "$OUT/times.txt" ;;
  dq-swizzle)
    # The fused backward's float32 dQ staging box under the 32-byte swizzle (hopper.DQ_SUM_SWIZZLE;
    # session 21's ncu: 2-way bank conflicts on every store of it under 128): the fused GPU tests
    # with it, probes/dq_swizzle.py (oracle, then 128/64/32/0 timed in turn), and ncu's count of
    # excess shared-memory wavefronts under 32 (session 21 under 128: 134M of 1545M); ~300 s.
    FLASHTILE_GLUON_DQ_SWIZZLE=32 gluon_tests tests-swizzle.log "${TEST_LIMIT:-150}" 150 tests/test_gluon.py -m gpu \
      -k "$FUSED_SELECTION"
    step timeout 240 python3 benchmarks/probes/dq_swizzle.py > "$OUT/dq-swizzle.log" 2>&1
    step env FLASHTILE_GLUON_DQ_SWIZZLE=32 timeout 100 /usr/local/cuda/bin/ncu --target-processes all -k regex:_dkdv_dq \
      -c 1 --section SourceCounters python3 benchmarks/probes/fused_bwd_ncu.py > "$OUT/ncu-swizzle.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-swizzle.log"; grep -v "Warn\|warn" "$OUT/dq-swizzle.log"
    grep -i "excessive\|wavefronts" "$OUT/ncu-swizzle.log"; cat "$OUT/times.txt" ;;
  auto-grid)
    # A change of what auto picks (written in session 32 for causal persistent programs on the dynamic
    # scheduler and the causal d64 forward's early coordinates): the GPU tests that run the picks under
    # auto (the fused grid with persistence and the scheduler left to auto, the persistent tests, the
    # auto dispatch, CUDA-graph replay, the LSE gradient, the causal d64 forward grid), then the grid.
    gluon_tests tests-auto.log "${TEST_LIMIT:-220}" 200 tests/test_gluon.py -m gpu -k "${AUTO_SELECTION:-fused_backward_grid \
      or persistent_programs_matches or by_default or replay or lse_gradient or (gluon_forward_grid and d64 and causal)}"
    step timeout 400 python3 -m flashtile bench --headdims 64 128 256 --seqlens 1k 4k 16k \
      --providers flashtile sdpa-flash sdpa-cudnn flex --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-auto.log"; grep -v "Warn" "$OUT/bench.log" | tail -60; cat "$OUT/times.txt" ;;
  causal-1k)
    # The causal 1k cells, which read 11-52% below session 30's grid in session 32's (the other cells
    # within a few %): the replay tests (d128 on persistent programs from the dynamic scheduler in tree D),
    # where the backward's 1k time goes on this lease (CUDA graph / eager / API, FA2 beside), the
    # causal 1k cells in rounds, then the d128 backward cell with the seven-product kernels.
    WORKERS=3 gluon_tests tests-replay.log 120 100 tests/test_gluon.py -m gpu -k replay
    for d in 64 128; do
      step timeout 80 python3 benchmarks/probes/bench_vs_graph.py --backward --headdim "$d" --seqlens 1024 \
        > "$OUT/bwd-vs-graph-d$d.log" 2>&1
    done
    step timeout 150 python3 -m flashtile bench --headdims 64 128 256 --seqlens 1k --causal yes --rounds 3 \
      --providers flashtile sdpa-flash sdpa-cudnn --json "$OUT/bench-causal-1k.json" > "$OUT/bench-causal-1k.log" 2>&1
    FLASHTILE_GLUON_BWD_FUSED=0 step timeout 60 python3 -m flashtile bench --headdims 128 --seqlens 1k --causal yes \
      --modes bwd --rounds 3 --providers flashtile sdpa-flash > "$OUT/bench-seven.log" 2>&1
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-replay.log"
    for d in 64 128; do grep -v "Warn\|warn" "$OUT/bwd-vs-graph-d$d.log" | tail -5; done
    grep "│" "$OUT/bench-causal-1k.log" | head -9; grep "│" "$OUT/bench-seven.log" | head -2; cat "$OUT/times.txt" ;;
  dynamic-host)
    # Session 32 measured 160-235 µs more host time a backward call through autograd on the dynamic
    # scheduler, in one sample, the counter first, on a drifting lease. First the persistent tests with
    # the counter forced on (this tree's counter is an int32 of its own), then the probe in rotated
    # rounds (CPU time beside wall time, GC pauses, the allocator's events) on this tree and, given
    # OLD_SRC (a src/ tree carried here), on that one.
    FLASHTILE_GLUON_BWD_FUSED=1 FLASHTILE_GLUON_BWD_PERSISTENT=1 FLASHTILE_GLUON_BWD_DYNAMIC=1 \
      gluon_tests tests-dynamic.log "${TEST_LIMIT:-150}" 150 tests/test_gluon.py -m gpu \
      -k "${DYNAMIC_SELECTION:-persistent_programs_matches or fused_backward_grid}"
    for tree in "$PWD/src" ${OLD_SRC:+"$OLD_SRC"}; do
      name=$([[ $tree == "$PWD/src" ]] && echo this || echo old)
      step env PYTHONPATH="$tree" timeout "${PROBE_LIMIT:-120}" python3 benchmarks/probes/api_backward_profile.py \
        --headdims 64 128 --settings dynamic turns tile seven --rounds "${ROUNDS:-3}" --calls 200 \
        > "$OUT/api-backward-$name.log" 2>&1
    done
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-dynamic.log"
    for log in "$OUT"/api-backward-*.log; do echo "== $log"; grep "medians\|floor" "$log"; done
    cat "$OUT/times.txt" ;;
  branch-backward)
    # The merge gate of a branch that changes the dense backward's host path (bwd-plan, session 33:
    # a per-shape plan of its launches), BRANCH_DIR its checkout carried here: the branch's own GPU
    # tests of the backward (FUSED_SELECTION, the block-sparse file), then
    # probes/api_backward_profile.py on the branch and on this tree in turn, twice (causal 1k, d64 and
    # d128, auto / tile / seven): the host's µs a call and do_bench's time through autograd; ~350 s.
    [[ -d "${BRANCH_DIR:-}/src/flashtile" ]] || { echo "branch-backward needs BRANCH_DIR (a checkout carried here)" >&2; exit 2; }
    (cd "$BRANCH_DIR" && PYTHONPATH=$PWD/src OUT=$OUT gluon_tests tests-branch.log "${TEST_LIMIT:-200}" 150 \
      tests/test_gluon.py tests/test_gluon_listed.py -m gpu -k "$FUSED_SELECTION or plan")
    for round in 1 2; do
      for tree in "$BRANCH_DIR/src" "$PWD/src"; do
        echo "== round $round PYTHONPATH=$tree" >> "$OUT/api-backward-ab.log"
        step env PYTHONPATH="$tree" timeout "${PROBE_LIMIT:-70}" python3 benchmarks/probes/api_backward_profile.py \
          --headdims 64 128 --settings auto tile seven --rounds 2 --calls 200 >> "$OUT/api-backward-ab.log" 2>&1
      done
    done
    cat "$OUT/gpu.txt"; tail -2 "$OUT/tests-branch.log"; grep "^== \|medians\|floor" "$OUT/api-backward-ab.log"
    cat "$OUT/times.txt" ;;
  grid)
    # The speed table's grid (docs/performance.md's current table, the README plot): d64, d128,
    # d256 at 1k, 4k, 16k beside FA2, cuDNN and FlexAttention; ~210 s.
    step timeout 400 python3 -m flashtile bench --headdims 64 128 256 --seqlens 1k 4k 16k \
      --providers flashtile sdpa-flash sdpa-cudnn flex --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
    cat "$OUT/gpu.txt"; grep -v "Warn" "$OUT/bench.log" | tail -60; cat "$OUT/times.txt" ;;
  host)
    # Short calls' host time (session 22: the causal 1k cells are host-bound on this machine): the
    # replay tests first (their five-product check, written after session 22's device time), then
    # probes/host_profile.py --calibrate at d128 and d256 (flashtile's forward with grad beside
    # SDPA's flash and cuDNN, then cProfile of each path); ~90 s.
    WORKERS=3 gluon_tests tests-replay.log 120 100 tests/test_gluon.py -m gpu -k replay
    for d in 128 256; do
      step timeout 100 python3 benchmarks/probes/host_profile.py --headdim "$d" --calls 40 --calibrate \
        > "$OUT/host-profile-d$d.log" 2>&1
    done
    cat "$OUT/gpu.txt"; tail -n 2 "$OUT/tests-replay.log"; grep -h "calibrate\|=====" "$OUT"/host-profile-d*.log
    cat "$OUT/times.txt" ;;
  hoist)
    # Attempt 56 where it was not timed: each step's lse2 row loaded during its S^T product at d64
    # (it spills there: 48 -> 128 bytes of stack) and at 1k, beside d128; the fused GPU tests with
    # it forced at every head dim first; ~200 s.
    FLASHTILE_GLUON_BWD_HOIST_STATS=1 gluon_tests tests-hoist.log "${TEST_LIMIT:-150}" 150 tests/test_gluon.py -m gpu \
      -k "$FUSED_SELECTION"
    step timeout 200 python3 benchmarks/probes/hoist_stats.py --headdims 64 128 --seqlens 1024 4096 16384 --rounds 5 \
      > "$OUT/hoist-stats.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-hoist.log"; grep -v "Warn\|warn" "$OUT/hoist-stats.log"; cat "$OUT/times.txt" ;;
  exp-poly)
    # Part of the fused backward's exponentials on the FMA units (kernels/exp2_split.py): its GPU
    # tests and the fused selection with 1 of 4 forced, then probes/exp_poly.py (0, 1, 2 in turn); ~250 s.
    FLASHTILE_GLUON_BWD_EXP_POLY=1 gluon_tests tests-exp-poly.log "${TEST_LIMIT:-170}" 150 tests/test_gluon.py -m gpu \
      -k "$FUSED_SELECTION"
    step timeout 300 python3 benchmarks/probes/exp_poly.py > "$OUT/exp-poly.log" 2>&1
    cat "$OUT/gpu.txt"; tail -3 "$OUT/tests-exp-poly.log"; grep -v "Warn\|warn" "$OUT/exp-poly.log"; cat "$OUT/times.txt" ;;
  ncu-source)
    # Nsight Compute's source view of the non-causal and causal fused kernels (d128 16k), per
    # SASS instruction: stall reasons and shared-memory wavefronts, summarised by
    # probes/ncu_source_summary.py (session 21: the dQ staging stores' 2-way bank conflicts); ~60 s.
    step timeout 300 /usr/local/cuda/bin/ncu --target-processes all -k regex:_dkdv_dq -c 2 --section SourceCounters \
      --section WarpStateStats --section InstructionStats -o "$OUT/fused" python3 benchmarks/probes/fused_bwd_ncu.py \
      > "$OUT/ncu.log" 2>&1
    /usr/local/cuda/bin/ncu -i "$OUT/fused.ncu-rep" --page source --csv --print-source sass > "$OUT/source.csv"
    python3 benchmarks/probes/ncu_source_summary.py "$OUT/source.csv" > "$OUT/source-summary.log" 2>&1
    gzip "$OUT/source.csv"; rm -f "$OUT/fused.ncu-rep"
    cat "$OUT/source-summary.log"; cat "$OUT/times.txt" ;;
  ncu-fwd)
    # The same source view of the d64 Gluon forward, non-causal and causal at 16k (HEADDIM to
    # change it), summarised by probes/ncu_source_summary.py; ~60 s.
    step timeout 300 /usr/local/cuda/bin/ncu --target-processes all -k regex:_fwd_pingpong -c 2 --section SourceCounters \
      --section WarpStateStats --section InstructionStats -o "$OUT/fwd" python3 benchmarks/probes/fwd_ncu.py \
      --headdim "${HEADDIM:-64}" > "$OUT/ncu.log" 2>&1
    /usr/local/cuda/bin/ncu -i "$OUT/fwd.ncu-rep" --page source --csv --print-source sass > "$OUT/source.csv"
    python3 benchmarks/probes/ncu_source_summary.py "$OUT/source.csv" > "$OUT/source-summary.log" 2>&1
    gzip "$OUT/source.csv"; rm -f "$OUT/fwd.ncu-rep"
    cat "$OUT/source-summary.log"; cat "$OUT/times.txt" ;;
  preprocess-zeroes)
    # Session 33: the backward's preprocess zeroes the five-product kernel's dQ sum and counter (two
    # fills' launches fewer). The backward's GPU tests (FUSED_SELECTION: grids, replay, dynamic
    # scheduler, auto) and the preprocess's own test on the GPU; probes/api_backward_profile.py
    # (causal 1k, auto / seven, rotated rounds) on this tree and on OLD_SRC (the tree before); the
    # d128 16k target cells in rounds (as `targets`); then the 1k cells in rounds; ~450 s.
    gluon_tests tests-zeroes.log "${TEST_LIMIT:-200}" 150 tests/test_gluon.py -m gpu -k "$FUSED_SELECTION"
    gluon_tests tests-zeroes-preprocess.log 60 60 tests/test_gluon.py -k "preprocess"
    for tree in "$PWD/src" ${OLD_SRC:+"$OLD_SRC"}; do
      echo "== PYTHONPATH=$tree" >> "$OUT/api-backward.log"
      step env PYTHONPATH="$tree" timeout "${PROBE_LIMIT:-70}" python3 benchmarks/probes/api_backward_profile.py \
        --headdims 64 128 --settings auto seven --rounds 3 --calls 200 >> "$OUT/api-backward.log" 2>&1
    done
    step timeout 200 python3 -m flashtile bench --headdims 128 --seqlens 16k --rounds "${ROUNDS:-5}" \
      --providers flashtile sdpa-cudnn sdpa-flash flex --json "$OUT/bench-targets.json" > "$OUT/bench-targets.log" 2>&1
    step timeout 150 python3 -m flashtile bench --headdims 64 128 256 --seqlens 1k --rounds 3 \
      --providers flashtile sdpa-flash sdpa-cudnn --json "$OUT/bench-1k.json" > "$OUT/bench-1k.log" 2>&1
    cat "$OUT/gpu.txt"; tail -n 2 "$OUT/tests-zeroes.log" "$OUT/tests-zeroes-preprocess.log"
    grep "^== \|medians\|floor\|preprocess\|Fill" "$OUT/api-backward.log"
    grep "│" "$OUT/bench-targets.log" | head -12; grep "│" "$OUT/bench-1k.log" | head -14; cat "$OUT/times.txt" ;;
  targets)
    # Session 20's single runs read these four cells at 0.98-1.02x cuDNN: at parity, one run's
    # order and drift decide. Five rounds, the providers in turn, each ratio the median of the
    # rounds' own ratios.
    step timeout 300 python3 -m flashtile bench --headdims 128 --seqlens 16k --rounds "${ROUNDS:-5}" \
      --providers flashtile sdpa-cudnn sdpa-flash flex --json "$OUT/bench-targets.json" > "$OUT/bench-targets.log" 2>&1
    cat "$OUT/gpu.txt"; grep -v "Warn\|warn" "$OUT/bench-targets.log" | tail -40; cat "$OUT/times.txt" ;;
  causal-gap)
    # Session 20: the fused kernel's causal time is 0.533 of its non-causal time against the
    # dispatch model's 0.497, not DRAM- or L2-bound (ncu). A program's fixed cost, fitted from
    # non-causal workloads of 8k and 16k keys cut into programs of different lengths; the
    # causal schedule without the causal code (a patched copy of src/); then where the warps wait.
    for d in 128 64; do
      step timeout 200 python3 benchmarks/probes/fused_program_cost.py --headdim "$d" >> "$OUT/program-cost.log" 2>&1
    done
    step timeout 150 python3 benchmarks/probes/causal_schedule_only.py > "$OUT/schedule-only.log" 2>&1
    step timeout 200 python3 benchmarks/probes/causal_program_cost.py > "$OUT/causal-cost.log" 2>&1
    step timeout 200 /usr/local/cuda/bin/ncu --target-processes all -k regex:_dkdv_dq -c 2 --section WarpStateStats \
      --section SchedulerStats --section SourceCounters python3 benchmarks/probes/fused_bwd_ncu.py \
      > "$OUT/ncu-stalls.log" 2>&1
    grep -v "Warn\|warn" "$OUT/program-cost.log"; grep -v "Warn\|warn" "$OUT/schedule-only.log"
    grep -v "Warn\|warn" "$OUT/causal-cost.log"; grep -E "_dkdv_dq|Stall|stall" "$OUT/ncu-stalls.log" | head -40
    cat "$OUT/times.txt" ;;
  timeline)
    # Where the GPU waits in an eager 16-document step (session 18: 0.69 ms of host, 0.75 ms of
    # kernels in a graph, 1.11 ms eager): probes/step_timeline.py, 16 and 4 documents; ~60 s.
    for docs in 16 4; do
      step timeout 120 python3 benchmarks/probes/step_timeline.py --docs "$docs" >> "$OUT/timeline.log" 2>&1
    done
    grep -v "Warn\|warn" "$OUT/timeline.log"; cat "$OUT/times.txt" ;;
  gluon-all)
    # ~220 tests; session 9 ran the forward's part in 175 s and the backward's in 41 s on 8 workers.
    gluon_tests tests-gluon-all.log "${TEST_LIMIT:-300}" 300 tests/test_gluon.py -m gpu
    # The Gluon backward forced on (auto takes it at d128 at every length since session 10), so
    # these cells time the Gluon path whatever auto's rule becomes.
    step env FLASHTILE_GLUON_BWD=1 timeout 120 python3 -m flashtile bench \
      --headdims 128 --seqlens 1k 16k --providers flashtile sdpa-cudnn sdpa-flash --json "$OUT/bench.json" \
      > "$OUT/bench.log" 2>&1
    tail -3 "$OUT/tests-gluon-all.log"
    grep -v "Warn" "$OUT/bench.log" | tail -30; cat "$OUT/times.txt" ;;
  probes)
    step timeout "${FUSED_LIMIT:-150}" python3 benchmarks/probes/fused_bwd.py > "$OUT/fused.log" 2>&1
    step timeout "${SWEEP_LIMIT:-300}" python3 benchmarks/probes/gluon_sweep.py > "$OUT/sweep.log" 2>&1
    grep -v "Warn" "$OUT/fused.log" | tail -30; grep -v "Warn" "$OUT/sweep.log"; cat "$OUT/times.txt" ;;
  checks)
    # The property test runs meanwhile, on the second GPU where there is one, its six shards
    # on six workers (compile-bound: most problems bring new kernels).
    last_gpu=$(( $(nvidia-smi -L | wc -l) - 1 ))
    (CUDA_VISIBLE_DEVICES=$last_gpu OMP_NUM_THREADS=2 PYTHONPATH=$PWD/src:$PWD timeout "${PROPERTY_LIMIT:-500}" \
      python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 8 --timeout=0 \
      tests/test_properties.py -m gpu > "$OUT/property.log" 2>&1) &
    CUDA_VISIBLE_DEVICES=0 step env timeout "${SANITIZE_LIMIT:-300}" compute-sanitizer --tool memcheck \
      python3 benchmarks/sanitize.py > "$OUT/sanitize.log" 2>&1
    wait
    grep -E "ERROR SUMMARY|sanitize:" "$OUT/sanitize.log"; tail -5 "$OUT/property.log"; cat "$OUT/times.txt" ;;
  extra)
    # Needs 2 GPUs (kind nvidia-h200-x2) for the ring. OLD_SRC (optional): a src/ tree of an
    # older commit, carried (git archive REV src | tar -x -C .old), timed beside this one.
    if [[ -n "${OLD_SRC:-}" ]]; then
      step env PYTHONPATH=$OLD_SRC timeout 60 python3 benchmarks/speed_table.py --headdims 128 --seqlens 1024 4096 \
        --impls flashtile sdpa-flash > "$OUT/speed-old.log" 2>&1
      step env timeout 60 python3 benchmarks/speed_table.py --headdims 128 --seqlens 1024 4096 --impls flashtile sdpa-flash \
        > "$OUT/speed-new.log" 2>&1
    fi
    step env timeout "${RING_LIMIT:-180}" torchrun --standalone --nproc_per_node=2 benchmarks/ring_attention.py --out "$OUT/ring.json" \
      > "$OUT/ring.log" 2>&1
    for f in speed-old speed-new; do [[ -f "$OUT/$f.log" ]] && { echo "== $f"; tail -6 "$OUT/$f.log"; }; done
    tail -12 "$OUT/ring.log"; cat "$OUT/times.txt" ;;
  io)
    step env timeout "${IO_LIMIT:-240}" python3 benchmarks/io_measure.py table --headdims 128 \
      --seqlens ${IO_SEQLENS:-1024 4096 16384} > "$OUT/io.log" 2>&1
    cat "$OUT/io.log" "$OUT/times.txt" ;;
esac
