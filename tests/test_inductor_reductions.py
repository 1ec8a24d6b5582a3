"""Reductions (persistent and looped) and fusion around them, against eager, with kernel counts."""
import pytest
import torch
import torch.nn.functional as F

from tininductor import config
from tininductor.testing import DEVICE, check, compile_graph, patch_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def rand(*size, dtype=torch.float32):
    return torch.randn(size, device=DEVICE).to(dtype)


@pytest.fixture(params=["persistent", "looped", "looped_outer"])
def mode(request):
    # looped: force rows through RBLOCK=8 chunks so small tests exercise the loop code;
    # looped_outer: only column-wise reductions loop, over tiles of several columns
    limit = 4 if request.param == "looped" else 1024
    outer = 2 if request.param == "looped_outer" else 256
    with patch_config(config.triton, persistent_reduction_max=limit, looped_rblock=8, outer_persistent_max=outer):
        yield request.param


def test_sum_mean_amax_amin_last_dim(mode):
    x = rand(5, 19)
    check(lambda x: (x.sum(-1), x.mean(-1, keepdim=True), x.amax(-1), x.amin(1)), x, atol=1e-5, rtol=1e-5)


def test_reduce_other_dims_and_all(mode):
    x = rand(3, 4, 5)
    check(lambda x: (x.sum(0), x.sum((0, 2)), x.sum(), x.amax(1, keepdim=True), x.mean()), x, atol=1e-5, rtol=1e-5)


def test_var_and_prod(mode):
    x = rand(4, 9)
    check(lambda x: (x.var(-1), torch.var(x, 0, correction=0), x.prod(-1)), x, atol=1e-5, rtol=1e-4)


def test_reduction_dtypes(mode):
    h = rand(3, 33, dtype=torch.float16)
    check(lambda x: (x.sum(-1), x.amax(-1), x.float().mean(-1)), h, atol=1e-2, rtol=1e-2)
    i = torch.randint(-9, 9, (3, 10), device=DEVICE)
    check(lambda x: (x.sum(-1), x.amax(-1), (x > 0).sum(-1)), i)


def test_empty_and_single():
    check(lambda x: x.sum(-1), torch.zeros(3, 0, device=DEVICE))
    check(lambda x: (x.sum(), x.amax()), rand(1))


def test_nan_in_max():
    x = rand(2, 5)
    x[0, 3] = float("nan")
    check(lambda x: x.amax(-1), x)


def test_softmax_one_kernel(mode):
    check(lambda x: torch.softmax(x, -1), rand(6, 20), kernels=1)


def test_log_softmax_one_kernel(mode):
    check(lambda x: torch.log_softmax(x, -1), rand(6, 20), kernels=1)


def test_layer_norm_one_kernel(mode):
    w, b = rand(20), rand(20)
    check(lambda x: F.layer_norm(x, (20,), w, b), rand(6, 20), kernels=1, atol=1e-5, rtol=1e-4)


def test_sum_with_neighbours_one_kernel(mode):
    check(lambda x: ((x * 2).sin().sum(-1) + 1).exp(), rand(6, 20), kernels=1, atol=1e-5, rtol=1e-4)
    check(lambda x: x - x.mean(-1, keepdim=True), rand(6, 20), kernels=1, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [(512, 96), (300, 7), (4, 130, 50)])
def test_column_reductions_read_many_columns_per_program(shape):
    """A sum over rows (a bias gradient) loops over tiles of >= 16 neighbouring columns, so
    each row's loads are contiguous; one column per program would read a cache line per element."""
    x = rand(*shape)
    dims = tuple(range(x.dim() - 1))
    compiled = check(lambda x: (x.sum(dims), (x * x).mean(dims), x.amax(dims)), x, atol=1e-4, rtol=1e-4, kernels=1)
    assert "for roffset" in compiled.source and "triton_red_" in compiled.source
    xblock = int(compiled.source.split("XBLOCK=")[1].split(",")[0])
    assert xblock >= min(16, shape[-1])
    # the same reduction over contiguous rows stays persistent: only strided ones are tiled
    rows = x.reshape(-1, shape[-1]).t().contiguous()
    assert "triton_per_" in check(lambda r: r.sum(-1), rows, atol=1e-4, rtol=1e-4).source
    if rows.shape[-1] > config.triton.outer_persistent_max:
        strided = x.reshape(-1, shape[-1]).t()  # same values, reduced elements strided
        assert "triton_red_" in check(lambda r: r.sum(-1), strided, atol=1e-4, rtol=1e-4).source


def test_softmax_fp16():
    check(lambda x: torch.softmax(x, -1), rand(4, 30, dtype=torch.float16), kernels=1, atol=1e-3, rtol=1e-3)


def test_softmax_other_dim_correct():
    check(lambda x: torch.softmax(x, 0), rand(7, 5))


def test_wide_constants_are_typed():
    """A float64 constant is a float64 tensor in the kernel (a bare ``5.0`` is a float32 to Triton,
    and libdevice's float64 ``pow`` refuses the mix: a CompilationError on an H100), and an int64
    reduction bound is no int32 literal (a min over int64 indices next to int32 arithmetic)."""
    x = rand(6, 5, dtype=torch.float64).abs() + 0.5
    compiled = check(lambda x: (x ** 5.0).sum(-1) ** 0.2, x)
    assert "tl.full([], 5.0, tl.float64)" in compiled.source
    idx = torch.tensor([[3, 0, -1, 1, 2], [0, 1, 2, 3, 4], [1, -1, 0, 0, 0]], device=DEVICE)
    first_neg = lambda t: torch.where(t == -1, torch.arange(5, device=t.device), 5).amin(-1)  # noqa: E731
    compiled = check(first_neg, idx)
    assert "tl.full([], 9223372036854775807, tl.int64)" in compiled.source


@pytest.mark.parametrize("shape,dims", [((8, 3, 32, 32), (0, 2, 3)), ((16, 512, 6), (0, 1))])
@pytest.mark.parametrize("keepdim", [False, True])
def test_few_outputs_over_a_long_range_reduce_in_two_stages(shape, dims, keepdim):
    """Batch norm's per-channel statistics (3 outputs over 8192 elements) and a bias gradient's
    column sum (6 over 8192): one program per output would leave a GPU idle, so Triton reduces the
    inner dims per outer index first, then the partials. Every reduction type equals eager's; the
    C++ backend (which does not declare ``splits_reductions``) and ``config.split_reductions =
    False`` keep one kernel."""
    x = rand(*shape)
    for fn, tol in ((lambda x: x.sum(dims, keepdim=keepdim), 1e-4), (lambda x: x.amax(dims, keepdim=keepdim), 0),
                    (lambda x: x.amin(dims, keepdim=keepdim), 0),
                    (lambda x: (1 + x * 1e-3).prod(), 1e-5)):  # torch.prod takes one dim, or all
        split = compile_graph(fn, [x], "triton")
        torch.testing.assert_close(split(x), fn(x), atol=tol, rtol=tol)
        assert len(split.kernels) == 2, split.kernels
        with patch_config(config, split_reductions=False):
            assert len(compile_graph(fn, [x], "triton").kernels) == 1
        if DEVICE == "cpu":
            assert len(compile_graph(fn, [x], "cpp").kernels) == 1
    # enough outputs to fill the device, or too short a range: one stage
    assert len(compile_graph(lambda x: x.sum((0, 1)), [rand(8, 3, 40, 40)], "triton").kernels) == 1
    assert len(compile_graph(lambda x: x.sum((0, 2)), [rand(4, 3, 100)], "triton").kernels) == 1
