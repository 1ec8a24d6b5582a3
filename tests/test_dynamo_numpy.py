"""NumPy in compiled frames: arrays are tensor nodes, NumPy calls on them graph ops (torch._numpy);
results have NumPy's types; what the graph cannot keep (NumPy's RNG, arrays met by torch ops, tensors
NumPy refuses) breaks the graph and runs natively, as eager does."""
import numpy as np
import pytest
import torch

import tinydynamo
from tinydynamo.exc import Unsupported
from tinydynamo.testing import CompileCounter
from tinydynamo.variables.numpy import NumpyOp


def compiled(fn, backend=None, nopython=True):
    tinydynamo.reset()
    cnt = CompileCounter()
    return tinydynamo.optimize(backend or cnt, nopython=nopython)(fn), cnt


def assert_numpy_equal(got, expected):
    """Same structure, same NumPy types (scalar vs 0-d array, dtype), close values."""
    if isinstance(expected, (tuple, list)):
        assert type(got) is type(expected) and len(got) == len(expected)
        for g, e in zip(got, expected):
            assert_numpy_equal(g, e)
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected)
    else:
        assert type(got) is type(expected), (type(got), type(expected))
        if isinstance(expected, (np.ndarray, np.generic)):
            assert got.dtype == expected.dtype and np.shape(got) == np.shape(expected)
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        else:
            assert got == expected


def test_numpy_calls_on_arrays_are_one_graph_with_numpys_result_types():
    def f(x, y):
        a = x.numpy()
        m = np.mean(a, 1)
        r1, r2 = np.meshgrid(m, y.numpy()[0])
        return (np.sum(m), np.asarray(np.sum(m)), a.max(axis=0), a.T.copy(), -abs(a) + 2 * a,
                np.linalg.norm(a, axis=0), np.fft.fftshift(a), a[0, 1], a[0], a.shape, a.strides, a.dtype,
                torch.from_numpy(r1 + r2), np.ones_like(x, dtype=np.float64), a.sum() + 1.0)

    fn, cnt = compiled(f)
    for _ in range(2):
        x, y = torch.randn(3, 4), torch.randn(2, 5)
        assert_numpy_equal(fn(x, y), f(x, y))
    assert cnt.frame_count == 1
    ops = [n.target for n in cnt.graphs[0].graph.nodes if n.op == "call_function"]
    assert sum(isinstance(t, NumpyOp) for t in ops) >= 12


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_arrays_share_memory_with_tensors_and_inputs(backend):
    """``x.numpy()`` is a view of ``x`` and an ndarray argument is written in place, as in eager."""
    def f(x, arr, idx, val):
        a = x.numpy()
        a += 1
        arr[idx] = val
        return x, arr, torch.from_numpy(a)

    fn, _ = compiled(f, backend)
    for idx in (np.s_[...], np.s_[0, ...], np.s_[..., 1]):
        x, arr, val = torch.zeros(2, 2), np.array([[1, 1], [2, 2]]), np.array([3, 3])
        x2, arr2 = x.clone(), arr.copy()
        got = fn(x, arr, idx, val)
        expected = f(x2, arr2, idx, val)
        assert got[1] is arr  # the caller's array, changed in place
        np.testing.assert_array_equal(arr, arr2)
        torch.testing.assert_close(x, x2)
        torch.testing.assert_close(got[2], expected[2])


def test_what_numpy_or_torch_would_reject_runs_natively():
    w = torch.randn(3, requires_grad=True)

    def needs_grad(x):
        return np.sin(x.detach().numpy() if not x.requires_grad else x.numpy())

    with pytest.raises(RuntimeError, match="requires grad"):  # eager's error, from the native call
        compiled(needs_grad, nopython=False)[0](w)
    with pytest.raises(Unsupported):
        compiled(needs_grad)[0](w)

    def mixed(x):  # a tensor with an array: torch's or NumPy's operator decides, natively
        return x + x.numpy()

    x = torch.randn(3)
    fn, cnt = compiled(mixed, nopython=False)
    torch.testing.assert_close(fn(x), mixed(x))
    with pytest.raises(Unsupported, match="NumPy array and a tensor"):
        compiled(mixed)[0](x)

    def torch_op(x):
        return torch.add(x, x.numpy())

    with pytest.raises(Unsupported, match="NumPy array passed to add"):
        compiled(torch_op)[0](x)


def test_numpy_random_draws_from_numpys_generator():
    def f(x):
        return x + torch.from_numpy(np.random.randn(3))

    x = torch.zeros(3, dtype=torch.float64)
    np.random.seed(0)
    expected = f(x)
    fn, cnt = compiled(f, nopython=False)
    np.random.seed(0)
    torch.testing.assert_close(fn(x), expected)
    with pytest.raises(Unsupported, match="numpy"):
        compiled(f)[0](x)


def test_numpy_dtypes_and_limits_are_guarded_constants():
    def f(a, dt):
        return a + np.finfo(dt).max / 2 + np.iinfo(np.int16).min

    fn, cnt = compiled(f)
    a = torch.zeros(3, dtype=torch.float64)
    for dt in (np.float32, np.dtype("float32"), "float32", np.ones(1, np.float32).dtype):
        torch.testing.assert_close(fn(a, dt), f(a, dt))
    assert cnt.frame_count == 3  # the class np.float32, a dtype equal to it (twice), a string
    torch.testing.assert_close(fn(a, np.dtype("float16")), f(a, np.dtype("float16")))
    assert cnt.frame_count == 4

    def g(a, info):
        return a * info.eps

    gn, cnt = compiled(g)
    for info in (np.finfo(np.float32), np.finfo(np.dtype("float32")), np.finfo(np.float64)):
        torch.testing.assert_close(gn(a, info), g(a, info))
    assert cnt.frame_count == 2
