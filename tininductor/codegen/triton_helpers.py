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
