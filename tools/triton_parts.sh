#!/usr/bin/env bash
# A newer Triton for the GPU machine, whose image has triton 3.6: the kernels must also run with
# the newest release, and Triton 3.8+ brings Gluon's TMA reduction (tma.async_atomic_add). Its
# wheel (270 MiB) is past what one device call carries (64 MiB with the working tree), so it
# travels in parts, one per call, each kept on the machine between calls while it stays warm
# (ignored paths not named in a later call's carry stay where they are).
#
#   bash tools/triton_parts.sh pack 3.9.0     # here: .triton-parts/3.9.0/part-aa, -ab, -ac (48 + 48 +
#                                             # 13 MiB for 3.9.0) and SHA256SUMS (~2 minutes of xz)
#   then device calls back to back (the machine goes back after 30 s idle), each carrying one part
#   beside the working tree (8.6 MiB in session 28, when 54 MiB beside it passed and 55 was turned
#   away as over the limit):
#     run(command="ls -l .triton-parts/3.9.0", carry=[".triton-parts/3.9.0/part-aa"])
#     run(command="ls -l .triton-parts/3.9.0", carry=[".triton-parts/3.9.0/part-ab"])
#     run(command="bash benchmarks/gpu_final.sh triton39",   # unpacks, then the Gluon GPU tests
#         carry=[".triton-parts/3.9.0/part-ac", ".triton-parts/3.9.0/SHA256SUMS"])
#   bash tools/triton_parts.sh unpack 3.9.0   # there: checks the parts, installs into
#                                             # .triton-parts/3.9.0/site; then
#   TRITON_BACKENDS_IN_TREE=1 PYTHONPATH=$PWD/.triton-parts/3.9.0/site:$PWD/src python3 ...
#
# Only what runs kernels on Hopper is packed: the AMD backend, the profiler libraries (cupti)
# and the ptxas for GPUs before sm_90 are left out, so TRITON_BACKENDS_IN_TREE=1 must be set
# (Triton then looks for backends in its own folder, not in every installed Triton's entry
# points, which name the AMD one). torch.compile (FlexAttention) is not expected to work with a
# Triton newer than the one torch was built with; flashtile's own kernels are.
set -euo pipefail
mode=${1:?pack or unpack}
version=${2:?a Triton version, e.g. 3.9.0}
dir=.triton-parts/$version
part_size=${PART_SIZE:-48m}  # with the working tree (8.6 MiB in session 28) under what a call carries

case $mode in
  pack)
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 -d "$work" "triton==$version"
    (cd "$work" && unzip -q triton-*.whl && rm triton-*.whl)
    # (3.9 compiles sm_90 with the binary it names ptxas-blackwell; the other ptxas is for older GPUs)
    rm -rf "$work"/triton/backends/amd "$work"/triton/backends/nvidia/lib/cupti* \
      "$work"/triton/backends/nvidia/bin/ptxas
    rm -rf "$dir" && mkdir -p "$dir"
    tar -C "$work" -cf - triton "triton-$version.dist-info" | xz -T0 -6 | split -b "$part_size" - "$dir/part-"
    (cd "$dir" && sha256sum part-* > SHA256SUMS)
    ls -l "$dir" ;;
  unpack)
    (cd "$dir" && sha256sum -c --quiet SHA256SUMS)
    rm -rf "$dir/site" && mkdir -p "$dir/site"
    cat "$dir"/part-* | xz -d | tar -x -C "$dir/site"
    TRITON_BACKENDS_IN_TREE=1 PYTHONPATH="$dir/site" python3 -c \
      "import triton; print('triton', triton.__version__, 'from', triton.__file__)" ;;
  *)
    echo "usage: $0 pack|unpack VERSION" >&2; exit 2 ;;
esac
