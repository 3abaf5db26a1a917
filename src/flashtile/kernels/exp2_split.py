"""exp2 on two pipes: some elements on the SFU (MUFU.EX2), the rest as a polynomial on the FMA units.

A backward consumer's softmax step is exp2 of every score of its tile, and the SFU that runs
MUFU.EX2 does 16 a clock per SM against the FMA units' 128: at head dim 64 a warpgroup's 64 × 128
tile keeps the SFU busy ~512 clocks a step while the tensor cores wait for Pᵀ. FlashAttention-4
moves part of those exponentials to the FMA units (on Blackwell, where the SFU did not grow with
the tensor cores); the same split shortens the SFU phase on Hopper.

The polynomial (Cody–Waite): with M = 1.5·2²³, t = x + M rounds x to the integer n in t's low
bits, f = x − (t − M) ∈ [−½, ½], and 2^x = 2^f · 2^n: p(f) ≈ 2^f by a degree-3 polynomial
(relative error 7.5e-5 over [−½, ½], fitted for it; below the 2⁻⁹ of bf16 and the 2⁻¹¹ of fp16
that Pᵀ is rounded to), and 2^n added into p's exponent field as the integer n·2²³ (t's bits
shifted left by 23: M's own bits shift out). Inputs below −125 (masked scores are −inf) give
exactly 0, as MUFU.EX2 with flush-to-zero gives 0 below −126.

``exp2_split(x, POLY_OF_4)`` computes that for POLY_OF_4 of every 4 consecutive elements of a
thread (Triton's inline-asm packs of 4) and MUFU.EX2 for the rest. ``exp2_poly_reference`` is the
same arithmetic in torch float32, for the CPU tests (the interpreter cannot run PTX).

Its domain is x < 128, which the backward's arguments keep to (Sᵀ·scale − lse2 ≤ ~0; masked scores
and rows past the end are −inf): from 128 up the exponent field overflows (+inf and NaN give NaN,
where MUFU.EX2 gives +inf). NaN gives NaN.
"""

from __future__ import annotations

import struct

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# p(f) ≈ 2^f on [-1/2, 1/2], lowest degree first (a least-squares fit reweighted to the minimax
# relative error, 7.5e-5).
COEFFICIENTS = (0.99992812, 0.69326097, 0.24261035, 0.05517134)
ROUNDER = 12582912.0  # 1.5 · 2**23: x + ROUNDER holds round(x) in its low mantissa bits
LOWEST = -125.0  # below this the result is 0 (2**n's exponent field would underflow)


def _hex(value: float) -> str:
    """A float32 constant as PTX writes it (0fXXXXXXXX)."""
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", value))[0]


def ptx(poly_of_4: int) -> str:
    """The inline PTX of one pack of 4 float32 elements ($4..$7 in, $0..$3 out, 32-bit
    registers): the last ``poly_of_4`` (1 to 4) by the polynomial, the others by ex2.approx.ftz.
    The polynomial lanes reuse one set of scratch registers, one lane after the other."""
    if not 1 <= poly_of_4 <= 4:
        raise ValueError(f"poly_of_4: expected 1 to 4 of a pack of 4, got {poly_of_4}")
    c0, c1, c2, c3 = (_hex(c) for c in COEFFICIENTS)
    lines = ["{", ".reg .f32 t, n, f, p;", ".reg .b32 e, r;", ".reg .pred low;"]
    for k in range(4):
        x, out = f"${k + 4}", f"${k}"
        if k < 4 - poly_of_4:
            lines.append(f"ex2.approx.ftz.f32 {out}, {x};")
            continue
        lines += [
            f"add.rn.f32 t, {x}, {_hex(ROUNDER)};",
            f"sub.rn.f32 n, t, {_hex(ROUNDER)};",
            f"sub.rn.f32 f, {x}, n;",
            f"fma.rn.f32 p, f, {c3}, {c2};",
            f"fma.rn.f32 p, p, f, {c1};",
            f"fma.rn.f32 p, p, f, {c0};",
            "shl.b32 e, t, 23;",
            "mov.b32 r, p;",
            "add.s32 r, r, e;",
            f"setp.lt.f32 low, {x}, {_hex(LOWEST)};",
            f"selp.b32 {out}, 0, r, low;",
        ]
    lines.append("}")
    return "\n".join(lines)


_PTX_1 = gl.constexpr(ptx(1))
_PTX_2 = gl.constexpr(ptx(2))


@gluon.jit
def exp2_split(x, POLY_OF_4: gl.constexpr):
    """2**x of float32 ``x`` below 128 (any layout; the module's docstring has the domain):
    POLY_OF_4 (0, 1 or 2) of every 4 of a thread's elements by the polynomial, the rest by
    MUFU.EX2; 0 is gl.exp2 alone."""
    gl.static_assert(POLY_OF_4 == 0 or POLY_OF_4 == 1 or POLY_OF_4 == 2, "POLY_OF_4: 0, 1 or 2")
    if POLY_OF_4 == 0:
        result = gl.exp2(x)
    else:
        text: gl.constexpr = _PTX_1 if POLY_OF_4 == 1 else _PTX_2
        result = gl.inline_asm_elementwise(text, "=r,=r,=r,=r,r,r,r,r", [x], dtype=gl.float32, is_pure=True, pack=4)
    return result


def exp2_poly_reference(x: torch.Tensor) -> torch.Tensor:
    """The polynomial path's arithmetic in torch float32, step for step as ``ptx`` writes it. Its
    fused multiply-adds go through float64 (a·b exact there) and are then rounded to float32:
    twice rounded, so a result can differ from fma.rn.f32's in the last bit."""
    x = x.to(torch.float32)
    rounder = torch.tensor(ROUNDER, dtype=torch.float32)
    t = x + rounder
    f = x - (t - rounder)
    c0, c1, c2, c3 = (torch.tensor(c, dtype=torch.float32).double() for c in COEFFICIENTS)

    def fma(a, b, c):  # a·b of two float32 values is exact in float64; + c and the cast each round
        return (a.double() * b + c).to(torch.float32)

    p = fma(fma(fma(f, c3, c2), f, c1), f, c0)
    bits = p.view(torch.int32) + torch.bitwise_left_shift(t.view(torch.int32), 23)
    return torch.where(x < LOWEST, torch.zeros_like(x), bits.view(torch.float32))
