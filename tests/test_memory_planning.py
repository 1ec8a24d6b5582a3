"""Memory planning in the wrapper: a buffer whose last reader has run is taken over by the next
allocation of the same layout (``buf4 = buf0; del buf0  # reuse``), never while something may still
read it, never for a graph output, and never when an extern kernel may return a view of it. Every
result is checked against eager."""
import re

import pytest
import torch

from tininductor.codegen.wrapper import _returns_new_memory
from tininductor.ir import ExternKernel
from tininductor.testing import DEVICE, compile_graph

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def chain(x, w):
    """Three pointwise kernels, each read only by the matmul after it: every one dies before the
    next is allocated, and all have one layout."""
    a = (x.sin() @ w).cos()
    b = (a @ w).tanh()
    return (b @ w).relu() + 1


def held(x, w):
    """``a`` is read again at the end: it must not be handed on while ``b`` and ``c`` are made."""
    a = x.sin()
    b = (a @ w).cos()
    c = (b @ w).tanh()
    return c * a


def call_body(compiled) -> str:
    source = compiled.source
    return source[source.index("def call("):source.index("def get_args")]


def reuses(compiled) -> list[tuple[str, str]]:
    """(new buffer, the dead buffer it took over), in order."""
    return re.findall(r"(buf\d+) = (buf\d+); del \2  # reuse", call_body(compiled))


def run(fn, *args, **options):
    compiled = compile_graph(fn, args, **options)
    out = compiled(*args)
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(out, fn(*args), atol=1e-4, rtol=1e-4)
    return compiled


def args():
    return torch.randn(8, 16, device=DEVICE), torch.randn(16, 16, device=DEVICE) / 4


def test_a_dead_buffer_is_taken_over_by_the_next_allocation_like_it():
    compiled = run(chain, *args())
    taken = reuses(compiled)
    assert taken, call_body(compiled)
    body = call_body(compiled)
    for new, old in taken:
        # not freed where it died: its del line no longer names it, and nothing reads it after the takeover
        after = body[body.index(f"{new} = {old}; del {old}"):]
        assert not re.search(rf"\b{old}\b", after.split("\n", 1)[1]), body
    assert not reuses(run(chain, *args(), reuse_buffers=False))


def test_a_buffer_read_later_is_not_handed_on():
    x, w = args()
    compiled = run(held, x, w)
    body = call_body(compiled)
    first = re.search(r"(buf\d+) = empty_strided\w*\(", body).group(1)  # sin(x), read by the last kernel
    assert all(old != first for _, old in reuses(compiled)), body


def test_graph_outputs_are_never_handed_on():
    def two_outputs(x, w):
        a = x.sin()
        return a, ((a @ w).cos() @ w).tanh()

    x, w = args()
    compiled = compile_graph(two_outputs, (x, w))
    first, second = compiled(x, w)
    expected = two_outputs(x, w)
    torch.testing.assert_close(first, expected[0])
    torch.testing.assert_close(second, expected[1], atol=1e-5, rtol=1e-4)
    returned = re.search(r"return \((buf\d+)", call_body(compiled)).group(1)
    assert all(old != returned for _, old in reuses(compiled)), call_body(compiled)


def test_a_takeover_never_raises_the_peak():
    """``a`` dies after the first matmul; the next allocation of its layout comes after a wide
    matmul's output has been live. Kept for it, ``a`` would be held across the graph's peak and
    add to it: so it is freed where it dies, and the allocation gets memory of its own."""
    def valley_then_peak(x, w, w_wide, w_back):
        a = x.sin()
        wide = (a @ w) @ w_wide  # (8, 4096): the graph's peak
        return (wide @ w_back).cos()  # allocated like ``a``, after the peak

    x, w = args()
    w_wide, w_back = torch.randn(16, 4096, device=DEVICE) / 4, torch.randn(4096, 16, device=DEVICE) / 64
    compiled = run(valley_then_peak, x, w, w_wide, w_back)
    body = call_body(compiled)
    assert not reuses(compiled), body
    assert body.count("empty_strided") == 2, body

    # the wide matmul after the takeover instead: holding ``a`` across the two matmuls stays under
    # the peak that comes later, so ``a`` is taken over
    def valley(x, w, w_wide, w_back):
        a = x.sin()
        b = ((a @ w) @ w).cos()  # allocated like ``a``
        return (b @ w_wide).sum(-1)  # (8, 4096): the graph's peak

    compiled = run(valley, x, w, w_wide, w_back)
    assert len(reuses(compiled)) == 1, call_body(compiled)


@pytest.mark.parametrize("op, fresh", [
    (torch.ops.aten.mm.default, True),
    (torch.ops.aten.convolution.default, True),
    (torch.ops.aten.view.default, False),  # its output is the input's memory
    (torch.ops.aten.as_strided.default, False),
    (None, False),  # a helper without a schema: assume it may alias
])
def test_only_an_extern_op_that_returns_new_memory_lets_its_inputs_be_handed_on(op, fresh):
    node = ExternKernel("buf1", None, "kernel", [], {}, "test", fn=op)
    assert _returns_new_memory(node) is fresh
