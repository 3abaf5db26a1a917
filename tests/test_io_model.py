"""flashtile.io: the HBM traffic model of standard and tiled attention.

Exact byte counts for tiny cases worked out by hand, tensor by tensor, then the
asymptotic claims: standard attention grows as N², the tiled algorithm as N²d/BLOCK_M,
and as N²d²/M when its tiles are chosen from the on-chip memory M.
"""

import pytest

from flashtile.io import (AttentionIO, HBMTraffic, plot_io, standard_attention_io, tile_sizes_for_sram,
                          tiled_attention_io)


def test_standard_tiny_case_by_hand():
    # N = 4, d = 2, 2-byte elements: Q, K, V, O, dO, dQ… are 8 elements (16 B), S, P, dP, dS 16 elements (32 B).
    qkvo, square = 16, 32
    forward_reads = (2 * qkvo) + square + (square + qkvo)            # Q,K -> S; S -> P; P,V -> O
    forward_writes = square + square + qkvo                          # S, P, O
    backward_reads = (square + qkvo) + (2 * qkvo) + (2 * square) + (square + qkvo) + (square + qkvo)
    #                 P,dO -> dV        dO,V -> dP    P,dP -> dS      dS,K -> dQ       dS,Q -> dK
    backward_writes = qkvo + square + square + qkvo + qkvo           # dV, dP, dS, dQ, dK
    assert standard_attention_io(4, 2, dtype_bytes=2) == AttentionIO(
        HBMTraffic(forward_reads, forward_writes), HBMTraffic(backward_reads, backward_writes))
    assert (forward_reads, forward_writes, backward_reads, backward_writes) == (112, 80, 240, 112)


def test_tiled_tiny_case_by_hand():
    # N = 4, d = 2, 2-byte elements, BLOCK_M = BLOCK_N = 2: two Q tiles, two K/V tiles.
    # An (N, d) tensor is 16 B, a float32 row vector (LSE, D) 16 B, one tile of K is 8 B.
    nd, vec = 16, 16
    forward_reads = nd + 2 * (nd + nd)            # Q once; each of 2 Q tiles reads all of K and V
    forward_writes = nd + vec                     # O, LSE
    preprocess = (2 * nd, vec)                    # reads O, dO; writes D
    dkdv = (2 * nd + 2 * (2 * nd + 2 * vec), 2 * nd)  # K, V once; each of 2 K tiles reads Q, dO, LSE, D
    dq = (2 * nd + 2 * vec + 2 * (2 * nd), nd)        # Q, dO, LSE, D once; each of 2 Q tiles reads K, V
    backward = HBMTraffic(preprocess[0] + dkdv[0] + dq[0], preprocess[1] + dkdv[1] + dq[1])
    assert tiled_attention_io(4, 2, dtype_bytes=2, block_m=2, block_n=2) == AttentionIO(
        HBMTraffic(forward_reads, forward_writes), backward)
    assert backward == HBMTraffic(320, 64)


def test_tiled_partial_last_tile():
    # N = 5, BLOCK_M = 2: three Q tiles (2, 2, 1 rows), each reading all 5 rows of K and V.
    # d = 2, 4-byte elements: an (N, d) tensor is 40 B.
    io = tiled_attention_io(5, 2, dtype_bytes=4, block_m=2, block_n=5)
    assert io.forward == HBMTraffic(40 + 3 * (40 + 40), 40 + 5 * 4)


def test_batch_and_heads_multiply():
    for fn, kwargs in ((standard_attention_io, {}), (tiled_attention_io, dict(block_m=64, block_n=32))):
        one = fn(300, 64, **kwargs)
        six = fn(300, 64, batch=3, heads=2, **kwargs)
        assert six.forward == one.forward * 6 and six.backward == one.backward * 6


def test_monotonic_in_seqlen():
    for fn, kwargs in ((standard_attention_io, {}), (tiled_attention_io, dict(block_m=16, block_n=32))):
        totals = [fn(n, 32, **kwargs).total.total_bytes for n in range(1, 400)]
        assert all(b > a for a, b in zip(totals, totals[1:])), fn.__name__


def test_standard_grows_quadratically():
    # Doubling N quadruples the traffic once the N² matrices dominate the N·d tensors.
    small, large = (standard_attention_io(n, 64).total.total_bytes for n in (2**15, 2**16))
    assert large / small == pytest.approx(4.0, rel=0.01)
    # and at large N it is the 11 N×N matrix passes (4 forward, 7 backward), in bytes:
    n = 2**16
    assert standard_attention_io(n, 64, dtype_bytes=2).total.total_bytes == pytest.approx(11 * n * n * 2, rel=0.01)


@pytest.mark.parametrize("block", [32, 64, 128])
@pytest.mark.parametrize("headdim", [64, 128])
def test_tiled_grows_as_n_squared_d_over_block(block, headdim):
    n, e = 2**15, 2
    io = tiled_attention_io(n, headdim, dtype_bytes=e, block_m=block, block_n=block)
    # K and V re-read once per Q tile: 2·N²·d·e / BLOCK_M in the forward ...
    assert io.forward.total_bytes == pytest.approx(2 * n * n * headdim * e / block, rel=0.02)
    # ... and twice that in the backward (K/V per Q tile in dQ, Q/dO per K tile in dK/dV),
    # plus the float32 LSE and D read per K tile: 8 bytes per row.
    expected_backward = 4 * n * n * headdim * e / block + 8 * n * n / block
    assert io.backward.total_bytes == pytest.approx(expected_backward, rel=0.02)
    # doubling the query tile halves the forward's dominant term
    bigger = tiled_attention_io(n, headdim, dtype_bytes=e, block_m=2 * block, block_n=block)
    assert bigger.forward.total_bytes / io.forward.total_bytes == pytest.approx(0.5, rel=0.02)


@pytest.mark.parametrize("headdim", [32, 64, 128])
@pytest.mark.parametrize("resident", [64, 128, 256])
def test_tiles_from_sram_give_n2_d2_over_m(headdim, resident):
    # M chosen so that ⌊M / (5de)⌋ = resident exactly; then forward bytes · M / (N² d² e²) → 10.
    n, e = 2**16, 2
    sram = 5 * headdim * e * resident
    assert tile_sizes_for_sram(sram, headdim, e)[0] == resident
    io = tiled_attention_io(n, headdim, dtype_bytes=e, sram_bytes=sram)
    constant = io.forward.total_bytes * sram / (n * n * headdim**2 * e**2)
    assert 10.0 <= constant <= 10.0 * (1 + 2 * resident / n) + 0.01, constant


def test_sram_relation_holds_across_m_and_d():
    # Θ(N²d²/M): the same constant whatever M and d, so quadrupling M quarters the
    # re-read traffic and doubling d (at fixed M) quadruples it.
    n, e = 2**16, 2
    fwd = lambda d, m: tiled_attention_io(n, d, dtype_bytes=e, sram_bytes=m).forward.total_bytes  # noqa: E731
    m = 5 * 64 * e * 256
    assert fwd(64, m) / fwd(64, 4 * m) == pytest.approx(4.0, rel=0.02)
    assert fwd(128, m) / fwd(64, m) == pytest.approx(4.0, rel=0.02)


@pytest.mark.parametrize("sram", [1_000, 48 * 1024, 228 * 1024, 10**7])
@pytest.mark.parametrize("headdim", [16, 64, 128, 256])
@pytest.mark.parametrize("e", [2, 4])
def test_tile_sizes_fit_and_are_largest(sram, headdim, e):
    if sram < 5 * headdim * e:
        with pytest.raises(ValueError, match="sram_bytes"):
            tile_sizes_for_sram(sram, headdim, e)
        return
    r, c = tile_sizes_for_sram(sram, headdim, e)
    assert r >= 1 and 1 <= c <= headdim and c <= r
    working_set = 2 * r * headdim + 2 * c * headdim + r * c  # resident + accumulator, 2 streamed, scores
    assert working_set * e <= sram
    assert 5 * (r + 1) * headdim * e > sram, "one more resident row would still fit the 5·R·d budget"


@pytest.mark.parametrize("headdim", [64, 128])
def test_tiled_moves_less_than_standard_at_long_sequences(headdim):
    for n in (4096, 16384, 65536):
        standard = standard_attention_io(n, headdim)
        for tiled in (tiled_attention_io(n, headdim, block_m=128, block_n=128),
                      tiled_attention_io(n, headdim, sram_bytes=228 * 1024)):
            assert tiled.forward.total_bytes < standard.forward.total_bytes
            assert tiled.total.total_bytes < standard.total.total_bytes


def test_bad_arguments():
    with pytest.raises(ValueError, match="not both"):
        tiled_attention_io(64, 64, block_m=16, block_n=16, sram_bytes=10**5)
    with pytest.raises(ValueError, match="block_m, block_n"):
        tiled_attention_io(64, 64, block_m=16)
    with pytest.raises(ValueError, match="seqlen"):
        standard_attention_io(0, 64)
    with pytest.raises(ValueError, match="block_n"):
        tiled_attention_io(64, 64, block_m=16, block_n=-1)


def test_plot_io_writes_png(tmp_path):
    path = tmp_path / "io.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # Without the optional dependency the error must say how to install it.
        with pytest.raises(ImportError, match="pip install matplotlib"):
            plot_io(path)
        return
    plot_io(path, seqlens=[256, 1024, 4096], headdim=64, sram_bytes=228 * 1024)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
