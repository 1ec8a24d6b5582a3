"""Guards on a module tree, on cached calls: every change to a module's attributes, submodules,
parameters (identity, dtype, strides, requires_grad), hooks or mutable containers recompiles; an equal
value in a new object, or new parameter values, does not."""
import pytest
import torch
from torch import nn

import tinydynamo
from tinydynamo.testing import CompileCounter


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16, 5)
        self.scale = 0.5
        self.cfg = ([1, 2], 3)  # an immutable tuple holding a mutable list
        self.sizes = [4, 4]

    def forward(self, x):
        y = self.pool(torch.relu(self.bn(self.conv(x))))
        y = nn.functional.adaptive_avg_pool2d(y, 4).mean(1).flatten(1) * self.scale
        return self.fc(y.to(self.fc.weight.dtype)) + self.cfg[0][1] + self.cfg[1] + self.sizes[0]


def compiled():
    tinydynamo.reset()
    torch.manual_seed(0)
    model = Net().eval()
    cnt = CompileCounter()
    fn = tinydynamo.optimize(cnt)(model)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(3):  # compile, then cached calls
        fn(x)
    return model, fn, cnt, x


def _set(attr_path, value):
    def change(model):
        *parents, last = attr_path.split(".")
        obj = model
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, last, value)
    return change


@pytest.mark.parametrize("change", [
    _set("conv.stride", (2, 2)),
    _set("conv.padding", (0, 0)),
    _set("bn.eps", 1e-3),
    _set("bn.momentum", None),
    _set("pool.kernel_size", 4),
    _set("scale", 2.0),
    _set("scale", -0.5),
    lambda m: m.bn.train(),                                  # training flag
    lambda m: setattr(m, "conv", nn.Conv2d(3, 4, 3, padding=1)),     # a swapped module
    lambda m: setattr(m.bn, "forward", lambda x: x * 2),     # a new instance attribute shadowing the class's
    lambda m: m.cfg[0].__setitem__(1, 7),                    # a list inside an immutable tuple, changed in place
    lambda m: m.sizes.__setitem__(0, 9),                     # a mutable list changed in place
    lambda m: m.fc.double(),                                # dtype
    lambda m: setattr(m.fc, "weight", nn.Parameter(torch.randn(16, 5).t())),  # stride
    lambda m: m.fc.weight.requires_grad_(False),            # requires_grad
    lambda m: setattr(m.fc.weight, "data", torch.randn(5, 16).t().contiguous().t()),  # same object, new strides
])
def test_every_change_still_recompiles(change):
    model, fn, cnt, x = compiled()
    change(model)
    torch.testing.assert_close(fn(x), model(x))
    assert cnt.frame_count == 2, tinydynamo.cache_info(fn).last_reason


def test_signed_zero_and_int_vs_bool_recompile():
    model, fn, cnt, x = compiled()
    model.scale = 0.0
    fn(x)
    fn(x)
    assert cnt.frame_count == 2
    model.scale = -0.0
    torch.testing.assert_close(fn(x), model(x))
    assert cnt.frame_count == 3
    model.cfg = ([1, 2], True)  # 3 -> True: equal as numbers, another constant
    torch.testing.assert_close(fn(x), model(x))
    assert cnt.frame_count == 4


@pytest.mark.parametrize("change", [
    _set("bn.eps", float("1e-5")),        # an equal float, another object
    _set("conv.stride", tuple([1, 1])),   # an equal tuple, another object
    _set("cfg", ([1, 2], 3)),             # an equal (mutable-holding) tuple
])
def test_an_equal_value_in_a_new_object_does_not_recompile(change):
    model, fn, cnt, x = compiled()
    change(model)
    torch.testing.assert_close(fn(x), model(x))
    fn(x)
    assert cnt.frame_count == 1, tinydynamo.cache_info(fn).last_reason


def test_new_parameter_values_are_read_without_recompiling():
    model, fn, cnt, x = compiled()
    with torch.no_grad():
        model.fc.weight.mul_(3)
    torch.testing.assert_close(fn(x), model(x))
    model.fc.weight = nn.Parameter(torch.randn(5, 16))  # same metadata, another tensor
    torch.testing.assert_close(fn(x), model(x))
    assert cnt.frame_count == 1


def test_hook_registered_after_compiling_runs():
    model, fn, cnt, x = compiled()
    seen = []
    model.bn.register_forward_hook(lambda mod, args, out: seen.append(1))
    torch.testing.assert_close(fn(x), model(x))
    assert seen and cnt.frame_count == 2


def test_failure_reason_still_names_the_guard():
    model, fn, cnt, x = compiled()
    model.conv.stride = (2, 2)
    fn(x)
    assert "stride" in tinydynamo.cache_info(fn).last_reason


def test_an_equal_int_argument_in_a_new_object_does_not_recompile():
    model, fn, cnt, x = compiled()
    tinydynamo.reset()
    cnt = CompileCounter()

    def f(x, n):
        return model(x) * n

    g = tinydynamo.optimize(cnt, dynamic=False)(f)
    for _ in range(4):
        n = int("1000")  # equal, never the same object
        torch.testing.assert_close(g(x, n), f(x, n))
    assert cnt.frame_count == 1
    g(x, 999)  # another value recompiles
    assert cnt.frame_count == 2


class Config:
    """A Hugging Face style config: one object that every layer holds."""

    def __init__(self):
        self.scale = 2.0
        self.act = "relu"


class Layer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x) * self.config.scale
        return torch.relu(y) if self.config.act == "relu" else torch.tanh(y)


class Stack(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.config = Config()
        self.layers = nn.ModuleList(Layer(self.config) for _ in range(n))
        self.tied = self.layers[0]  # one module reached by two paths

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.tied(x) + self.config.scale


def compiled_stack():
    tinydynamo.reset()
    torch.manual_seed(0)
    model = Stack()
    cnt = CompileCounter()
    fn = tinydynamo.optimize(cnt)(model)
    x = torch.randn(2, 4)
    for _ in range(2):
        torch.testing.assert_close(fn(x), model(x))
    return model, fn, cnt, x


def test_an_object_shared_by_many_paths_is_guarded_once():
    model, fn, cnt, x = compiled_stack()
    guards = tinydynamo.cache_info(fn).entries[0].check_fn.guards
    on_scale = [g for g in guards if g.name.endswith("config.scale")]
    assert len(on_scale) == 1, [g.name for g in on_scale]  # through the first path, not once per layer
    paths = {"L['self'].config", *(f"L['self'].layers[{i}].config" for i in range(3))}
    same = {g.name for g in guards if g.kind == "ALIAS_MATCH"} | {g.expected[0].name() for g in guards
                                                                 if g.kind == "ALIAS_MATCH"}
    assert same >= paths  # every other path is checked to reach that same object
    assert cnt.frame_count == 1


@pytest.mark.parametrize("change", [
    lambda m: setattr(m.config, "scale", 3.0),                   # the shared object changed
    lambda m: setattr(m.layers[1], "config", Config()),          # one path now reaches an equal copy
    lambda m: setattr(m.layers[2].config, "act", "tanh"),        # changed through a second path
    lambda m: setattr(m, "tied", Layer(m.config)),               # the two paths part
    lambda m: setattr(m.layers[0].fc, "bias", None),             # a change under the shared module
])
def test_a_change_through_any_path_of_a_shared_object_recompiles(change):
    model, fn, cnt, x = compiled_stack()
    change(model)
    torch.testing.assert_close(fn(x), model(x))
    assert cnt.frame_count == 2, tinydynamo.cache_info(fn).last_reason


def test_shared_guards_can_be_turned_off():
    tinydynamo.reset()
    model, cnt = Stack(), CompileCounter()
    with tinydynamo.config.patch(share_aliased_guards=False):
        fn = tinydynamo.optimize(cnt)(model)
        fn(torch.randn(2, 4))
    guards = tinydynamo.cache_info(fn).entries[0].check_fn.guards
    assert sum(g.name.endswith("config.scale") for g in guards) == 5  # layers[0..2], tied, the stack


class Reshaper(nn.Module):
    def __init__(self):
        super().__init__()
        self.shape = (2, 3)  # a tuple of constants: one TUPLE_MATCH, not a length plus one guard per item

    def forward(self, x):
        return x * self.shape[0] + self.shape[1]


def test_a_tuple_of_constants_is_one_guard_as_strict_as_its_items():
    tinydynamo.reset()
    model, cnt = Reshaper(), CompileCounter()
    fn = tinydynamo.optimize(cnt)(model)
    x = torch.randn(6, 4)
    torch.testing.assert_close(fn(x), model(x))
    guards = tinydynamo.cache_info(fn).entries[0].check_fn.guards
    assert [(g.kind, g.expected) for g in guards if "shape" in g.name] == [("TUPLE_MATCH", (2, 3))]
    model.shape = tuple([2, 3])  # equal, another object: still a hit
    torch.testing.assert_close(fn(x), model(x))
    assert cnt.frame_count == 1
    for changed in [(True, 3), (2, 3.0), (2, 3, 1), [2, 3], (3, 2)]:  # equal as numbers is not enough
        model.shape = changed
        torch.testing.assert_close(fn(x), model(x))
    assert cnt.frame_count == 6, tinydynamo.cache_info(fn).last_reason
