"""OpRecorder (the lean tracer for static shapes) against make_fx, and the joint graph it builds."""
import operator

import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from tininductor import decompositions, joint_graph
from tininductor.decompositions import decompose, fake_inputs
from tininductor.op_recorder import OpRecorder, has_symbolic_sizes

aten = torch.ops.aten


def _record(fn, *fakes, decompositions=None, mode):
    graph = fx.Graph()
    recorder = OpRecorder(graph, decompositions)
    inputs = []
    for i, x in enumerate(fakes):
        node = graph.placeholder(f"x{i}")
        node.meta["val"] = x
        recorder.bind(x, node)
        inputs.append(node)
    with mode, torch.no_grad(), recorder:
        out = fn(*fakes)
    graph.output(recorder.node(out))
    return fx.GraphModule(recorder.constants, graph)


def _ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_records_the_ops_make_fx_records_and_computes_the_same():
    def fn(x, w):
        y = torch.nn.functional.linear(x, w).relu()  # a composite (linear) and an op
        top = torch.topk(y, 2, dim=-1)               # a multi-output op, read by index
        return top.values * 2 + top.indices.float(), y.sum(0)

    x, w = torch.randn(4, 5), torch.randn(3, 5)
    fakes, mode = fake_inputs([x, w])
    recorded = _record(fn, *fakes, mode=mode)
    traced = make_fx(fn)(x, w)
    assert [t for t in _ops(recorded) if t is not operator.getitem] == \
        [t for t in _ops(traced) if t is not operator.getitem]
    for node in recorded.graph.nodes:
        if node.op == "call_function":
            assert isinstance(node.meta["val"], (torch.Tensor, tuple))
    torch.testing.assert_close(recorded(x, w), fn(x, w))


def test_a_decomposition_is_recorded_as_its_ops():
    table = {aten.relu.default: lambda x: torch.where(x > 0, x, 0.0)}
    x = torch.randn(6)
    fakes, mode = fake_inputs([x])
    gm = _record(torch.relu, *fakes, decompositions=table, mode=mode)
    assert aten.relu.default not in _ops(gm) and aten.where.self in _ops(gm)
    torch.testing.assert_close(gm(x), torch.relu(x))


def test_a_real_tensor_becomes_a_constant_of_the_graph():
    c = torch.arange(4.0)
    fakes, mode = fake_inputs([torch.randn(4)])
    gm = _record(lambda x: x * c, *fakes, mode=mode)
    (attr,) = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert torch.equal(getattr(gm, attr.target), c)
    x = torch.randn(4)
    torch.testing.assert_close(gm(x), x * c)


def test_an_unbound_fake_tensor_is_an_error_naming_the_fix():
    fakes, mode = fake_inputs([torch.randn(3)])
    graph = fx.Graph()
    with mode, pytest.raises(RuntimeError, match="bind the graph's inputs"), OpRecorder(graph):
        fakes[0] + 1


def test_symbolic_sizes_are_refused_and_detected():
    mode = FakeTensorMode(shape_env=ShapeEnv())
    static = torch.randn(2)
    assert not has_symbolic_sizes([static, 3, (static, None)])
    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    sym = mode.from_tensor(torch.randn(4, 3), symbolic_context=ctx)
    assert has_symbolic_sizes([sym]) and has_symbolic_sizes([(static, sym.shape[0])])
    graph = fx.Graph()
    recorder = OpRecorder(graph)
    recorder.bind(sym, graph.placeholder("x"))
    with mode, pytest.raises(NotImplementedError, match="make_fx"), recorder:
        sym.view(sym.shape[0] * 3)


@pytest.mark.parametrize("shapes", [[(4, 3), (3, 2), (2,)], [(2, 5, 3), (3, 3), (3,)]])
def test_the_recorded_joint_graph_equals_the_traced_one(shapes, monkeypatch):
    """Static shapes go through the recorder, symbolic ones through make_fx: on a static graph both
    must build the same ops and the same gradients."""
    def block(x, w, b):
        h = torch.nn.functional.layer_norm(x @ w + b, (w.shape[1],))
        return torch.softmax(h, -1).tanh().sum(-1), h.amax(-1)

    inputs = [torch.randn(s, dtype=torch.float64) for s in shapes]
    fakes, mode = fake_inputs(inputs)
    prim_gm = decompose(block, fakes)
    recorded = joint_graph.create_joint(prim_gm, fakes, [True, True, True], mode)
    monkeypatch.setattr(joint_graph, "has_symbolic_sizes", lambda values: True)
    traced = joint_graph.create_joint(prim_gm, fakes, [True, True, True], mode)
    assert sorted(map(str, _ops(recorded.gm))) == sorted(map(str, _ops(traced.gm)))
    assert recorded.grad_mask == traced.grad_mask and recorded.diff_outputs == traced.diff_outputs
    tangents = [torch.randn(o.shape, dtype=o.dtype) for o, d in zip(block(*inputs), recorded.diff_outputs) if d]
    torch.testing.assert_close(recorded.gm(inputs, tangents), traced.gm(inputs, tangents))
    leaves = [x.clone().requires_grad_() for x in inputs]
    outs = block(*leaves)
    expected = torch.autograd.grad(outs, leaves, tangents + [None] * (len(outs) - len(tangents)), allow_unused=True)
    got = recorded.gm(inputs, tangents)[len(outs):]
    torch.testing.assert_close(list(got), [g for g in expected if g is not None])


def test_decompose_records_the_graph_make_fx_traces(monkeypatch):
    """decompose() records static graphs and traces symbolic ones: for a static graph both give the
    same placeholders, ops, ``original_aten`` and values (a ``torch.tensor`` constant included)."""
    def block(x, w):
        y = torch.softmax(x @ w, -1)
        return y * torch.tensor(2.0), torch.nn.functional.gelu(x).sum()

    inputs = [torch.randn(4, 3), torch.randn(3, 5)]
    fakes, mode = fake_inputs(inputs)
    recorded = decompose(block, fakes)
    monkeypatch.setattr(decompositions, "has_symbolic_sizes", lambda values: True)
    traced = decompose(block, fakes)

    def summary(gm):
        return [(n.op, n.name if n.op == "placeholder" else str(n.target),
                 str(n.meta.get("original_aten"))) for n in gm.graph.nodes if n.op != "get_attr"]

    assert summary(recorded) == summary(traced)
    torch.testing.assert_close(recorded(*inputs), traced(*inputs))
    torch.testing.assert_close(recorded(*inputs), block(*inputs))
