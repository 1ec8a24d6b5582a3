"""nn.Module features in traced code: ModuleList/ModuleDict/ParameterList/ParameterDict
(`in`, iteration, indexing, len), parameters()/named_parameters()/buffers()/children() in forward,
module attribute mutation, modules built in the frame, lazy modules, forward pre/post hooks. Each
matches eager, and compiles into as many graphs as torch.compile (backend "eager")."""
import pytest
import torch
from torch import nn

import tinydynamo
from tests.dynamo_compare import compare
from tinydynamo.testing import CompileCounter


class Containers(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(5, 5) for _ in range(3)])
        self.d = nn.ModuleDict({"a": nn.Linear(5, 5), "b": nn.ReLU()})
        self.pl = nn.ParameterList([nn.Parameter(torch.randn(5)) for _ in range(2)])
        self.pd = nn.ParameterDict({"w": nn.Parameter(torch.randn(5))})

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        x = self.layers[0](x) + len(self.layers) + len(self.d)
        if "a" in self.d and "zz" not in self.d:
            x = self.d["a"](x)
        for _, m in self.d.items():
            x = m(x)
        for p in self.pl:
            x = x + p
        for i, layer in enumerate(self.layers[1:]):
            x = layer(x) * i
        return x * self.pd["w"] + self.pl[1] + sum(v.sum() for v in self.pd.values())


class Introspect(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)
        self.register_buffer("b", torch.ones(5))

    def forward(self, x):
        s = sum(p.sum() for p in self.parameters())
        n = len(list(self.named_parameters()))
        for b in self.buffers():
            x = x + b
        for c in self.children():
            x = c(x)
        names = [name for name, _ in self.named_modules()]
        return x + s + n + len(names)


class Steps(nn.Module):
    def __init__(self):
        super().__init__()
        self.step = 0
        self.scale = 1.0

    def forward(self, x):
        self.step += 1
        self.scale = 2.0
        return x * self.scale


class BuildsModules(nn.Module):
    def forward(self, x):
        return nn.Softmax(dim=1)(x) + nn.ReLU()(x) + nn.Flatten(0)(x).sum()


def hooked_linear():
    m = nn.Linear(5, 5)
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    m.register_forward_hook(lambda mod, args, out: out + 1)
    m.register_forward_pre_hook(lambda mod, args, kwargs: ((args[0] + 1,), kwargs), with_kwargs=True)
    return m


class WithHookedChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.child = hooked_linear()

    def forward(self, x):
        return self.child(x).relu()


CASES = [(Containers, 1, 1), (Introspect, 1, 1), (BuildsModules, 1, 1), (WithHookedChild, 1, 1)]


@pytest.mark.parametrize("cls,tiny,torch_graphs", CASES, ids=[c[0].__name__ for c in CASES])
def test_module_feature(cls, tiny, torch_graphs):
    torch.manual_seed(0)
    m = cls()
    x = torch.randn(4, 5, requires_grad=True)
    assert compare(m, x, grad=True) == (tiny, torch_graphs)


def test_module_attribute_mutation_is_replayed():
    m = Steps()
    assert compare(m, torch.randn(3)) == (2, 2)  # step is an int attribute: each value is guarded (torch too)
    assert m.step == 5 and m.scale == 2.0  # eager once, tiny twice, torch twice


def test_hooks_on_the_compiled_module_itself_are_captured():
    torch.manual_seed(0)
    m = hooked_linear()
    x = torch.randn(2, 5)
    expected = m(x)
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.compile(m, backend=cnt)
    torch.testing.assert_close(compiled(x), expected)
    torch.testing.assert_close(compiled(x), expected)
    assert cnt.frame_count == 1
    handle = m.register_forward_hook(lambda mod, args, out: out * 10)  # a new hook: guarded, recompiles
    torch.testing.assert_close(compiled(x), expected * 10)
    handle.remove()
    torch.testing.assert_close(compiled(x), expected)
    assert cnt.frame_count == 2


def test_lazy_module_initialises_then_captures():
    torch.manual_seed(0)
    m = nn.Sequential(nn.LazyLinear(3), nn.ReLU())
    x = torch.randn(2, 4)
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.compile(m, backend=cnt)
    out = compiled(x)  # first call: the lazy module initialises (eagerly), then the graph is captured
    torch.testing.assert_close(out, m(x))
    torch.testing.assert_close(compiled(x), m(x))
    assert cnt.frame_count >= 1 and m[0].weight.shape == (3, 4)


def test_module_with_parameters_built_in_forward_is_a_clean_break():
    class Bad(nn.Module):
        def forward(self, x):
            return nn.Linear(3, 3)(x)

    tinydynamo.reset()
    with pytest.raises(tinydynamo.Unsupported, match="parameters inside the compiled frame"):
        tinydynamo.compile(Bad(), backend=CompileCounter(), fullgraph=True)(torch.randn(2, 3))
