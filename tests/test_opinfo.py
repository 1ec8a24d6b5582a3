"""PyTorch's OpInfo database through tinydynamo: outputs and gradients equal eager's.

A fixed, fast slice of ``op_db`` runs here (the first samples of ~70 representative ops,
weighted to what real models use and to multi-output ops); ``scripts/opinfo_sweep.py`` runs
all of it and prints the counts. Every sample must *pass* or *fall back* (the compiler gave
up with a logged reason, and the result still matches eager); ``wrong`` (a mismatch or a
dropped gradient) and ``error`` (the compiled call raised) fail the test.
What is compared is described in tests/opinfo_harness.py.
"""
from __future__ import annotations

import pytest

pytest.importorskip("expecttest")  # torch.testing._internal imports it

import tininductor.testing  # noqa: E402,F401  (TRITON_INTERPRET=1 on CPU)
from tests import opinfo_harness as h  # noqa: E402

#: the CI slice: pointwise, reductions, views, indexing, normalisation, attention, conv/pool,
#: losses, and the multi-output ops whose gradients used to be dropped
FAST_OPS = [
    # pointwise
    "add", "sub", "mul", "div.no_rounding_mode", "pow", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid",
    "abs", "neg", "clamp", "where", "masked_fill", "maximum", "lerp", "addcmul", "erf",
    "nn.functional.gelu", "nn.functional.silu", "nn.functional.mish", "nn.functional.softplus",
    "nn.functional.hardswish", "nn.functional.leaky_relu", "nn.functional.elu", "nn.functional.relu",
    # reductions and multi-output reductions
    "sum", "mean", "amax", "var", "std", "var_mean", "std_mean", "logsumexp", "max.reduction_with_dim",
    "min.reduction_with_dim", "max.reduction_no_dim", "sort", "topk", "kthvalue", "cummax", "cumsum", "cumprod",
    "softmax", "log_softmax", "nn.functional.normalize",
    # views and shape ops
    "view", "reshape", "permute", "transpose", "expand", "squeeze", "unsqueeze", "split", "chunk", "unbind",
    "cat", "stack", "flip", "roll", "narrow", "nn.functional.pad.constant", "nn.functional.pad.reflect",
    "nn.functional.pad.replicate", "tril",
    # indexing
    "index_select", "gather", "scatter", "scatter_add", "index_put", "index_add", "take_along_dim",
    "nn.functional.embedding", "__getitem__",
    # normalisation, attention, linear algebra, conv, pooling, interpolation
    "nn.functional.layer_norm", "nn.functional.group_norm", "nn.functional.batch_norm",
    "nn.functional.scaled_dot_product_attention", "nn.functional.linear", "matmul", "bmm", "addmm",
    "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d", "nn.functional.interpolate.nearest", "nn.functional.interpolate.bilinear",
    # losses
    "nn.functional.cross_entropy", "nn.functional.mse_loss", "nn.functional.binary_cross_entropy_with_logits",
    "nn.functional.smooth_l1_loss",
]

#: the Triton path runs in the interpreter on CPU: a few ops, one sample each
TRITON_OPS = ["add", "sum", "softmax", "var_mean", "max.reduction_with_dim", "nn.functional.layer_norm",
              "index_select", "cumsum"]


def _check(name, backend, samples):
    results = h.run_op(name, backend, samples)
    bad = [r for r in results if r.status in ("wrong", "error")]
    assert not bad, "\n".join(f"{r.op} sample {r.sample}: {r.status}: {r.reason}" for r in bad)
    assert any(r.status != "skip" for r in results), f"{name}: every sample skipped: {results}"


@pytest.mark.parametrize("name", FAST_OPS)
def test_opinfo_aot_eager(name):
    _check(name, "aot_eager", samples=2)


@pytest.mark.parametrize("name", FAST_OPS)
def test_opinfo_tininductor_cpp(name):
    _check(name, "tininductor", samples=1)


@pytest.mark.parametrize("name", TRITON_OPS)
def test_opinfo_tininductor_triton(name):
    _check(name, "tininductor_triton", samples=1)


def test_fast_slice_names_exist():
    known = set(h.all_op_names())
    assert not [n for n in FAST_OPS + TRITON_OPS if n not in known]
