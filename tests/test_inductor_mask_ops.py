"""The small ops transformers models build position ids, attention masks and shifted decoder inputs
with: ``cumsum`` (a decomposition into a masked reduction over short axes), ``bitwise_and`` /
``bitwise_or`` on integer and bool tensors (lowerings), ``slice_scatter`` and ``copy`` (what
functionalization makes of ``y[:, 1:] = x[:, :-1]``; decompositions). Values and dtypes against
eager, on the C++ backend and the Triton interpreter, and no library call left in the generated code."""
import pytest
import torch

from tininductor import decompositions
from tininductor.testing import compile_graph

BACKENDS = ["cpp", "triton"]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


CUMSUM_CASES = {
    "int64 mask": (lambda: torch.ones(2, 8, dtype=torch.long), 1, None),
    "float middle dim": (lambda: torch.randn(3, 5, 4), 1, None),
    "float last dim": (lambda: torch.randn(3, 5, 4), -1, None),
    "bool to int64": (lambda: torch.rand(4, 6) < 0.5, 0, None),
    "int32 to int64": (lambda: torch.randint(0, 5, (3, 5), dtype=torch.int32), 1, None),
    "dtype argument": (lambda: torch.randn(7), 0, torch.float64),
    "bfloat16": (lambda: torch.randn(3, 5).bfloat16(), 1, None),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CUMSUM_CASES))
def test_cumsum_matches_eager(backend, case):
    make, dim, dtype = CUMSUM_CASES[case]
    x = make()
    fn = lambda x: torch.cumsum(x, dim, dtype=dtype)  # noqa: E731
    compiled = compile_graph(fn, [x], backend)
    out, ref = compiled(x), fn(x)
    assert out.dtype == ref.dtype
    tol = 1e-2 if x.dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    assert "aten.cumsum" not in compiled.source, compiled.source


def test_position_ids_fuse_into_one_kernel():
    """OPT's position ids: ``(cumsum(mask) * mask - 1).long()``: the scan and its pointwise tail are one kernel."""
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0
    fn = lambda m: (torch.cumsum(m, 1) * m - 1).long()  # noqa: E731
    compiled = compile_graph(fn, [mask], "cpp")
    torch.testing.assert_close(compiled(mask), fn(mask))
    assert len(compiled.kernels) == 1, compiled.source


def test_long_cumsum_stays_a_fallback(monkeypatch):
    """Past ``CUMSUM_MAX_LENGTH`` the quadratic form would cost more than the library's scan."""
    monkeypatch.setattr(decompositions, "CUMSUM_MAX_LENGTH", 4)
    x = torch.randn(2, 8)
    fn = lambda x: torch.cumsum(x, 1)  # noqa: E731
    compiled = compile_graph(fn, [x], "cpp")
    torch.testing.assert_close(compiled(x), fn(x))
    assert "aten.cumsum" in compiled.source


BITWISE_CASES = {
    "bool masks": (lambda: torch.rand(4, 6) < 0.5, lambda: torch.rand(4, 6) < 0.5),
    "int64 broadcast": (lambda: torch.randint(0, 9, (4, 6)), lambda: torch.randint(0, 9, (6,))),
    "bool and Python bool": (lambda: torch.rand(4, 6) < 0.5, lambda: True),
    "int32 and Python int": (lambda: torch.randint(0, 9, (4, 6), dtype=torch.int32), lambda: 5),
    "bool and int64": (lambda: torch.rand(4, 6) < 0.5, lambda: torch.randint(0, 4, (4, 6))),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", [torch.bitwise_and, torch.bitwise_or])
@pytest.mark.parametrize("case", list(BITWISE_CASES))
def test_bitwise_matches_eager(backend, op, case):
    a, b = (make() for make in BITWISE_CASES[case])
    if isinstance(b, torch.Tensor):
        fn, args = (lambda a, b: op(a, b)), [a, b]
    else:
        fn, args = (lambda a: op(a, b)), [a]
    compiled = compile_graph(fn, args, backend)
    out, ref = compiled(*args), fn(*args)
    assert out.dtype == ref.dtype and torch.equal(out, ref), (out, ref)
    assert "aten.bitwise" not in compiled.source, compiled.source


SCATTER_CASES = {
    "middle": (lambda x, s: torch.slice_scatter(x, s, 1, 1, 5), [(3, 6), (3, 4)]),
    "negative start, no end": (lambda x, s: torch.slice_scatter(x, s, 0, -2, None), [(5, 3), (2, 3)]),
    "last dim, no start": (lambda x, s: torch.slice_scatter(x, s, -1, None, 2), [(2, 3, 4), (2, 3, 2)]),
    "end past the length": (lambda x, s: torch.slice_scatter(x, s, 1, 0, 100), [(2, 3), (2, 3)]),
    "copy with broadcast and cast": (lambda x, s: torch.ops.aten.copy(x, s.double()), [(3, 4), (4,)]),
}


@pytest.mark.parametrize("case", list(SCATTER_CASES))
def test_slice_scatter_and_copy_match_eager(case):
    fn, shapes = SCATTER_CASES[case]
    args = [torch.randn(*s) for s in shapes]
    compiled = compile_graph(fn, args, "cpp")
    torch.testing.assert_close(compiled(*args), fn(*args))
    assert "# fallback" not in compiled.source, compiled.source


def test_slice_scatter_with_a_step_stays_a_fallback():
    fn = lambda x, s: torch.slice_scatter(x, s, 1, 1, 5, 2)  # noqa: E731
    args = [torch.randn(3, 6), torch.randn(3, 2)]
    compiled = compile_graph(fn, args, "cpp")
    torch.testing.assert_close(compiled(*args), fn(*args))
    assert "aten.slice_scatter" in compiled.source
