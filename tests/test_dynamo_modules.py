"""nn.Modules: forward inlined, parameters/buffers lifted as graph inputs, containers, whole models in one graph."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tinydynamo
from course.models import GPT, TinyBlock
from tinydynamo.testing import CompileCounter


def compile_counted(model, **kw):
    tinydynamo.reset()
    cnt = CompileCounter()
    return tinydynamo.compile(model, backend=cnt, fullgraph=True, **kw), cnt


def test_tiny_block_one_graph_equals_eager():
    torch.manual_seed(0)
    m = TinyBlock(32, 4)
    cm, cnt = compile_counted(m)
    for x in (torch.randn(2, 8, 32), torch.randn(2, 8, 32)):
        for _ in range(2):
            torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 1
    assert cnt.op_count == 7  # layer_norm, linear, gelu, mul, add, linear, add
    placeholders = [n.meta["source"] for n in cnt.graphs[0].graph.nodes if n.op == "placeholder"]
    assert placeholders == ["L['x']", "L['self'].ln.weight", "L['self'].ln.bias", "L['self'].fc1.weight",
                            "L['self'].fc1.bias", "L['self'].fc2.weight", "L['self'].fc2.bias"]


def test_gpt_with_loss_one_graph_equals_eager_and_trains():
    torch.manual_seed(0)
    m = GPT(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32).eval()
    cm, cnt = compile_counted(m)
    for _ in range(2):
        idx, tgt = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
        logits, loss = cm(idx, tgt)
        ref_logits, ref_loss = m(idx, tgt)
        torch.testing.assert_close(logits, ref_logits)
        torch.testing.assert_close(loss, ref_loss)
    assert cnt.frame_count == 1
    targets = {getattr(n.target, "__name__", n.target) for n in cnt.graphs[0].graph.nodes}
    assert {"embedding", "layer_norm", "masked_fill", "softmax", "gelu", "cross_entropy", "transpose", "view"} <= targets
    # gradients flow through the captured graph to the original parameters
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    m(idx, tgt)[1].backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, msg=n)
    # targets=None is a different (constant) argument: a second graph, without the loss
    logits = cm(idx)
    assert cnt.frame_count == 2
    torch.testing.assert_close(logits, m(idx))


def test_compiled_module_behaves_like_the_module():
    m = TinyBlock(8, 2)
    cm = tinydynamo.compile(m, backend="eager")
    assert isinstance(cm, nn.Module)
    assert list(cm.state_dict()) == list(m.state_dict())
    assert [n for n, _ in cm.named_parameters()] == [n for n, _ in m.named_parameters()]
    assert all(a is b for a, b in zip(cm.parameters(), m.parameters()))
    assert cm.fc1 is m.fc1
    cm.eval()
    assert not m.training


class Containers(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})
        self.scales = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(2)])
        self.drop = nn.Dropout(0.5)
        self.register_buffer("offset", torch.randn(4))

    def forward(self, x):
        x = self.seq(x) + self.offset
        for i, blk in enumerate(self.blocks):
            x = blk(x) * self.scales[i % 2]
        x = self.blocks[-1](x)
        for s in self.scales:
            x = x + s
        n = sum(p.numel() for p in self.parameters())
        outs = {k: h(x) for k, h in self.heads.items()}
        if self.training:
            x = self.drop(x)
        return outs["a"] + outs["b"], x * 0 + n, len(self.blocks)


def test_containers_and_training_flag():
    torch.manual_seed(0)
    m = Containers().eval()
    cm, cnt = compile_counted(m)
    for _ in range(2):
        x = torch.randn(3, 4)
        torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 1
    assert not any("dropout" in str(n.target) for n in cnt.graphs[0].graph.nodes)
    m.train()  # self.training is guarded: a recompile, now with dropout in the graph
    torch.manual_seed(1)
    out = cm(x)
    assert cnt.frame_count == 2
    assert any("dropout" in str(n.target) for n in cnt.graphs[1].graph.nodes)
    assert out[0].shape == (3, 2)


def test_submodule_calls_helper_methods_and_properties():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.alpha = 0.5

        @property
        def gain(self):
            return self.alpha * 4

        def helper(self, x):
            return F.silu(self.fc(x)) * self.gain

        def forward(self, x):
            return self.helper(x) + self.fc.weight.sum() + self.fc.bias.shape[0]

    m = M()
    cm, cnt = compile_counted(m)
    for _ in range(2):
        x = torch.randn(2, 4)
        torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 1


@pytest.mark.parametrize("requires_grad", [False, True])
def test_parameters_gradients_match(requires_grad):
    torch.manual_seed(0)
    m = TinyBlock(8, 2)
    cm = tinydynamo.compile(m, backend="eager", fullgraph=True)
    x = torch.randn(2, 8, requires_grad=requires_grad)
    cm(x).sum().backward()
    g = [p.grad.clone() for p in m.parameters()]
    gx = x.grad.clone() if requires_grad else None
    m.zero_grad()
    x.grad = None
    m(x).sum().backward()
    for a, p in zip(g, m.parameters()):
        torch.testing.assert_close(a, p.grad)
    if requires_grad:
        torch.testing.assert_close(gx, x.grad)


def test_torch_transformer_encoder_layer_one_graph():
    """torch's own layer: hook checks over ModuleDicts/OrderedDicts, fast-path conditions, an op that
    returns (tensor, None), aliased q/k/v inputs -- all captured in one graph."""
    torch.manual_seed(0)
    m = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    cm, cnt = compile_counted(m)
    for _ in range(2):
        x = torch.randn(2, 5, 16)
        torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 1


class Scaled(nn.Module):
    """A parameter, a buffer, a submodule, and a property that reads a parameter."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("shift", torch.ones(4))
        self.raw_scale = nn.Parameter(torch.full((4,), 2.0))

    @property
    def scale(self):
        return self.raw_scale * 1.0

    def forward(self, x):
        return self.fc(x) * self.scale + self.shift


def test_module_members_are_read_from_their_dicts_and_shown_dotted():
    torch.manual_seed(0)
    m = Scaled()
    cm = tinydynamo.compile(m, backend="eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(cm(x), m(x))
    entry = tinydynamo.cache_info(cm).entries[0]
    # the frame and the guards skip nn.Module.__getattr__: they index the module's own tables, in
    # its instance dict (a parent read by several inputs is read once: ``___i2 = ___i1['_modules']``)
    assert "['_modules']" in entry.code and "['fc']" in entry.code and "['weight']" in entry.code
    assert ".fc" not in entry.code and "._modules" not in entry.code and "._parameters" not in entry.code
    assert "['raw_scale']" in entry.code
    # the guard check reads each module's instance dict once, and its tables and attributes from
    # it: no attribute read on a module (``nn.Module.__getattr__`` keeps CPython from specialising them)
    check = entry.check_fn.code
    assert "['_buffers']" in check and "['shift']" in check and "['_modules']" in check
    assert "._modules" not in check and "._parameters" not in check and "._buffers" not in check
    # what people read stays the attribute path
    readable = "\n".join(g.readable() for g in entry.check_fn.guards)
    assert "L['self'].fc.weight" in readable and "_parameters" not in readable


def test_replaced_members_are_seen_by_the_cached_frame():
    torch.manual_seed(0)
    m = Scaled()
    tinydynamo.reset()
    cnt = CompileCounter()
    cm = tinydynamo.compile(m, backend=cnt)
    x = torch.randn(3, 4)
    cm(x)
    m.fc.weight = nn.Parameter(torch.randn(4, 4))  # same shape: the cached entry runs, with the new one
    torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 1
    m.fc = nn.Linear(4, 4)  # another module object: a miss, then a recompile
    torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 2
    del m.shift  # the buffer becomes a plain attribute: the dict read misses, the new frame reads it
    m.shift = torch.zeros(4)
    torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 3


def test_slice_of_sequential_is_called_like_eager():
    """``seq[0:2](x)`` builds a new Sequential in eager; the traced call chains the same children
    (it used to come back as a list, and the compiled frame called the list)."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    seq = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))

    def f(x):
        return seq[0:2](x) + seq[1:](x).sum() + len(seq[::2])

    x = torch.randn(2, 4)
    counter = CompileCounter()
    out = tinydynamo.compile(f, backend=counter, fullgraph=True)(x)
    assert counter.frame_count == 1
    torch.testing.assert_close(out, f(x))
    reference = CompileCounter()
    torch._dynamo.reset()
    torch.compile(f, backend=reference, fullgraph=True)(x)
    assert reference.frame_count == 1


def test_children_of_a_sliced_sequential_are_read_by_position():
    """``full[1:]`` keeps its children's keys ('1', '2'); compiled code indexes by position. Reading
    child '1' as ``part[1]`` took the next layer's weights: same types, silently wrong numbers."""
    torch.manual_seed(0)
    full = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(3)])
    part = full[1:]

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.f = part

        def forward(self, x):
            return self.f(x)

    x = torch.randn(2, 4)
    model = Holder()
    torch.testing.assert_close(tinydynamo.compile(model, backend="eager")(x), model(x))


def test_a_cache_hit_reads_a_shared_parent_once():
    """The frame reads ``L['self']`` and each submodule once, then every parameter from them; the values
    are read afresh in every call (a parameter changed in place is seen)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)), nn.Linear(4, 2))
    cm = tinydynamo.compile(m, backend="eager")
    x = torch.randn(3, 4)
    torch.testing.assert_close(cm(x), m(x))
    code = tinydynamo.cache_info(cm).entries[0].code
    assert code.count("L['self']") == 1 and code.count("['_modules']") == 2 and code.count("['0']") == 2, code
    with torch.no_grad():
        m[0][2].weight.mul_(-1.0)
    torch.testing.assert_close(cm(x), m(x))


class ReadOnly:
    """A data descriptor (it has ``__set__``): on the class, it wins over the instance dict."""

    def __get__(self, obj, owner=None):
        return 3.0

    def __set__(self, obj, value):
        raise AttributeError("read-only")


class Dropped(nn.Module):
    """An attribute in the instance dict (``p``), and one that a data descriptor on the class shadows."""

    k = ReadOnly()

    def __init__(self):
        super().__init__()
        self.p = 0.5
        self.__dict__["k"] = 2.0  # never seen: ``self.k`` is the descriptor's 3.0

    def forward(self, x):
        return x * self.p + self.k


def test_instance_attributes_are_guarded_through_the_instance_dict():
    """``self.p`` is guarded as ``<the module's __dict__>['p']``; a name that a data descriptor on
    the class shadows is read as an attribute. Changing ``p`` recompiles, as reading it would."""
    m = Dropped()
    cnt = CompileCounter()
    cm = tinydynamo.compile(m, backend=cnt)
    x = torch.randn(3)
    torch.testing.assert_close(cm(x), m(x))
    check = tinydynamo.cache_info(cm).entries[0].check_fn.code
    assert "['p']" in check and ".p\n" not in check and ".p)" not in check
    assert "['k']" not in check
    torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 1
    m.p = 0.25
    torch.testing.assert_close(cm(x), m(x))
    assert cnt.frame_count == 2
