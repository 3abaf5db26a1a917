"""Extra memory is O(N·d), never an N×N matrix: measured with flashtile.memory on the CPU.

The CPU tracker counts the bytes of every storage created inside the block. It
also counts views of the inputs (q/k/v transposed or grouped) as if they were new
storages (a known over-count, see test_tracker_ignores_views_of_inputs), so the
bounds below are loose on the O(N·d) side and still ~100× below N².
"""

import pytest
import torch

import flashtile
from flashtile.masks import normalize_window
from flashtile.memory import track_peak_memory
from flashtile.reference import tiled_attention_forward

HEADDIM = 64
FLOAT32 = 4  # bytes


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # These tests loop over thousands of small tiles; with 2 intra-op threads on a
    # busy 2-core machine they can run ~10× slower than with one. Memory is the
    # same either way.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiled_forward_peak(seqlen: int, block: int = 512) -> int:
    """Peak extra bytes of the causal tiled forward, batch 1, heads 1, headdim 64, float32.

    Called directly with 512×512 tiles: at N = 32768 the public API's 64×64 default
    walks ~130k tile pairs in Python (over a minute on 2 cores); the tile size only
    changes the constant O(BLOCK_M·BLOCK_N) workspace, not the O(N·d) growth.
    """
    q, k, v = (torch.randn(1, seqlen, 1, HEADDIM).transpose(1, 2) for _ in range(3))  # (B, H, N, D) views
    with track_peak_memory("cpu") as mem:
        out, lse = tiled_attention_forward(q, k, v, HEADDIM ** -0.5, normalize_window(True, (-1, -1)),
                                           BLOCK_M=block, BLOCK_N=block)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    return mem.peak_bytes


@pytest.fixture(scope="module")
def forward_peaks() -> dict:
    return {n: tiled_forward_peak(n) for n in (8192, 16384, 32768)}


def test_forward_at_32k_is_far_below_one_score_matrix(forward_peaks):
    n = 32768
    score_matrix = n * n * FLOAT32  # 4 GiB
    peak = forward_peaks[n]
    out_bytes = n * HEADDIM * FLOAT32
    assert peak >= out_bytes, f"peak {peak} B is less than the output itself ({out_bytes} B): tracker broken?"
    assert peak < 0.01 * score_matrix, (
        f"peak extra memory {peak / 2**20:.1f} MiB at N={n} is not far below one N×N float32 matrix "
        f"({score_matrix / 2**30:.0f} GiB)"
    )


def test_forward_memory_grows_linearly(forward_peaks):
    p8, p16, p32 = forward_peaks[8192], forward_peaks[16384], forward_peaks[32768]
    ratio = p32 / p8
    # Linear: ≤ 4 (less when the constant tile workspace matters). Quadratic: 16.
    assert ratio <= 4.5, f"peak grew {ratio:.1f}× from N=8192 to 32768 (linear ≤ 4, quadratic 16)"
    # Equal steps in N add equal bytes: going 16k→32k adds twice what 8k→16k added
    # (a quadratic term would make it 3×... 4×).
    steps = (p32 - p16) / (p16 - p8)
    assert 1.6 <= steps <= 2.4, f"growth is not linear: increments ratio {steps:.2f} (linear 2, quadratic 3+)"


def test_public_api_forward_backward_memory_is_linear():
    """flashtile.attention with its default tiles, forward and backward, at N, 2N and 4N: the
    peak's growth from 2N to 4N over its growth from N to 2N is 2 for linear memory (the tiles'
    constant workspace cancels) and 4 for quadratic."""
    peaks = {}
    for n in (1024, 2048, 4096):
        q, k, v = (torch.randn(1, n, 1, HEADDIM, requires_grad=True) for _ in range(3))
        dout = torch.randn(1, n, 1, HEADDIM)
        with track_peak_memory("cpu") as mem:
            out = flashtile.attention(q, k, v, causal=True)
            out.backward(dout)
        assert q.grad is not None and torch.isfinite(q.grad).all()
        peaks[n] = mem.peak_bytes
        # out, lse, D, dq, dk, dv and the tracker's over-count of input views: a
        # bounded number of (N, d) arrays, far from the N×N matrices of S, P, dP, dS.
        assert peaks[n] <= 16 * n * HEADDIM * FLOAT32, f"N={n}: peak {peaks[n]} B is more than 16 (N, d) arrays"
    ratio = (peaks[4096] - peaks[2048]) / (peaks[2048] - peaks[1024])
    assert 1.5 <= ratio <= 2.5, (f"the peak grew {ratio:.2f}× as much from N=2048 to 4096 as from 1024 to 2048 "
                                 f"(linear 2, quadratic 4): {peaks}")


def test_tracker_sees_the_naive_quadratic_memory():
    # The tracker can fail: standard attention holds the N×N scores.
    n = 1024
    q, k, v = (torch.randn(1, n, 1, HEADDIM) for _ in range(3))
    with track_peak_memory("cpu") as mem:
        flashtile.naive_attention(q, k, v, causal=True, upcast=False)
    assert mem.peak_bytes >= n * n * FLOAT32, (
        f"naive attention at N={n} peaked at {mem.peak_bytes} B, less than one N×N float32 matrix"
    )


def test_tracker_counts_freed_memory_out():
    with track_peak_memory("cpu") as mem:
        for _ in range(10):
            x = torch.empty(1_000_000)  # 4 MB, freed when rebound
            del x
    assert 4_000_000 <= mem.peak_bytes < 8_000_001, f"freed tensors must leave the count: peak {mem.peak_bytes}"


def test_tracker_ignores_views_of_inputs():
    x = torch.randn(1_000_000)
    with track_peak_memory("cpu") as mem:
        y = x.view(1000, 1000).t()
    assert y.shape == (1000, 1000)
    assert mem.peak_bytes == 0, f"a view of an input counted {mem.peak_bytes} B"
