"""In-place view ops on intermediates (``as_strided_``, ``t_``) and ``as_strided``'s gradient.

ATen's ``adaptive_avg_pool2d`` restrides its output in place for a channels-last input (the
head of ConvNeXt and of channels-last ResNets); functionalization leaves such metadata
mutations in the graph, so ``decompose`` turns them into view ops (``functionalize_inplace_views``).
"""
import pytest
import torch
import torch.nn.functional as F

import tinydynamo

BACKENDS = ["aot_eager", "tininductor"]
BACKEND_UNDER_TEST = "aot_eager"


def _grads(fn, *args):
    leaves = [a.detach().clone().requires_grad_() for a in args]
    out = fn(*leaves)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(0)))
    return out.detach(), [leaf.grad for leaf in leaves]


def _check(fn, *args):
    expected, expected_grads = _grads(fn, *args)
    tinydynamo.reset()
    with tinydynamo.config.patch(suppress_errors=False):
        actual, actual_grads = _grads(tinydynamo.compile(fn, backend=BACKEND_UNDER_TEST), *args)
    torch.testing.assert_close(actual, expected)
    for a, e in zip(actual_grads, expected_grads):
        assert a is not None
        torch.testing.assert_close(a, e)


def _pool_head(x, w):
    y = (x * w).permute(0, 3, 1, 2)  # a channels-last activation, as after a ConvNeXt block
    return F.adaptive_avg_pool2d(y, 1).flatten(1).sin()


def _restride(x):
    y = x * 2
    y.t_()
    return y.cos()


def _as_strided(x):
    return (x + 1).as_strided((3, 2), (1, 3)).exp()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,shapes", [(_pool_head, [(2, 3, 3, 4), (4,)]), (_restride, [(3, 5)]),
                                       (_as_strided, [(2, 3)])], ids=["adaptive_pool_channels_last", "t_", "as_strided"])
def test_inplace_view_on_intermediate_matches_eager(backend, fn, shapes):
    global BACKEND_UNDER_TEST
    BACKEND_UNDER_TEST = backend
    torch.manual_seed(0)
    _check(fn, *[torch.randn(s) for s in shapes])
