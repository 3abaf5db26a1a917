"""An IO model: HBM bytes moved by standard attention and by the tiled algorithm.

FlashAttention's argument is about memory traffic, not arithmetic: both algorithms
do the same O(N²d) flops, but standard attention moves Θ(N·d + N²) bytes between HBM
and the chip while the tiled algorithm moves Θ(N²d²/M) for on-chip memory M
(Dao et al., 2022, Theorem 2). This module counts those bytes for one concrete
schedule of each, so that the argument can be plotted and compared with measured
DRAM traffic (docs/io-model.md).

Assumptions, shared by both counts:

- Non-causal attention, no dropout, seqlen_q = seqlen_k = N, one dtype of
  ``dtype_bytes`` bytes for Q, K, V, O, their gradients and (standard) S, P, dP, dS.
  Row statistics (LSE, D) are float32 (4 bytes).
- Every load an algorithm issues is an HBM read and every store an HBM write: no
  cache hits. Real GPUs keep part of the re-read K/V tiles in L2, so measured DRAM
  bytes of the tiled algorithm fall below this count; the model is the algorithm's
  own traffic, as in the paper's analysis.
- Each pass reads exactly the rows that exist (partial last tiles are not padded).
- Batch and heads multiply everything: each (batch, head) pair is independent.

Standard attention (the paper's Algorithms 0 and 3; :func:`flashtile.naive_attention`)
runs one kernel per line, each reading its operands from HBM once::

    forward                         reads          writes
      S = Q Kᵀ                      Q, K           S         (N×N)
      P = softmax(S)                S              P         (N×N)
      O = P V                       P, V           O
    backward (P saved by the forward)
      dV = Pᵀ dO                    P, dO          dV
      dP = dO Vᵀ                    dO, V          dP        (N×N)
      dS = P ∘ (dP − rowsum(P∘dP))  P, dP          dS        (N×N)
      dQ = dS K                     dS, K          dQ
      dK = dSᵀ Q                    dS, Q          dK

    forward:  reads 3Nd + 2N², writes Nd + 2N²     (elements)
    backward: reads 5Nd + 5N², writes 3Nd + 2N²

The tiled algorithm (flashtile's kernels, FlashAttention-2's schedule) with
T_m = ⌈N / BLOCK_M⌉ query tiles and T_n = ⌈N / BLOCK_N⌉ key tiles::

    forward  (_fwd_kernel: one program per Q tile, which stays on-chip; K and V stream past it)
      reads Q once and all of K, V once per Q tile      Nd + 2·T_m·Nd
      writes O and the LSE                              Nd  (+ 4N bytes)
    backward
      _bwd_preprocess: D = rowsum(dO ∘ O)       reads O, dO: 2Nd;  writes D: 4N bytes
      _bwd_dkdv_kernel: one program per K/V tile (K_j, V_j on-chip); Q, dO, LSE, D stream
        reads K, V once, Q and dO once per K/V tile     2Nd + 2·T_n·Nd  (+ 8N·T_n bytes)
        writes dK, dV                                   2Nd
      _bwd_dq_kernel: one program per Q tile (Q_i, dO_i on-chip); K, V stream
        reads Q, dO, LSE, D once, K and V once per Q tile  2Nd + 2·T_m·Nd  (+ 8N bytes)
        writes dQ                                       Nd

So the tiled traffic is ≈ 2N²d·(1/BLOCK_M) (forward) and ≈ 2N²d·(1/BLOCK_M + 1/BLOCK_N)
(backward) elements. Only the resident tile's rows appear: the streamed tile's size
changes how often the loop turns, not how many bytes cross.

On-chip memory M decides how large the resident tile can be. The working set of one
program is the resident tile and its accumulator (2·R·d), two streamed tiles (2·C·d)
and one score tile (R·C), in elements. :func:`tile_sizes_for_sram` takes
R = ⌊M / (5·d·e)⌋ resident rows and C = min(R, d) streamed rows, which fits:
2Rd + 2Cd + RC ≤ 2Rd + 2Rd + Rd = 5Rd ≤ M/e. With BLOCK_M = BLOCK_N = R the K/V
re-reads cost 2N²d·e / R ≈ 10·N²d²e²/M bytes: the Θ(N²d²/M) of the paper (for
5de ≤ M, and M ≤ 5Nde so that R ≤ N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

LSE_BYTES = 4  # LSE and D are float32 in flashtile, whatever the input dtype


@dataclass(frozen=True)
class HBMTraffic:
    """Bytes read from and written to HBM."""

    read_bytes: int
    write_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def __add__(self, other: "HBMTraffic") -> "HBMTraffic":
        return HBMTraffic(self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes)

    def __mul__(self, factor: int) -> "HBMTraffic":
        return HBMTraffic(self.read_bytes * factor, self.write_bytes * factor)


@dataclass(frozen=True)
class AttentionIO:
    """HBM traffic of one attention call: the forward and the backward pass."""

    forward: HBMTraffic
    backward: HBMTraffic

    @property
    def total(self) -> HBMTraffic:
        return self.forward + self.backward


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")


def standard_attention_io(seqlen: int, headdim: int, *, batch: int = 1, heads: int = 1,
                          dtype_bytes: int = 2) -> AttentionIO:
    """HBM bytes of standard attention, which writes S, P (forward) and dP, dS (backward).

    Args:
        seqlen: N (queries = keys). headdim: d. batch, heads: multiply the count.
        dtype_bytes: bytes per element of Q, K, V, O, S, P and the gradients
            (2 for float16/bfloat16, 4 for float32).

    See the module docstring for the kernel-by-kernel count.
    """
    _check_positive(seqlen=seqlen, headdim=headdim, batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    nd, nn_, e = seqlen * headdim, seqlen * seqlen, dtype_bytes
    forward = HBMTraffic(read_bytes=(3 * nd + 2 * nn_) * e, write_bytes=(nd + 2 * nn_) * e)
    backward = HBMTraffic(read_bytes=(5 * nd + 5 * nn_) * e, write_bytes=(3 * nd + 2 * nn_) * e)
    pairs = batch * heads
    return AttentionIO(forward * pairs, backward * pairs)


def tile_sizes_for_sram(sram_bytes: int, headdim: int, dtype_bytes: int = 2) -> tuple[int, int]:
    """(resident rows R, streamed rows C) whose working set fits in ``sram_bytes``.

    R = ⌊M / (5·d·e)⌋, C = min(R, d): the resident tile and its accumulator, two
    streamed tiles and the R×C score tile take at most 5·R·d elements ≤ M bytes / e.
    The resident tile is BLOCK_M in the forward and dQ kernels, BLOCK_N in the dK/dV
    kernel. Raises ValueError when not even one row fits (M < 5·d·e).
    """
    _check_positive(sram_bytes=sram_bytes, headdim=headdim, dtype_bytes=dtype_bytes)
    resident = sram_bytes // (5 * headdim * dtype_bytes)
    if resident < 1:
        raise ValueError(
            f"sram_bytes: expected at least 5·headdim·dtype_bytes = {5 * headdim * dtype_bytes} bytes "
            f"(one row of each tile), got {sram_bytes}"
        )
    return resident, min(resident, headdim)


def tiled_attention_io(seqlen: int, headdim: int, *, batch: int = 1, heads: int = 1, dtype_bytes: int = 2,
                       block_m: int | None = None, block_n: int | None = None,
                       sram_bytes: int | None = None) -> AttentionIO:
    """HBM bytes of the tiled algorithm (flashtile's forward and three backward kernels).

    Args:
        seqlen: N (queries = keys). headdim: d. batch, heads: multiply the count.
        dtype_bytes: bytes per element of Q, K, V, O and the gradients; LSE and D
            are float32.
        block_m: query rows per tile (resident in the forward and dQ kernels).
        block_n: key rows per tile (resident in the dK/dV kernel).
        sram_bytes: on-chip memory M; when given instead of the blocks, both
            resident tiles take :func:`tile_sizes_for_sram`'s R rows.

    Forward: (N·d + 2·⌈N/BLOCK_M⌉·N·d) read, N·d written, in elements, plus the
    float32 LSE. Backward: see the module docstring.
    """
    if sram_bytes is not None:
        if block_m is not None or block_n is not None:
            raise ValueError("sram_bytes: give either sram_bytes or block_m/block_n, not both")
        block_m = block_n = tile_sizes_for_sram(sram_bytes, headdim, dtype_bytes)[0]
    if block_m is None or block_n is None:
        raise ValueError("block_m, block_n: both are required when sram_bytes is not given")
    _check_positive(seqlen=seqlen, headdim=headdim, batch=batch, heads=heads, dtype_bytes=dtype_bytes,
                    block_m=block_m, block_n=block_n)
    n, nd, e = seqlen, seqlen * headdim, dtype_bytes
    tiles_m, tiles_n = math.ceil(n / block_m), math.ceil(n / block_n)

    forward = HBMTraffic(
        read_bytes=(nd + 2 * tiles_m * nd) * e,                 # Q once; K and V once per Q tile
        write_bytes=nd * e + n * LSE_BYTES,                     # O, LSE
    )
    preprocess = HBMTraffic(read_bytes=2 * nd * e, write_bytes=n * LSE_BYTES)  # O, dO -> D
    dkdv = HBMTraffic(
        read_bytes=(2 * nd + 2 * tiles_n * nd) * e + tiles_n * 2 * n * LSE_BYTES,  # K, V; Q, dO, LSE, D per K tile
        write_bytes=2 * nd * e,                                                    # dK, dV
    )
    dq = HBMTraffic(
        read_bytes=(2 * nd + 2 * tiles_m * nd) * e + 2 * n * LSE_BYTES,  # Q, dO, LSE, D; K and V per Q tile
        write_bytes=nd * e,                                              # dQ
    )
    pairs = batch * heads
    return AttentionIO(forward * pairs, (preprocess + dkdv + dq) * pairs)


def plot_io(path, seqlens: Sequence[int] = tuple(2 ** p for p in range(9, 17)), headdim: int = 64, *,
            batch: int = 1, heads: int = 1, dtype_bytes: int = 2, block_m: int = 128, block_n: int = 128,
            sram_bytes: int | None = None, title: str | None = None):
    """Plot HBM bytes of both algorithms against N (log-log), forward and forward+backward; save a PNG.

    Draws standard attention and the tiled algorithm with ``block_m``/``block_n``;
    with ``sram_bytes`` also the tiled algorithm with tiles chosen from M. Needs
    matplotlib (``pip install matplotlib``, part of flashtile's ``bench`` extra).
    Returns the path written.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # an optional dependency: say how to get it
        raise ImportError("plot_io needs matplotlib: pip install matplotlib (or flashtile[bench])") from exc

    seqlens = list(seqlens)
    common = dict(batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    curves = {"standard (S, P in HBM)": [standard_attention_io(n, headdim, **common) for n in seqlens],
              f"tiled, BLOCK_M={block_m}, BLOCK_N={block_n}": [
                  tiled_attention_io(n, headdim, block_m=block_m, block_n=block_n, **common) for n in seqlens]}
    if sram_bytes is not None:
        resident, _ = tile_sizes_for_sram(sram_bytes, headdim, dtype_bytes)
        curves[f"tiled, tiles from M={sram_bytes / 1024:g} KiB (R={resident})"] = [
            tiled_attention_io(n, headdim, sram_bytes=sram_bytes, **common) for n in seqlens]

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (label, pick) in zip(axes, (("forward", lambda io: io.forward.total_bytes),
                                        ("forward + backward", lambda io: io.total.total_bytes))):
        for name, ios in curves.items():
            ax.plot(seqlens, [pick(io) / 2**30 for io in ios], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_title(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("HBM traffic (GiB, model)")
    axes[0].legend(fontsize=8)
    fig.suptitle(title or f"IO model: d={headdim}, {dtype_bytes}-byte elements, batch={batch}, heads={heads}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["HBMTraffic", "AttentionIO", "standard_attention_io", "tiled_attention_io", "tile_sizes_for_sram",
           "plot_io"]
