"""Attributes a user sets on tensors: ``y.foo = v`` (and ``y.grad = g``) inside a compiled frame is a
side effect replayed on the real tensor after the graph (an input, or a tensor the graph returns),
and later reads in the frame see ``v``; an attribute already set on an input tensor is read through
its source (guarded to be present, its value guarded as any input)."""
import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


def set_on_new_tensor(x):
    y = x + 10
    y.grad = x
    y.foo = 42
    return y, x * y.foo, hasattr(y, "foo")


def test_attributes_set_on_a_tensor_made_in_the_frame():
    x = torch.ones(5)
    cnt = CompileCounter()
    res = tinydynamo.compile(set_on_new_tensor, backend=cnt, fullgraph=True)(x)
    ref = set_on_new_tensor(x)
    torch.testing.assert_close(res[0], ref[0])
    torch.testing.assert_close(res[0].grad, ref[0].grad)
    assert res[0].foo == 42 and res[2] is True
    torch.testing.assert_close(res[1], ref[1])
    assert cnt.frame_count == 1


def set_on_input(x, flag):
    x.offloading = flag
    return x + 1


def test_attribute_set_on_an_input_tensor_is_replayed():
    x = torch.ones(3)
    out = tinydynamo.compile(set_on_input, backend="eager", fullgraph=True)(x, True)
    torch.testing.assert_close(out, x + 1)
    assert x.offloading is True


def scaled(x):
    return x * x.scale


def test_attribute_of_an_input_tensor_is_read_and_guarded():
    a, b = torch.ones(2), torch.ones(2)
    a.scale, b.scale = 3, 4
    cnt = CompileCounter()
    opt = tinydynamo.compile(scaled, backend=cnt, fullgraph=True)
    torch.testing.assert_close(opt(a), a * 3)
    torch.testing.assert_close(opt(b), b * 4)  # another value: its guard fails, recompiled
    assert cnt.frame_count == 2
