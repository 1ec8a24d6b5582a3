"""Small ``@triton.jit`` helpers that generated kernels call as ``triton_helpers.xyz``.

* NaN-propagating ``maximum``/``minimum`` and ``max2``/``min2`` reductions (eager's
  ``torch.maximum`` and ``amax`` propagate NaN; Triton's ``tl.maximum``/``tl.max`` do not);
* ``prod2`` (Triton has no product reduction);
* special functions: on a GPU they call CUDA's libdevice; under ``TRITON_INTERPRET=1``
  (CPU tests) libdevice is not available, so they use formulas over ``tl.exp``/``tl.log``.

Import this module only after ``TRITON_INTERPRET`` is set (``triton.jit`` reads it then).
"""
import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def maximum(a, b):
    return tl.where(a != a, a, tl.where(a > b, a, b))


@triton.jit
def minimum(a, b):
    return tl.where(a != a, a, tl.where(a < b, a, b))


@triton.jit
def _prod_combine(a, b):
    return a * b


@triton.jit
def max2(x, axis: tl.constexpr):
    return tl.reduce(x, axis, maximum)


@triton.jit
def min2(x, axis: tl.constexpr):
    return tl.reduce(x, axis, minimum)


@triton.jit
def prod2(x, axis: tl.constexpr):
    return tl.reduce(x, axis, _prod_combine)


@triton.jit
def sign(x):
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


if INTERPRET:

    @triton.jit
    def tanh(x):
        return 2 * tl.sigmoid(2 * x) - 1

    @triton.jit
    def log1p(x):
        return tl.log(1 + x)

    @triton.jit
    def expm1(x):
        return tl.exp(x) - 1

    @triton.jit
    def pow(a, b):
        # a ** b for a >= 0; negative bases only with integral exponents (eager gives NaN otherwise)
        mag = tl.exp(b * tl.log(tl.abs(a)))
        odd = (tl.floor(b * 0.5) * 2 != b) & (tl.floor(b) == b)
        integral = tl.floor(b) == b
        neg = tl.where(integral, tl.where(odd, -mag, mag), float("nan"))
        return tl.where(a >= 0, mag, neg)

else:
    from triton.language.extra import libdevice

    @triton.jit
    def tanh(x):
        return libdevice.tanh(x)

    @triton.jit
    def log1p(x):
        return libdevice.log1p(x)

    @triton.jit
    def expm1(x):
        return libdevice.expm1(x)

    @triton.jit
    def pow(a, b):
        return libdevice.pow(a, b)


def _round_to_bfloat16_like_a_gpu() -> None:
    """Make the interpreter round float32 -> bfloat16 to nearest even, as a GPU's ``.to(tl.bfloat16)``
    (``cvt.rn.bf16.f32``) and torch do; the interpreter (triton 3.x) truncates, so every bf16 value
    a kernel rounded (a store, an explicit ``.to``) was up to an ulp off eager's on the CPU.
    float64 -> bfloat16 goes through float32, as torch's conversion does."""
    import numpy as np  # with triton's interpreter (CPU runs only), loaded when the patch is applied
    from triton.runtime import interpreter

    builder = getattr(interpreter, "InterpreterBuilder", None)
    original = getattr(builder, "cast_impl", None)
    if original is None or getattr(builder, "_tiny_bf16_rtne", False):
        return  # another triton: leave its interpreter as it is

    def cast_impl(self, src, dst_type):
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar in (tl.float32, tl.float64):
            value = np.asarray(src.data, dtype=np.float32)
            bits = value.view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            rounded = np.where(np.isnan(value), (bits >> 16).astype(np.uint16) | 0x0040, rounded)  # quiet NaN
            return interpreter.TensorHandle(rounded.reshape(value.shape), tl.bfloat16)
        return original(self, src, dst_type)

    builder.cast_impl = cast_impl
    builder._tiny_bf16_rtne = True


if INTERPRET:
    _round_to_bfloat16_like_a_gpu()
