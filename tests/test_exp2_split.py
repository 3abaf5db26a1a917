"""kernels/exp2_split.py: the polynomial exp2 that the five-product backward can run beside the SFU's.

The interpreter cannot run inline PTX, so on the CPU the arithmetic is checked through its torch
twin (the same steps) and the PTX text is checked for what it computes where; tools/compile_check.py
builds the kernels with it for sm_90 (tests/test_compile_check.py), and tests/test_gluon.py's GPU
tests run them against the float64 oracle."""

from __future__ import annotations

import re
import struct

import pytest
import torch

pytest.importorskip("triton")
from flashtile.kernels import exp2_split, hopper  # noqa: E402  (imports Triton)


def test_the_polynomial_is_exp2_within_its_stated_error_and_zero_below_its_range():
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(1_000_000, generator=generator, dtype=torch.float64) * 126.5 - 125.0  # [-125, 1.5)
    x = torch.cat([x, torch.tensor([-125.0, -0.5, 0.0, 0.5, 1.0, -1.0, -64.5])]).to(torch.float32)
    got = exp2_split.exp2_poly_reference(x).double()
    relative = (got / torch.exp2(x.double()) - 1).abs()
    assert relative.max().item() < 8e-5  # the fit's 7.5e-5, with float32 rounding
    # below the range and at -inf (masked scores): exactly 0, as MUFU.EX2 with flush-to-zero
    low = torch.tensor([-125.01, -126.0, -1e4, float("-inf")])
    assert torch.equal(exp2_split.exp2_poly_reference(low), torch.zeros(4))


def test_its_error_is_below_what_p_is_rounded_to():
    # Pᵀ goes to the inputs' dtype for the dV product: the polynomial's error must be well under
    # a half-unit of fp16 (2**-12), the finer of the two 16-bit types.
    x = torch.linspace(-30.0, 0.0, 200_001)
    relative = (exp2_split.exp2_poly_reference(x).double() / torch.exp2(x.double()) - 1).abs().max().item()
    assert relative < 2.0 ** -12 / 3


@pytest.mark.parametrize("poly_of_4", [1, 2, 4])
def test_the_ptx_puts_the_last_elements_of_a_pack_on_the_polynomial(poly_of_4):
    text = exp2_split.ptx(poly_of_4)
    sfu = re.findall(r"ex2\.approx\.ftz\.f32 \$(\d), \$(\d);", text)
    assert [(int(o), int(i)) for o, i in sfu] == [(k, k + 4) for k in range(4 - poly_of_4)]
    c0, c1, c2, c3 = (struct.unpack("f", struct.pack("f", c))[0] for c in exp2_split.COEFFICIENTS)
    lanes = text.split("add.rn.f32 t, ")[1:]  # one polynomial lane each, in order
    assert len(lanes) == poly_of_4
    for k, lane in zip(range(4 - poly_of_4, 4), lanes):
        x = f"${k + 4}"
        # every step of the lane reads its own input and writes its own output
        assert lane.startswith(x + ",") and f"sub.rn.f32 f, {x}, n;" in lane, lane
        assert f"setp.lt.f32 low, {x}," in lane and f"selp.b32 ${k}, 0, r, low;" in lane, lane
        assert lane.count("fma.rn.f32") == 3 and "shl.b32 e, t, 23;" in lane and "add.s32 r, r, e;" in lane
        constants = [struct.unpack(">f", bytes.fromhex(h))[0] for h in re.findall(r"0f([0-9A-F]{8})", lane)]
        assert constants == [exp2_split.ROUNDER, exp2_split.ROUNDER, c3, c2, c1, c0, exp2_split.LOWEST]
    with pytest.raises(ValueError, match="poly_of_4: expected 1 to 4"):
        exp2_split.ptx(5)


def test_the_switch_names_what_it_takes(monkeypatch):
    monkeypatch.setenv(hopper.EXP_POLY_SWITCH, "3")
    with pytest.raises(ValueError, match="FLASHTILE_GLUON_BWD_EXP_POLY: expected auto, 0, 1 or 2"):
        hopper.fused_exp_poly(64)
    monkeypatch.setenv(hopper.EXP_POLY_SWITCH, "2")
    assert hopper.fused_exp_poly(64) == hopper.fused_exp_poly(128) == 2
    monkeypatch.setenv(hopper.EXP_POLY_SWITCH, "auto")
    assert hopper.fused_exp_poly(64) == hopper.FUSED_EXP_POLY[64]
