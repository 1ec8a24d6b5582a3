"""Graded tests for chapter 6: each piece runs inside tininductor's AOT autograd and the gradients
are compared with eager autograd (float64)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from course import load
from course.models import TinyBlock
from course.testing import calling, expect_close, expect_equal, expect_true
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
                                               ((5, 2), (5, 2)), ((6,), ()), ((2, 1, 4), (1, 1)),
                                               ((0, 3), (1, 3)), ((2, 0), (2, 1)), ((3, 0), (0,))])
def test_sum_to_size_matches_autograd(grad_shape, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(grad_shape, dtype=torch.float64)
    (want,) = torch.autograd.grad(x.expand(grad_shape), x, grad)
    with calling(f"sum_to_size(grad of shape {tuple(grad_shape)}, shape {tuple(shape)})"):
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
def test_mul_vjp_with_zeros_and_numbers():
    """Exact zeros in an input (the gradient is grad * the other input, never out / this one), and a
    Python number on either side (its gradient is None)."""
    a = torch.tensor([0.0, 1.5, -2.0, 0.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([3.0, 0.0, 0.5, 0.0], dtype=torch.float64, requires_grad=True)
    _check_joint_grads(lambda a, b: a * b, [a, b], "a * b with a = [0, 1.5, -2, 0], b = [3, 0, 0.5, 0]",
                       rules={aten.mul: ch.mul_vjp})
    grad, x = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    for args, where in (((x, 2.0), 1), ((2.0, x), 0)):
        with calling(f"mul_vjp(grad, out, {'x, 2.0' if where else '2.0, x'})"):
            got = ch.mul_vjp(grad, x * 2.0, *args)
        expect_equal(got[where], None, f"mul_vjp(grad, out, {'x, 2.0' if where else '2.0, x'})[{where}]: "
                                       "the gradient of a Python number")
        expect_close(got[1 - where], grad * 2.0, f"mul_vjp(grad, out, {'x, 2.0' if where else '2.0, x'})[{1 - where}]")


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
@pytest.mark.parametrize("case", ["shared", "softmax", "unused", "where", "indexing"])
def test_backward_pass_small_graphs(case):
    torch.manual_seed(0)
    index = torch.tensor([2, 0, 2])
    fns = {
        # the gradient of where's third argument; an index list (nodes inside a list) looked up in env
        "where": (lambda x, y: (torch.where(x > 0, x * 2, y.exp()),), [_f64(3, 4), _f64(3, 4)]),
        "indexing": (lambda x, i: ((x[i] * x[i]).sum(),), [_f64(4, 2), index]),
        "shared": (lambda x, y: (x * x + x.sin() * y, ), [_f64(3, 4), _f64(4)]),  # x has three users
        "softmax": (lambda x, w: (F.log_softmax(x @ w, -1).sum(), (x @ w).amax()), [_f64(3, 4), _f64(4, 5)]),
        "unused": (lambda x, y, z: (x.exp() * 2, y > 0), [_f64(5), _f64(5), _f64(2)]),
    }
    fn, inputs = fns[case]
    _check_joint_grads(fn, inputs, f"your backward pass on {case!r}", backward=ch.backward_pass)


@pytest.mark.ch06_3
def test_backward_pass_leaves_its_inputs_alone_and_answers_only_for_needs_grad():
    seen = {}

    def spy(graph, env, needs_grad, output_grads, rules=None):
        seeds = dict(output_grads)
        grads = ch.backward_pass(graph, env, needs_grad, output_grads, rules)
        seen["extra"] = sorted(n.name for n in grads if n not in needs_grad and n not in seeds)
        seen["seeds changed"] = dict(output_grads) != seeds
        return grads

    torch.manual_seed(0)
    x, w = _f64(3, 4), torch.randn(4, dtype=torch.float64)  # w needs no gradient
    _check_joint_grads(lambda x, w: ((x * w).sin() * x,), [x, w], "(x * w).sin() * x, w without grad", backward=spy)
    expect_equal(seen["extra"], [], "nodes outside needs_grad that got a gradient ((x * w).sin() * x, w needs none)")
    expect_equal(seen["seeds changed"], False, "whether backward_pass changed the output_grads dict it was given "
                                               "(build a new dict; the caller's seeds stay as they were)")


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


def _two_outputs(x, w):
    return (x @ w).relu(), (x * w.sum()).sin()


def _list_argument(a, b):
    return torch.cat([a.exp(), b.exp()]) * 2


def _input_without_grad(x, c):
    return (x * c).tanh() + c


SAVED_CASES = [  # (fn, input shapes, which inputs need grad, what it tries)
    (_two_outputs, [(3, 4), (4, 4)], [True, True], "two outputs, each with a forward of its own"),
    (_list_argument, [(3,), (2,)], [True, True], "forward values inside a list argument (cat)"),
    (_input_without_grad, [(3,), (3,)], [True, False], "an input that needs no grad"),
]


@pytest.mark.ch06_4
@pytest.mark.parametrize("fn, shapes, needs_grad, what", SAVED_CASES, ids=[c[0].__name__[1:] for c in SAVED_CASES])
def test_default_saved_values_on_more_joint_graphs(fn, shapes, needs_grad, what):
    torch.manual_seed(0)
    inputs = [torch.randn(shape, requires_grad=grad) for shape, grad in zip(shapes, needs_grad)]
    joint = _joint(fn, inputs)
    expect_equal(sorted(_your_partition(joint).saved), sorted(default_partition(joint).saved),
                 f"saved values of {fn.__name__[1:]} ({what}; {joint.num_outputs} outputs)", context=joint.gm.code)


@pytest.mark.ch06_4
def test_training_with_your_partition_matches_eager():
    torch.manual_seed(0)
    model = TinyBlock(16, 2).double()
    twin = copy.deepcopy(model)
    backend = aot_autograd(run_with_torch_ops, partition_fn=_your_partition)
    # the backend compiles the module itself (parameters lifted into primals), as it would the graph
    # TorchDynamo captures of it: the same joint graph and partition, without a capture to wait for
    compiled = backend(twin, [torch.randn(4, 16, dtype=torch.float64)])
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
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        expect_close(q, p, f"parameter {name} after 3 steps")
