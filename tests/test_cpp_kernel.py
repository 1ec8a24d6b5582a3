"""C++ kernels built directly with CppKernel (no lowering), run through g++/ctypes, checked against eager.

Each helper plays the part of the lowering: it writes the index arithmetic for strided and
broadcast inputs, then calls the kernel's ops. Shapes cover 0-size, 1-element, odd sizes,
non-contiguous and broadcast inputs; dtypes fp32/fp64/fp16/bf16/int64/bool.
"""

import pytest
import sympy
import torch

from tininductor.codegen import cpp
from tininductor.codegen.cpp import CppKernel, CppKernelRunner


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    # one cache per test session: identical kernels across tests are compiled once
    monkeypatch.setenv("TINY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tiny_cache"))


def strided_index(t: torch.Tensor, index, out_shape):
    """Flat storage index of ``t`` (broadcast against out_shape) at the output ``index``."""
    nd = len(out_shape)
    sizes = [1] * (nd - t.dim()) + list(t.shape)
    strides = [0] * (nd - t.dim()) + list(t.stride())
    return sum((i * st for i, s, st in zip(index, sizes, strides) if s != 1), sympy.Integer(0))


def run_kernel(kernel: CppKernel, buffers: dict, name="cpp_test_kernel_0"):
    source = kernel.codegen(name, origins=["test"])
    runner = CppKernelRunner(name, source, kernel.arg_order)
    runner(*[buffers[n] for n in kernel.arg_order])
    return source


def pointwise(ops, *inputs, out_dtypes=None):
    """outs[k] = ops[k](*inputs) elementwise with broadcasting: one C++ kernel, one output per op."""
    ops = [ops] if isinstance(ops, str) else list(ops)
    shape = torch.broadcast_shapes(*[t.shape for t in inputs])
    out_dtypes = out_dtypes or [inputs[0].dtype] * len(ops)
    outs = [torch.empty(shape, dtype=dt) for dt in out_dtypes]
    k = CppKernel(list(shape))
    k.buffer_dtypes = {f"in{i}": t.dtype for i, t in enumerate(inputs)}
    k.buffer_dtypes |= {f"out{j}": dt for j, dt in enumerate(out_dtypes)}
    with k.loop() as (x, _):
        vals = [k.load(f"in{i}", strided_index(t, x, shape)) for i, t in enumerate(inputs)]
        for j, op in enumerate(ops):
            k.store(f"out{j}", strided_index(outs[j], x, shape), getattr(k, op)(*vals))
    source = run_kernel(k, {**{f"in{i}": t for i, t in enumerate(inputs)}, **{f"out{j}": o for j, o in enumerate(outs)}})
    return (outs[0] if len(outs) == 1 else outs), source


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "log1p": torch.log1p,
    "expm1": torch.expm1, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
    "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf,
    "sign": torch.sign, "relu": torch.relu, "floor": torch.floor, "ceil": torch.ceil,
}


def test_unary_fp32_all_ops_one_kernel():
    x = torch.randn(5, 7) * 3
    x[0, 0], x[0, 1], x[0, 2] = float("nan"), 0.0, float("inf")
    x = x.t()  # non-contiguous input
    outs, source = pointwise(sorted(UNARY), x)
    for op, out in zip(sorted(UNARY), outs):
        torch.testing.assert_close(out, UNARY[op](x), equal_nan=True, msg=lambda m: f"{op}: {m}")
    assert "#pragma omp simd" in source


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.div, "pow": torch.pow,
    "maximum": torch.maximum, "minimum": torch.minimum, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt,
    "le": torch.le, "gt": torch.gt, "ge": torch.ge,
}


def test_binary_broadcast_noncontiguous_all_ops_one_kernel():
    a = torch.randn(6, 5).t()                 # non-contiguous (5, 6)
    b = torch.randn(6)                        # broadcast over rows
    b[1] = float("nan")
    a[2, 3] = float("inf")
    names = sorted(BINARY)
    expected = [BINARY[op](a, b) for op in names]
    outs, _ = pointwise(names, a, b, out_dtypes=[e.dtype for e in expected])
    for op, out, exp in zip(names, outs, expected):
        torch.testing.assert_close(out, exp, equal_nan=True, msg=lambda m: f"{op}: {m}")


@pytest.mark.parametrize("shape", [(0,), (1, 1), (3, 0, 2), (7, 13, 3), (100003,)])
def test_shapes(shape):
    a, b = torch.randn(shape), torch.randn(shape)
    out, _ = pointwise("add", a, b)
    torch.testing.assert_close(out, a + b)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_float_dtypes(dtype):
    a, b = torch.randn(9, 11, dtype=dtype), torch.randn(11, dtype=dtype)
    out, source = pointwise("mul", a, b)
    torch.testing.assert_close(out, a * b)
    if dtype != torch.float64:
        assert "uint16_t" in source and "tiny_float_to_" in source  # stored as 16 bits, computed in float


def test_half_conversion_special_values():
    specials = torch.tensor([0.0, -0.0, 1e-8, 6e-8, 1e-5, 65504.0, 65520.0, 1e6, float("inf"),
                             float("-inf"), float("nan"), 1 / 3, -2.5e-7, 0.1])
    for dtype in (torch.float16, torch.bfloat16):
        k = CppKernel([specials.numel()])
        k.buffer_dtypes = {"x": torch.float32, "y": dtype, "z": torch.float32}
        with k.loop() as (x, _):
            k.store("y", x[0], k.load("x", x[0]))
        with k.loop() as (x, _):
            k.store("z", x[0], k.load("y", x[0]))
        y, z = torch.empty(specials.shape, dtype=dtype), torch.empty(specials.shape)
        run_kernel(k, {"x": specials, "y": y, "z": z})
        assert torch.equal(y.view(torch.int16), specials.to(dtype).view(torch.int16)) or torch.equal(
            y.isnan(), specials.isnan()) and torch.equal(y[~y.isnan()], specials.to(dtype)[~y.isnan()])
        torch.testing.assert_close(z, specials.to(dtype).float(), equal_nan=True, rtol=0, atol=0)


def test_int64_and_bool():
    a = torch.randint(-50, 50, (4, 9))
    b = torch.randint(-5, 5, (9,))
    (prod, mx, ge), _ = pointwise(["mul", "maximum", "ge"], a, b, out_dtypes=[torch.int64] * 2 + [torch.bool])
    assert torch.equal(prod, a * b) and torch.equal(mx, torch.maximum(a, b)) and torch.equal(ge, a >= b)
    p, q = torch.rand(8, 3) > 0.5, torch.rand(3) > 0.5
    (conj, disj, ne), _ = pointwise(["logical_and", "logical_or", "ne"], p, q)
    assert torch.equal(conj, p & q) and torch.equal(disj, p | q) and torch.equal(ne, p != q)


def test_where_and_constants():
    x = torch.randn(33)
    out = torch.empty(33)
    k = CppKernel([33])
    k.buffer_dtypes = {"x": torch.float32, "out": torch.float32}
    with k.loop() as (i, _):
        v = k.load("x", i[0])
        neg_inf = k.constant(float("-inf"), torch.float32)
        k.store("out", i[0], k.where(k.gt(v, k.constant(0.5, torch.float32)), v, neg_inf))
    run_kernel(k, {"x": x, "out": out})
    torch.testing.assert_close(out, torch.where(x > 0.5, x, float("-inf")))


def test_index_expr_arange_and_floordiv_indexing():
    from tininductor.codegen.cpp import cpp_index
    rows, cols = 6, 5
    out = torch.empty(rows * cols, dtype=torch.int64)
    k = CppKernel([rows * cols])
    k.buffer_dtypes = {"out": torch.int64}
    with k.loop() as (x, _):
        # (x // cols) * 100 + x % cols, written with floor and Mod as sympy would
        k.store("out", x[0], k.index_expr(sympy.floor(x[0] / cols) * 100 + sympy.Mod(x[0], cols), torch.int64))
    run_kernel(k, {"out": out})
    idx = torch.arange(rows * cols)
    assert torch.equal(out, idx // cols * 100 + idx % cols)
    assert cpp_index(sympy.Integer(3)) == "3"


# ------------------------------------------------------------------------------ reductions
def reduce_last(kinds, x, out_dtypes=None):
    """outs[k][i] = kinds[k](x[i, :]) over the last dim of 2-D ``x`` (maybe strided): one kernel."""
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    rows, cols = x.shape
    out_dtypes = out_dtypes or [x.dtype] * len(kinds)
    outs = [torch.empty(rows, dtype=dt) for dt in out_dtypes]
    k = CppKernel([rows])
    k.buffer_dtypes = {"x": x.dtype} | {f"out{j}": dt for j, dt in enumerate(out_dtypes)}
    for j, kind in enumerate(kinds):
        with k.loop([cols]) as (i, r):
            v = k.load("x", i[0] * x.stride(0) + r[0] * x.stride(1))
            k.store(f"out{j}", i[0], k.reduction(out_dtypes[j], x.dtype, kind, v))
    source = run_kernel(k, {"x": x} | {f"out{j}": o for j, o in enumerate(outs)})
    return (outs[0] if len(outs) == 1 else outs), source


EAGER_REDUCE = {
    "sum": lambda x: x.sum(-1), "max": lambda x: x.amax(-1), "min": lambda x: x.amin(-1),
    "prod": lambda x: x.prod(-1), "argmax": lambda x: x.argmax(-1), "argmin": lambda x: x.argmin(-1),
}


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (64, 1000), (1, 70000)])
def test_reductions_fp32(shape):
    x = torch.randn(shape)
    if shape[1] > 3:
        x[0, 2] = float("nan")
    kinds = sorted(EAGER_REDUCE)
    expected = [EAGER_REDUCE[kind](x if kind != "prod" else 1 + x * 0.001) for kind in kinds]
    # prod gets its own input scaling: run it separately when it is in the list
    outs, source = reduce_last([k for k in kinds if k != "prod"], x,
                               out_dtypes=[e.dtype for k, e in zip(kinds, expected) if k != "prod"])
    for kind, out, exp in zip([k for k in kinds if k != "prod"], outs, [e for k, e in zip(kinds, expected) if k != "prod"]):
        torch.testing.assert_close(out, exp, equal_nan=True, msg=lambda m: f"{kind}: {m}")
    if shape == (3, 17):
        out, _ = reduce_last("prod", 1 + x * 0.001)
        torch.testing.assert_close(out, expected[kinds.index("prod")], equal_nan=True)
    if shape == (64, 1000):
        assert "#pragma omp parallel for" in source and "simd reduction(+:" in source
    if shape == (1, 70000):
        assert "parallel for simd reduction" in source  # a single row: the reduction loop is parallel


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.bool])
def test_reduction_dtypes(dtype):
    x = torch.randn(7, 301).to(dtype) if dtype != torch.bool else torch.rand(7, 301) > 0.3
    sum_dtype = torch.int64 if dtype in (torch.int64, torch.bool) else dtype
    low = dtype in (torch.float16, torch.bfloat16)
    if dtype == torch.bool:
        out, _ = reduce_last("sum", x, out_dtypes=[sum_dtype])
        torch.testing.assert_close(out, x.sum(-1))
        return
    (total, mx), _ = reduce_last(["sum", "max"], x, out_dtypes=[sum_dtype, dtype])
    torch.testing.assert_close(total, x.sum(-1), rtol=1e-2 if low else None, atol=1e-2 if low else None)
    torch.testing.assert_close(mx, x.amax(-1))


def test_reduction_noncontiguous_and_empty():
    x = torch.randn(40, 9).t()                # rows stride 1, cols stride 9
    out, _ = reduce_last("sum", x)
    torch.testing.assert_close(out, x.sum(-1))
    empty = torch.randn(4, 0)
    out, _ = reduce_last("sum", empty)
    torch.testing.assert_close(out, empty.sum(-1))
    out, _ = reduce_last("sum", torch.randn(0, 5))
    assert out.shape == (0,)


def test_softmax_one_kernel_three_loops():
    R, C = 37, 129
    x = torch.randn(R, C)
    mx, sm, out = torch.empty(R), torch.empty(R), torch.empty(R, C)
    k = CppKernel([R])
    k.buffer_dtypes = {"x": torch.float32, "mx": torch.float32, "sm": torch.float32, "out": torch.float32}
    with k.loop([C]) as (i, r):
        k.store("mx", i[0], k.reduction(torch.float32, torch.float32, "max", k.load("x", i[0] * C + r[0])))
    with k.loop([C]) as (i, r):
        e = k.exp(k.sub(k.load("x", i[0] * C + r[0]), k.load("mx", i[0])))
        k.store("sm", i[0], k.reduction(torch.float32, torch.float32, "sum", e))
    with k.loop([C]) as (i, r):
        e = k.exp(k.sub(k.load("x", i[0] * C + r[0]), k.load("mx", i[0])))
        k.store("out", i[0] * C + r[0], k.truediv(e, k.load("sm", i[0])))
    source = run_kernel(k, {"x": x, "mx": mx, "sm": sm, "out": out}, name="cpp_fused_softmax_0")
    torch.testing.assert_close(out, torch.softmax(x, -1))
    assert source.count('extern "C"') == 1 and source.count("for (int64_t r") == 3


def test_mean_epilogue_uses_reduction_result():
    """Ops on a reduction result (sum / n) land after the loop, not inside it."""
    x = torch.randn(5, 12)
    out = torch.empty(5)
    k = CppKernel([5])
    k.buffer_dtypes = {"x": torch.float32, "out": torch.float32}
    with k.loop([12]) as (i, r):
        s = k.reduction(torch.float32, torch.float32, "sum", k.load("x", i[0] * 12 + r[0]))
        k.store("out", i[0], k.truediv(s, k.constant(12.0, torch.float32)))
    run_kernel(k, {"x": x, "out": out})
    torch.testing.assert_close(out, x.mean(-1))


def test_kernel_name_and_errors():
    assert cpp.kernel_name(["add", "sin", "add"], 0) == "cpp_fused_add_sin_0"
    k = CppKernel([4])
    with pytest.raises(AttributeError, match="CPP_OPS"):
        k.not_an_op
    with pytest.raises(RuntimeError, match="kernel.loop"):
        k.load("x", 0, dtype=torch.float32)


def test_math_calls_vectorise_with_libmvec():
    """Where glibc's libmvec links, exp in a simd loop calls its 8-lane version (_ZGV...expf)."""
    from tininductor import cpp_builder

    if "-lmvec" not in cpp_builder.link_flags():
        pytest.skip("no libmvec on this machine: math calls stay scalar (still correct)")
    k = CppKernel([1000])
    k.buffer_dtypes = {"x": torch.float32, "y": torch.float32}
    with k.loop() as (i, _):
        k.store("y", i[0], k.exp(k.load("x", i[0])))
    runner = CppKernelRunner("cpp_test_exp_0", k.codegen("cpp_test_exp_0"), k.arg_order)
    x, y = torch.randn(1000), torch.empty(1000)
    runner(x, y)
    torch.testing.assert_close(y, x.exp())
    assert b"_ZGV" in runner.library_path.read_bytes()


def test_launcher_passes_pointers_and_sizes_and_raises_index_errors():
    """load_cpp_kernel's launcher: one parameter per pointer and size, the runner's checks kept."""
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    k = CppKernel([s0])
    k.buffer_dtypes = {"x": torch.float32, "y": torch.float32}
    with k.loop() as (i, _):
        k.store("y", i[0], k.add(k.load("x", i[0]), k.constant(1.0, torch.float32)))
    source = "\n".join(k.codegen("cpp_test_launch_0").splitlines()).replace(
        "float* __restrict__ out_ptr0)", "float* __restrict__ out_ptr0, const int64_t s0)")
    launch = cpp.load_cpp_kernel("cpp_test_launch_0", 2, source, nsizes=1)
    assert launch.__name__ == "cpp_test_launch_0" and launch.runner.arg_order == ["arg0", "arg1"]
    for n in (0, 1, 7):
        x, y = torch.randn(n), torch.full((n,), -5.0)
        launch(x, y, n)
        torch.testing.assert_close(y, x + 1)
    with pytest.raises(TypeError):
        launch(x, y)   # the size is missing

    k = CppKernel([2])
    k.buffer_dtypes = {"w": torch.float32, "i": torch.int64, "y": torch.float32}
    with k.loop() as (j, _):
        row = k.indirect_indexing(k.load("i", j[0]), 3)
        k.store("y", j[0], k.load("w", row))
    launch = cpp.load_cpp_kernel("cpp_test_gather_0", 3, k.codegen("cpp_test_gather_0"))
    w, y = torch.randn(3), torch.empty(2)

    def call(i):
        return launch(*[{"w": w, "i": i, "y": y}[name] for name in k.arg_order])

    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension with size 3"):
        call(torch.tensor([0, 3]))
    call(torch.tensor([2, -1]))   # the error was reported once; negative indices wrap
    torch.testing.assert_close(y, w[[2, -1]])
