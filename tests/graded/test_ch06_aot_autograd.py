"""Graded tests for chapter 6: each piece runs inside tininductor's AOT autograd and the gradients
are compared with eager autograd (float64)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from course import load
from course.models import TinyBlock
from course.testing import expect_close, expect_equal, expect_true
from tininductor.aot_autograd import aot_autograd, run_with_torch_ops
from tininductor.decompositions import decompose, fake_inputs
from tininductor.joint_graph import create_joint
from tininductor.partitioners import default_partition, partition_with_saved
from tininductor.vjp_rules import VJP_RULES

ch = load("ch06")
aten = torch.ops.aten


def _joint(fn, inputs, **plug):
    fakes, mode = fake_inputs(inputs)
    return create_joint(decompose(fn, fakes), fakes, [x.requires_grad for x in inputs], mode, **plug)


def _check_joint_grads(fn, inputs, what, rules=None, **plug):
    """Run the joint graph built with your piece (``rules``: VJP rules swapped into the registry);
    compare outputs and grads with eager autograd."""
    with VJP_RULES.swap(rules or {}):
        joint = _joint(fn, inputs, **plug)
    outs = fn(*inputs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    torch.manual_seed(1)
    tangents = [torch.randn_like(o) for o, d in zip(outs, joint.diff_outputs) if d]
    got = joint.gm(list(inputs), tangents)
    diff_inputs = [x for x in inputs if x.requires_grad]
    want = torch.autograd.grad([o for o, d in zip(outs, joint.diff_outputs) if d], diff_inputs, tangents,
                               allow_unused=True)
    expect_close(list(got[: joint.num_outputs]), outs, f"{what}: forward outputs", context=joint.gm.code)
    got_grads = iter(got[joint.num_outputs:])
    for i, (w, has) in enumerate(zip(want, [m for m, x in zip(joint.grad_mask, inputs) if x.requires_grad])):
        expect_true(has == (w is not None), f"{what}: input {i} should {'' if w is not None else 'not '}get a grad")
        if has:
            expect_close(next(got_grads), w, f"{what}: gradient of input {i}", context=joint.gm.code)


def _f64(*shape):
    return torch.randn(shape, dtype=torch.float64, requires_grad=True)


# --------------------------------------------------------------------------- 6.1
@pytest.mark.ch06_1
@pytest.mark.parametrize("grad_shape, shape", [((2, 3, 4), (4,)), ((2, 3, 4), (3, 1)), ((2, 3, 4), (1, 3, 1)),
                                               ((5, 2), (5, 2)), ((6,), ()), ((2, 1, 4), (1, 1))])
def test_sum_to_size_matches_autograd(grad_shape, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(grad_shape, dtype=torch.float64)
    (want,) = torch.autograd.grad(x.expand(grad_shape), x, grad)
    got = ch.sum_to_size(grad, shape)
    expect_equal(tuple(got.shape), tuple(shape), f"shape of sum_to_size({list(grad_shape)} -> {list(shape)})")
    expect_close(got, want, f"sum_to_size({list(grad_shape)} -> {list(shape)})")


@pytest.mark.ch06_1
def test_sum_to_size_inside_the_add_rule():
    def add_vjp(grad, out, a, b, alpha=1):
        size = lambda g, x: ch.sum_to_size(g, x.shape) if isinstance(x, torch.Tensor) else None  # noqa: E731
        return size(grad, a), size(grad if alpha == 1 else aten.mul(grad, alpha), b)

    torch.manual_seed(0)
    _check_joint_grads(lambda a, b, c: (a + b) * (b + c), [_f64(2, 3, 4), _f64(3, 1), _f64(4)],
                       "(a + b) * (b + c) with your sum_to_size in the add rule",
                       rules={aten.add: add_vjp})


# --------------------------------------------------------------------------- 6.2
@pytest.mark.ch06_2
@pytest.mark.parametrize("shapes", [[(3, 4), (3, 4)], [(2, 3, 4), (4,)], [(3, 1), (1, 5)], [(4,), ()]])
def test_mul_vjp_with_broadcasting(shapes):
    torch.manual_seed(0)
    inputs = [_f64(*s) for s in shapes]
    _check_joint_grads(lambda a, b: a * b * 3.0, inputs, f"a * b * 3 for shapes {shapes}",
                       rules={aten.mul: ch.mul_vjp})


@pytest.mark.ch06_2
def test_mul_vjp_inside_the_block():
    torch.manual_seed(0)
    block = TinyBlock(8, 2).double()
    names = [n for n, _ in block.named_parameters()]
    fn = lambda x, *ps: torch.func.functional_call(block, dict(zip(names, ps)), (x,))  # noqa: E731
    inputs = [_f64(3, 8)] + [p.detach().clone().requires_grad_() for p in block.parameters()]
    _check_joint_grads(fn, inputs, "TinyBlock with your mul rule", rules={aten.mul: ch.mul_vjp})


# --------------------------------------------------------------------------- 6.3
@pytest.mark.ch06_3
@pytest.mark.parametrize("case", ["shared", "softmax", "unused"])
def test_backward_pass_small_graphs(case):
    torch.manual_seed(0)
    fns = {
        "shared": (lambda x, y: (x * x + x.sin() * y, ), [_f64(3, 4), _f64(4)]),  # x has three users
        "softmax": (lambda x, w: (F.log_softmax(x @ w, -1).sum(), (x @ w).amax()), [_f64(3, 4), _f64(4, 5)]),
        "unused": (lambda x, y, z: (x.exp() * 2, y > 0), [_f64(5), _f64(5), _f64(2)]),
    }
    fn, inputs = fns[case]
    _check_joint_grads(fn, inputs, f"your backward pass on {case!r}", backward=ch.backward_pass)


@pytest.mark.ch06_3
def test_backward_pass_inside_the_block():
    torch.manual_seed(0)
    block = TinyBlock(8, 2).double()
    names = [n for n, _ in block.named_parameters()]
    fn = lambda x, *ps: torch.func.functional_call(block, dict(zip(names, ps)), (x,))  # noqa: E731
    inputs = [_f64(2, 3, 8)] + [p.detach().clone().requires_grad_() for p in block.parameters()]
    _check_joint_grads(fn, inputs, "TinyBlock with your backward pass", backward=ch.backward_pass)


# --------------------------------------------------------------------------- 6.4
def _your_partition(joint):
    return partition_with_saved(joint, ch.default_saved(joint.gm, joint.num_primals, joint.num_outputs))


@pytest.mark.ch06_4
def test_default_saved_values_match_the_package():
    torch.manual_seed(0)
    block = TinyBlock(8, 2)
    names = [n for n, _ in block.named_parameters()]
    fn = lambda x, *ps: torch.func.functional_call(block, dict(zip(names, ps)), (x,))  # noqa: E731
    inputs = [torch.randn(3, 8, requires_grad=True), *block.parameters()]
    joint = _joint(fn, inputs)
    yours = _your_partition(joint)
    expected = default_partition(joint)
    expect_equal(sorted(yours.saved), sorted(expected.saved), "saved values of the TinyBlock joint graph",
                 context=joint.gm.code)
    expect_equal(yours.saved_bytes, expected.saved_bytes, "saved bytes")


@pytest.mark.ch06_4
def test_training_with_your_partition_matches_eager():
    torch.manual_seed(0)
    model = TinyBlock(16, 2).double()
    twin = copy.deepcopy(model)
    backend = aot_autograd(run_with_torch_ops, partition_fn=_your_partition)
    torch._dynamo.reset()
    compiled = torch.compile(twin, backend=backend)
    opt, opt_twin = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(twin.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(4, 16, dtype=torch.float64)
        losses = []
        for m, o in ((model, opt), (compiled, opt_twin)):
            o.zero_grad()
            loss = m(x).square().mean()
            loss.backward()
            o.step()
            losses.append(loss.detach())
        expect_close(losses[1], losses[0], f"loss at SGD step {step} (your partition vs eager)")
    torch._dynamo.reset()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        expect_close(q, p, f"parameter {name} after 3 steps")
