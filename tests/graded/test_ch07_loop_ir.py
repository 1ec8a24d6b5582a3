"""Graded tests for chapter 7: each piece runs inside tininductor and is compared with eager.

Kernels run in the Triton interpreter on CPU (tininductor.testing sets TRITON_INTERPRET=1).
"""
import pytest
import sympy
import torch

import tininductor.testing  # noqa: F401  (sets TRITON_INTERPRET=1 on CPU before any triton.jit)
from course import load
from course.chapters.ch07_loop_ir import (
    compile_aten,
    lower_and_schedule,
    use_fusion_check,
    use_lowering,
    use_read_writes,
    use_view_lowerings,
)
from course.testing import expect_close, expect_equal, expect_true
from tininductor import config, scheduler as package_scheduler
from tininductor.indexing import sym
from tininductor.testing import DEVICE, patch_config
from tininductor.virtualized import V


def randn(*size):
    """Random inputs on the device the kernels run on (the GPU when there is one)."""
    return torch.randn(*size, device=DEVICE)


ch = load("ch07")
aten = torch.ops.aten


def kernel_count(fn, args) -> int:
    """How many kernels the package's own scheduler makes for ``fn`` (the reference)."""
    _, sched = lower_and_schedule(fn, args, decompose=False)
    return sum(isinstance(n, package_scheduler.FusedGroup) for n in sched.nodes)


# --------------------------------------------------------------------------- 7.1


@pytest.mark.ch07_1
@pytest.mark.parametrize("shape, dtype", [((5, 7), torch.float32), ((33,), torch.float64), ((2, 3, 4), torch.float16),
                                          ((3, 40), torch.bfloat16), ((3, 1, 4), torch.float32)])
def test_silu_lowering_matches_eager(shape, dtype):
    torch.manual_seed(0)
    x = (randn(shape) * 4).to(dtype)

    def f(x):
        return torch.nn.functional.silu(x) + 1

    with use_lowering(aten.silu.default, ch.lower_silu):
        compiled = compile_aten(f, [x])
    expect_equal(compiled.fallback_reasons, [], "fallbacks (silu should be lowered, not called in torch)")
    expect_equal(len(compiled.kernels), 1, "kernels for silu(x) + 1 (one fused pointwise kernel)")
    # float64 is computed in float64 (float32 would be off by ~1e-8); half types in float32, rounded once like eager
    tolerance = {torch.float16: {"atol": 2e-3, "rtol": 2e-3}, torch.bfloat16: {"atol": 1e-2, "rtol": 8e-3},
                 torch.float64: {"atol": 1e-12, "rtol": 1e-12}}.get(dtype, {})
    expect_close(compiled(x), f(x), f"silu(x) + 1 for {dtype} {shape}", context=compiled.source, **tolerance)
    expect_equal(compiled(x).dtype, dtype, "result dtype")


# --------------------------------------------------------------------------- 7.2


@pytest.mark.ch07_2
def test_permute_reindex_on_symbols():
    a, b, c = sym("a"), sym("b"), sym("c")
    expect_equal(ch.permute_reindex((1, 0))([a, b]), [b, a], "permute (1, 0) of [a, b]")
    expect_equal(ch.permute_reindex((2, 0, 1))([a, b, c]), [b, c, a], "permute (2, 0, 1) of [a, b, c]")
    expect_equal(ch.expand_reindex([3, 1], [2, 3, 4])([a, b, c]), [b, 0], "expand [3, 1] -> [2, 3, 4] of [a, b, c]")
    s0 = sym("s0")  # a symbolic size (chapter 10): no Python comparison can say whether it is > 1
    expect_equal(ch.expand_reindex([1, 3], [s0, 3])([a, b]), [0, b], "expand [1, 3] -> [s0, 3] of [a, b]")
    expect_equal(ch.expand_reindex([s0, 1], [s0, 5])([a, b]), [a, 0], "expand [s0, 1] -> [s0, 5] of [a, b]")
    expect_equal(ch.permute_reindex((-1, 0, 1))([a, b, c]), [b, c, a],
                 "permute (-1, 0, 1) of [a, b, c] (a negative dim counts from the end, as in x.permute(-1, 0, 1))")
    expect_equal(ch.expand_reindex([1], [1, 5])([a, b]), [0],
                 "expand [1] -> [1, 5] of [a, b] (the size-1 dim grows to new's last dim, 5, not its first)")


@pytest.mark.ch07_2
@pytest.mark.parametrize("case", range(3))
def test_view_lowerings_match_eager(case):
    torch.manual_seed(case)
    x, y = randn(3, 4, 5), randn(4, 1)
    fns = [
        lambda x, y: x.permute(2, 0, 1) * 2 + 1,
        lambda x, y: (x.sin().permute(1, 2, 0), y.expand(3, 4, 6) - 1),
        lambda x, y: x.permute(0, 2, 1).cos() + y.permute(1, 0).expand(3, 5, 4),
    ]
    f = fns[case]
    with use_view_lowerings(ch.permute_reindex, ch.expand_reindex):
        compiled = compile_aten(f, [x, y])
    expect_close(compiled(x, y), f(x, y), f"views case {case}", context=compiled.source)


# --------------------------------------------------------------------------- 7.3


def _chain(x, w):
    y = ((x * 2).sin() + w).relu()
    return y, y * w - 1


def _softmax(x, w):
    return torch.softmax(x + w, dim=-1)


def _layernorm(x, w):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, None, 1e-5)


def _transposed_read(x, w):
    y = x + w
    for _ in range(11):  # a body this long is stored once, not recomputed in every reader
        y = (y * 0.9).sin()
    return y, y.permute(1, 0) * 2  # the second kernel reads y transposed: must not fuse


#: kernels the package's own scheduler makes for each function above, at any size (kernel_count is the
#: reference; tests/test_course_mechanics.py checks these against it): written down, since lowering a
#: function once more costs a grading run about a tenth of a second per function
KERNELS = {"_chain": 1, "_softmax": 1, "_layernorm": 1, "_transposed_read": 2}


@pytest.mark.ch07_3
@pytest.mark.parametrize("fn", [_chain, _softmax, _layernorm, _transposed_read], ids=lambda f: f.__name__[1:])
def test_fusion_check_in_scheduler(fn):
    torch.manual_seed(0)
    x, w = randn(12, 12), randn(12)
    expected_kernels = KERNELS[fn.__name__]
    with use_fusion_check(ch.fusion_is_legal), patch_config(config.triton, max_xblock=32, max_reduction_block=32):
        compiled = compile_aten(fn, [x, w])
        # the schedule, to show what was fused, only when the count is wrong (it is a second lowering)
        wrong = len(compiled.kernels) != expected_kernels
        context = str(lower_and_schedule(fn, [x, w], decompose=False)[1]) if wrong else ""
    expect_equal(len(compiled.kernels), expected_kernels, f"kernels for {fn.__name__[1:]}", context=context)
    expect_close(compiled(x, w), fn(x, w), f"{fn.__name__[1:]} with your fusion check (several programs)",
                 context=compiled.source)


@pytest.mark.ch07_3
def test_fusion_check_rejects_mismatched_sizes_and_indices():
    torch.manual_seed(0)
    x, w = randn(6, 8), randn(8)
    graph, sched = lower_and_schedule(_transposed_read, [x, w], decompose=False)
    buffers = [b for b in graph.buffers if hasattr(b, "data")]
    first, second = buffers[0], buffers[1]
    numel = first.get_numel()
    bad = package_scheduler.FusedGroup(first.get_device(), numel, 1, False, [first, second])
    expect_equal(ch.fusion_is_legal(bad), False, "transposed read of a buffer written in the same kernel")
    ok = package_scheduler.FusedGroup(first.get_device(), numel, 1, False, [first])
    expect_equal(ch.fusion_is_legal(ok), True, "a single pointwise node")
    graph, _ = lower_and_schedule(lambda x, w: (x + w, x.sum(0) * 3), [x, w], decompose=False)
    a, b = [b for b in graph.buffers if hasattr(b, "data")][:2]
    mixed = package_scheduler.FusedGroup(a.get_device(), a.get_numel(), 1, False, [a, b])
    expect_equal(ch.fusion_is_legal(mixed), False, "a reduction in a pointwise kernel (no kind fits)")
    graph, _ = lower_and_schedule(lambda x, w: (x + w, x.sum(1)), [x, w], decompose=False)
    reduction, pointwise = sorted([b for b in graph.buffers if hasattr(b, "data")][:2],
                                  key=lambda b: type(b.data).__name__ != "Reduction")
    mixed = package_scheduler.FusedGroup(pointwise.get_device(), pointwise.get_numel(), 1, False, [pointwise, reduction])
    expect_equal(ch.fusion_is_legal(mixed), False,
                 "x + w then x.sum(1) in one pointwise kernel (the second node, a reduction, fits no kind)")
    alone = package_scheduler.FusedGroup(b.get_device(), a.get_numel(), 1, False, [b])
    expect_equal(ch.fusion_is_legal(alone), False, "a reduction alone in a pointwise kernel (no kind fits, even for one node)")


def _reads_after_a_legal_one(x, w):
    y = x + w
    for _ in range(11):  # stored once (see _transposed_read)
        y = (y * 0.9).sin()
    return y, x * y.permute(1, 0), y * 3  # the middle node reads x, then y transposed; the last reads y as written


@pytest.mark.ch07_3
def test_fusion_check_reads_every_read_of_every_node():
    torch.manual_seed(0)
    x, w = randn(8, 8), randn(8)
    graph, _ = lower_and_schedule(_reads_after_a_legal_one, [x, w], decompose=False)
    y, middle, last = [b for b in graph.buffers if hasattr(b, "data")][:3]
    bad = package_scheduler.FusedGroup(y.get_device(), y.get_numel(), 1, False, [y, middle, last])
    expect_equal(ch.fusion_is_legal(bad), False,
                 "y, then x * y.permute(1, 0), then y * 3 in one kernel: the middle node's second read "
                 "(y transposed) is illegal, though its first read and the last node's reads are fine")


# --------------------------------------------------------------------------- 7.4


def _record(handler_cls, node):
    handler = handler_cls()
    index = [sym(f"i{d}") for d in range(len(node.get_ranges()))]
    rindex = [sym(f"r{d}") for d in range(len(node.get_reduction_ranges()))]
    with V.set_ops_handler(handler):
        node.store_body(index, rindex)
    return handler


@pytest.mark.ch07_4
@pytest.mark.parametrize("fn", [_softmax, _layernorm, _transposed_read], ids=lambda f: f.__name__[1:])
def test_read_writes_match_package(fn):
    x, w = randn(6, 8), randn(8)
    graph, _ = lower_and_schedule(fn, [x, w], decompose=False)
    for node in graph.buffers:
        if not hasattr(node, "store_body"):
            continue
        yours, ref = _record(ch.ReadWritesHandler, node), _record(package_scheduler.ReadWrites, node)
        expect_equal(sorted(map(str, yours.reads)), sorted(map(str, ref.reads)), f"reads of {node.get_name()}",
                     context=repr(node))
        expect_equal([(n, sympy.expand(i)) for n, i in yours.writes], ref.writes, f"writes of {node.get_name()}",
                     context=repr(node))


@pytest.mark.ch07_4
@pytest.mark.parametrize("fn", [_softmax, _transposed_read], ids=lambda f: f.__name__[1:])
def test_read_writes_drive_the_scheduler(fn):
    torch.manual_seed(1)
    x, w = randn(12, 12), randn(12)
    expected_kernels = KERNELS[fn.__name__]
    with use_read_writes(ch.ReadWritesHandler), patch_config(config.triton, max_xblock=32, max_reduction_block=32):
        compiled = compile_aten(fn, [x, w])
    expect_true(len(compiled.kernels) == expected_kernels,
                f"kernels with your dependencies: yours {len(compiled.kernels)} vs expected {expected_kernels}",
                context=compiled.source)
    expect_close(compiled(x, w), fn(x, w), f"{fn.__name__[1:]} scheduled with your read/write sets",
                 context=compiled.source)


@pytest.mark.ch07_4
def test_read_writes_handler_records_every_access_normalised():
    i0, r0 = sym("i0"), sym("r0")
    handler = ch.ReadWritesHandler()
    a = handler.load("buf0", (i0 + 1) * (r0 + 2))
    b = handler.load("buf0", i0 * r0 + 2 * i0 + r0 + 2)  # the same element, loaded twice: two reads
    handler.load("buf1", i0)
    handler.store("buf2", i0 * (2 + r0), handler.add(a, b))
    expect_equal(handler.reads, [("buf0", i0 * r0 + 2 * i0 + r0 + 2)] * 2 + [("buf1", i0)],
                 "reads, in order, with sympy.expand'ed indices")
    expect_equal(handler.writes, [("buf2", 2 * i0 + i0 * r0)], "writes with sympy.expand'ed indices")
