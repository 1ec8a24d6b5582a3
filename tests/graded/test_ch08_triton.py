"""Graded tests for chapter 8: your Triton backend generates the kernels of real graphs.

Each test compiles a graph with tininductor while ``use_mini_backend(ch.MiniTritonScheduling)`` is
active, runs the kernels (the Triton interpreter on CPU, the GPU when there is one) and compares
with eager.
So that each task is graded on its own, the tests of one task use the small reference
versions below for the *other* tasks' pieces.
"""
import math

import pytest
import sympy
import torch

import tininductor.testing  # noqa: F401  (sets TRITON_INTERPRET=1 on CPU before any triton.jit)
from course import load
from course.chapters.ch08_triton import compile_triton, kernel_source, use_mini_backend
from course.testing import expect_close, expect_equal, expect_true
from tininductor.indexing import sym
from tininductor.testing import DEVICE


def randn(*size):
    """Random inputs on the device the kernels run on (the GPU when there is one)."""
    return torch.randn(*size, device=DEVICE)


def rand(*size):
    return torch.rand(*size, device=DEVICE)


ch = load("ch08")


# --------------------------------------------------------------------------- references for the other tasks


def ref_mask_for(index):
    names = {s.name[0] for s in sympy.sympify(index).free_symbols}
    return " & ".join(m for m, p in (("xmask", "x"), ("rmask", "r")) if p in names) or None


def ref_load(ptr, index, mask):
    return f"tl.load({ptr} + ({index}){', ' + mask + ', other=0' if mask else ''})"


def ref_store(ptr, index, value, mask):
    return f"tl.store({ptr} + ({index}), {value}{', ' + mask if mask else ''})"


def ref_reduction(self, dtype, src_dtype, reduction_type, value):
    masked = self.generate(f"tl.where(xmask & rmask, {value}, {ch.reduction_init(reduction_type, src_dtype)})")
    return self.generate(f"{ch.REDUCTIONS[reduction_type][1].format(masked)}[:, None]")


def small_blocks(numel, rnumel, is_reduction):
    """Deliberately small blocks: several programs and a masked tail even for tiny tensors."""
    rblock = 1 if not is_reduction else 1 << max(0, rnumel - 1).bit_length()
    xblock = 8 if not is_reduction else max(1, min(4, 64 // rblock))
    return xblock, rblock, 1, max(1, math.ceil(numel / xblock))


def ref_ops():
    return {
        "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "truediv": "{0} / {1}", "neg": "-{0}",
        "exp": "tl.exp({0})", "sqrt": "tl.sqrt({0})", "sin": "tl.sin({0})", "lt": "{0} < {1}",
        "relu": "triton_helpers.maximum({0}, 0)", "maximum": "triton_helpers.maximum({0}, {1})",
        "where": "tl.where({0}, {1}, {2})",
    }


REFS = {
    "ops": [("triton_op_strings", ref_ops)],
    "memory": [("mask_for", ref_mask_for), ("masked_load", ref_load), ("masked_store", ref_store)],
    "launch": [("launch_config", small_blocks)],
}


@pytest.fixture
def others(monkeypatch):
    """``others("ops", "memory")``: use the reference pieces of those tasks."""

    def use(*tasks):
        for task in tasks:
            if task == "reduction":
                monkeypatch.setattr(ch.MiniTritonKernel, "reduction", ref_reduction)
            for name, fn in REFS.get(task, []):
                monkeypatch.setattr(ch, name, fn)

    return use


def run(fn, args, **tol):
    with use_mini_backend(ch.MiniTritonScheduling):
        compiled = compile_triton(fn, args)
    expect_close(compiled(*args), fn(*args), "compiled vs eager", context=compiled.source, equal_nan=True, **tol)
    return compiled


# --------------------------------------------------------------------------- 8.1


def _ops_a(x, w):
    return torch.where(x < w, (x * 2 - w).exp(), (x.sin() + 1) / (w * w + 1))


def _ops_b(x, w):
    return (torch.maximum(x, w).relu() + 1).sqrt().neg()


@pytest.mark.ch08_1
def test_op_table_covers_the_ops():
    table = ch.triton_op_strings()
    missing = sorted(set(ref_ops()) - set(table))
    expect_equal(missing, [], "ops missing from your table")
    for op, fmt in table.items():
        text = fmt.format("tmp0", "tmp1", "tmp2")
        expect_true("tmp0" in text, f"{op}: {fmt!r} does not use its first operand {{0}}")


@pytest.mark.ch08_1
@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 6)])
def test_op_strings_in_kernels(shape, others):
    others("memory", "launch", "reduction")
    torch.manual_seed(0)
    x, w = randn(shape), randn(shape[-1])
    for fn in (_ops_a, _ops_b):
        compiled = run(fn, [x, w])
        expect_equal(len(compiled.kernels), 1, f"kernels for {fn.__name__}")


@pytest.mark.ch08_1
def test_op_strings_on_ties_and_order(others):
    """Equal operands (x < w is False where they tie) and non-commutative ops in both orders."""
    others("memory", "launch", "reduction")
    x = torch.tensor([[1.0, 2.0, -3.0, 0.5], [4.0, -1.0, 2.0, 0.25]], device=DEVICE)
    w = torch.tensor([1.0, -1.0, 2.0, 0.5], device=DEVICE)
    run(lambda x, w: (torch.where(x < w, x - w, w / x), torch.where(w < x, w - x, x / w)), [x, w])


@pytest.mark.ch08_1
def test_op_strings_propagate_nan_like_eager(others):
    """relu(NaN) and maximum(NaN, w), maximum(x, NaN) are NaN in eager: a comparison-based max drops them."""
    others("memory", "launch", "reduction")
    nan = float("nan")
    x = torch.tensor([[nan, 2.0, -3.0, 0.5], [4.0, nan, -2.0, 0.25]], device=DEVICE)
    w = torch.tensor([1.0, nan, 2.0, -0.5], device=DEVICE)
    run(lambda x, w: (torch.relu(x), torch.maximum(x, w), torch.maximum(w, x)), [x, w])


# --------------------------------------------------------------------------- 8.2


@pytest.mark.ch08_2
def test_masks_and_memory_lines():
    x0, x1, r0 = sym("x0"), sym("x1"), sym("r0")
    expect_equal(ch.mask_for(x0 + 8 * x1), "xmask", "mask for x0 + 8*x1")
    expect_equal(ch.mask_for(r0), "rmask", "mask for r0")
    expect_equal(ch.mask_for(r0 + 13 * x0), "xmask & rmask", "mask for r0 + 13*x0")
    expect_equal(ch.mask_for(sympy.Integer(0)), None, "mask for a constant index")
    expect_equal(" ".join(ch.masked_load("in_ptr0", "x0", "xmask").split()),
                 "tl.load(in_ptr0 + (x0), xmask, other=0)", "masked load line")
    expect_equal(" ".join(ch.masked_store("out_ptr0", "x0", "tmp3", "xmask").split()),
                 "tl.store(out_ptr0 + (x0), tmp3, xmask)", "masked store line")


@pytest.mark.ch08_2
@pytest.mark.parametrize("shape", [(13,), (5, 7), (2, 3, 5)])
def test_masked_pointwise_kernel(shape, others):
    others("ops", "launch", "reduction")
    torch.manual_seed(1)
    x, w = randn(shape), randn(shape[-1])

    def f(x, w):
        return (x.permute(*reversed(range(x.dim()))) * 2).sin().permute(*reversed(range(x.dim()))) + w

    compiled = run(f, [x, w])
    src = kernel_source(compiled)
    expect_true("xmask" in src.split("xmask = xindex < xnumel", 1)[1], "loads/stores are masked", context=src)


@pytest.mark.ch08_2
def test_masked_reduction_kernel(others):
    others("ops", "launch", "reduction")
    torch.manual_seed(2)
    x, w = randn(6, 11), randn(11)
    run(lambda x, w: (x * w).sum(-1) + x.amax(-1), [x, w])


# --------------------------------------------------------------------------- 8.3


@pytest.mark.ch08_3
@pytest.mark.parametrize("shape", [(5, 7), (9, 16), (3, 100)])
def test_persistent_row_reductions(shape, others):
    others("ops", "memory", "launch")
    torch.manual_seed(3)
    x = -rand(shape) - 0.5  # all negative: a max that starts from 0 is wrong
    compiled = run(lambda x: (x.sum(-1), x.amax(-1), x.amin(-1)), [x], atol=1e-5, rtol=1e-5)
    expect_true(all("_per_" in k for k in compiled.kernels), "persistent reduction kernels",
                context=", ".join(compiled.kernels))


@pytest.mark.ch08_3
@pytest.mark.parametrize("shape", [(4, 10), (6, 33)])
def test_softmax_and_layernorm_fused(shape, others):
    others("ops", "memory", "launch")
    torch.manual_seed(4)
    x, w = randn(shape) * 3, randn(shape[-1])
    c1 = run(lambda x, w: torch.softmax(x * w, -1), [x, w])
    c2 = run(lambda x, w: torch.nn.functional.layer_norm(x, (shape[-1],), w, None), [x, w], atol=1e-5, rtol=1e-4)
    expect_equal((len(c1.kernels), len(c2.kernels)), (1, 1), "kernels for (softmax, layer_norm)")


@pytest.mark.ch08_3
def test_persistent_row_reductions_of_large_integers(others):
    """int64 rows near 2**58: a float identity would turn the row into floats, which cannot hold these values."""
    others("ops", "memory", "launch")
    torch.manual_seed(5)
    x = 2**58 + torch.randint(0, 1000, (3, 7), device=DEVICE)
    run(lambda x: (x.sum(-1), x.amax(-1), x.amin(-1)), [x])


# --------------------------------------------------------------------------- 8.4


@pytest.mark.ch08_4
@pytest.mark.parametrize("numel, rnumel, is_reduction", [
    (0, 1, False), (1, 1, False), (7, 1, False), (1000, 1, False), (5000, 1, False),
    (4, 10, True), (300, 33, True), (2, 1024, True), (10000, 8, True),
])
def test_launch_config_rules(numel, rnumel, is_reduction):
    xblock, rblock, warps, grid = ch.launch_config(numel, rnumel, is_reduction)
    what = f"launch_config({numel}, {rnumel}, {is_reduction}) = {(xblock, rblock, warps, grid)}"
    pow2 = lambda n: n >= 1 and n & (n - 1) == 0  # noqa: E731
    expect_true(pow2(xblock) and pow2(rblock), f"{what}: XBLOCK and RBLOCK must be powers of two")
    expect_true(grid * xblock >= numel, f"{what}: the grid does not cover all {numel} rows")
    expect_true(grid >= 1, f"{what}: a launch needs at least one program (an empty tensor launches one, fully masked)")
    expect_true(xblock * rblock <= ch.MAX_BLOCK_ELEMENTS, f"{what}: block over the register budget")
    expect_true(xblock < 2 * max(numel, 1), f"{what}: XBLOCK much larger than the work")
    expect_true(warps in (1, 2, 4, 8), f"{what}: num_warps must be 1, 2, 4 or 8")
    block = xblock * rblock
    expect_true(min(8, max(1, block // 512)) <= warps <= max(1, min(8, block // 128)),
                f"{what}: about one warp per 256 elements of the XBLOCK * RBLOCK block")
    if is_reduction:
        expect_true(rblock >= rnumel, f"{what}: a persistent reduction holds the whole row (RBLOCK >= rnumel)")
    else:
        expect_equal(rblock, 1, f"{what}: RBLOCK of a pointwise kernel")
        expect_true(xblock <= 1024, f"{what}: pointwise blocks are at most 1024 wide")


@pytest.mark.ch08_4
def test_launch_config_in_kernels(others):
    others("ops", "memory", "reduction")
    torch.manual_seed(5)
    x, y = randn(1100), randn(20, 37)
    run(lambda x, y: ((x * 2).sin(), y.softmax(-1)), [x, y])
