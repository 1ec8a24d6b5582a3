"""Children of nn.Sequential / nn.ModuleList are read from the container's dict in guards and frames.

``seq[0]`` runs the container's Python ``__getitem__`` (it walks the children); the generated code
reads ``seq._modules['0']`` instead. The guards must still catch every change that ``seq[0]`` would
see: a replaced child, a replaced or reshaped parameter, an inserted or removed layer.
"""
from __future__ import annotations

import torch
from torch import nn

import tinydynamo
from tinydynamo.codegen import read_inputs
from tinydynamo.source import LocalSource, module_member_source, source_reader


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.head = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return self.head[0](x) + self.head(x).sum()


def _compiled():
    tinydynamo.reset()
    torch.manual_seed(0)
    model = Stack()
    return model, tinydynamo.compile(model, backend="eager")


def test_generated_code_reads_container_children_from_the_dict():
    model, compiled = _compiled()
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))
    entry = tinydynamo.cache_info(compiled).entries[0]
    assert "['0']" in entry.check_fn.code and "][0]" not in entry.check_fn.code  # by its key in _modules
    assert any("layers[0]" in g.name for g in entry.check_fn.guards)  # shown by position, as written


def test_a_replaced_child_is_seen():
    model, compiled = _compiled()
    x = torch.randn(2, 4)
    compiled(x)
    model.layers[1] = nn.Linear(4, 4)
    torch.testing.assert_close(compiled(x), model(x))
    assert "layers[1]" in tinydynamo.cache_info(compiled).last_reason
    model.head[2] = nn.Sequential(nn.Linear(4, 2), nn.Tanh())
    torch.testing.assert_close(compiled(x), model(x))
    assert "head[2]" in tinydynamo.cache_info(compiled).last_reason


def test_a_replaced_or_reshaped_parameter_is_seen():
    model, compiled = _compiled()
    x = torch.randn(2, 4)
    compiled(x)
    model.layers[2].weight = nn.Parameter(torch.randn(4, 4))
    torch.testing.assert_close(compiled(x), model(x))
    with torch.no_grad():
        model.head[0].weight.data = torch.randn(4, 4).t()  # same object, other strides
    torch.testing.assert_close(compiled(x), model(x))
    assert "head[0].weight stride mismatch" in tinydynamo.cache_info(compiled).last_reason


def test_an_inserted_or_removed_layer_is_seen():
    model, compiled = _compiled()
    x = torch.randn(2, 4)
    compiled(x)
    model.layers.append(nn.Linear(4, 4))
    torch.testing.assert_close(compiled(x), model(x))
    del model.layers[0]
    del model.layers[0]
    torch.testing.assert_close(compiled(x), model(x))
    model.head.insert(0, nn.Identity())  # head[0] is now another module at the same position
    torch.testing.assert_close(compiled(x), model(x))


def test_source_reader_reads_a_shared_parent_once():
    """One helper turns sources into expressions for both generated functions: the guard check binds
    every source to a local, a frame's input reads bind only parents that several inputs go through."""
    model = nn.Sequential(nn.Linear(4, 4))
    model.fc = nn.Linear(4, 4)
    root = LocalSource("self")
    fc = module_member_source(model, root, "fc")
    weight, bias = module_member_source(model.fc, fc, "weight"), module_member_source(model.fc, fc, "bias")

    lines: list[str] = []
    read = source_reader(lines, "___v")
    assert [read(weight), read(bias), read(fc)] == ["___v2", "___v3", "___v1"]
    assert lines == ["___v0 = L['self']", "___v1 = ___v0._modules['fc']",
                     "___v2 = ___v1._parameters['weight']", "___v3 = ___v1._parameters['bias']"]

    # a frame reads through the modules' instance dicts (each read once where shared)
    reads, args = read_inputs([weight, bias, LocalSource("x")])
    assert reads == ["___i0 = L['self']", "___i1 = ___i0.__dict__", "___i2 = ___i1['_modules']",
                     "___i3 = ___i2['fc']", "___i4 = ___i3.__dict__", "___i5 = ___i4['_parameters']"]
    assert args == ["___i5['weight']", "___i5['bias']", "L['x']"]
    env = {"L": {"self": model, "x": 1}}
    exec("\n".join(reads), env)
    assert [eval(a, env) for a in args[:2]] == [model.fc.weight, model.fc.bias]  # the same objects
