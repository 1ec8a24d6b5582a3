"""Kernels generated once per structure: groups of the same structure (a model's repeated layers)
share one kernel, called with each group's buffers; groups that differ in anything their code
depends on get kernels of their own. Every result is checked against eager."""
from unittest import mock

import pytest
import torch

from tininductor import config
from tininductor.codegen.wrapper import WrapperCodeGen
from tininductor.scheduler import FusedGroup
from tininductor.testing import DEVICE, compile_graph, patch_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def layers(x, w1, w2, w3, w4):
    """Four blocks of the same structure, each a matmul and a pointwise tail (its own kernel)."""
    for w in (w1, w2, w3, w4):
        x = torch.relu(x @ w) * 2 + 1
    return x


def scales(x, w1, w2):
    """Two blocks that differ only in a constant."""
    x = torch.relu(x @ w1) * 2
    return torch.relu(x @ w2) * 3


def roles(x, y, w1, w2):
    """Two blocks with the same ops whose buffers play other roles: ``a * b``, then ``a * a``."""
    a = (x @ w1) * y
    b = a @ w2
    return a, b * b


def args_of(count: int, extra=()):
    return [torch.randn(8, 16, device=DEVICE), *extra, *[torch.randn(16, 16, device=DEVICE) / 4 for _ in range(count)]]


def compile_counting(fn, args, **options):
    """(compiled fn, how many kernels the backend generated for it)."""
    generated = []
    real = WrapperCodeGen._add

    def counting(self, kernel):
        generated.append(kernel)
        return real(self, kernel)

    with mock.patch.object(WrapperCodeGen, "_add", counting), \
            patch_config(config, check_kernel_reuse=False, **options):
        compiled = compile_graph(fn, args)
    return compiled, len(generated)


def test_repeated_blocks_generate_one_kernel():
    args = args_of(4)
    compiled, generated = compile_counting(layers, args)
    torch.testing.assert_close(compiled(*args), layers(*args))
    assert generated == 1 and len(compiled.kernels) == 1, compiled.source
    calls = compiled.source.split("def call(args):")[1].split("def get_args")[0]
    assert calls.count(compiled.kernels[0]) == 4  # called once per block
    off, generated_off = compile_counting(layers, args, reuse_kernels_by_structure=False)
    assert generated_off == 4 and len(off.kernels) == 1  # each generated, then found equal by its code


def test_blocks_that_differ_get_kernels_of_their_own():
    args = args_of(2)
    compiled, generated = compile_counting(scales, args)
    torch.testing.assert_close(compiled(*args), scales(*args))
    assert generated == 2 and len(compiled.kernels) == 2


def test_a_buffer_in_two_roles_is_another_structure():
    args = args_of(2, extra=[torch.randn(8, 16, device=DEVICE)])
    compiled, generated = compile_counting(roles, args)
    for actual, expected in zip(compiled(*args), roles(*args)):
        torch.testing.assert_close(actual, expected)
    assert generated == 2, compiled.source


def test_structure_keys_name_buffers_by_role():
    args = args_of(4)
    seen = []
    real = FusedGroup.structure

    def recording(self):
        seen.append(real(self))
        return seen[-1]

    with mock.patch.object(FusedGroup, "structure", recording):
        compile_graph(layers, args)
    keys = {key for key, _ in seen}
    buffers = [names for _, names in seen]
    assert len(seen) == 4 and len(keys) == 1
    assert len({tuple(names) for names in buffers}) == 4  # each block's own buffers


def test_the_check_catches_a_key_that_misses_a_difference():
    args = args_of(2)
    real = FusedGroup.structure

    def blind(self):  # a key that leaves the constants out: both blocks look alike
        key, names = real(self)
        return ("one key",), names

    with mock.patch.object(FusedGroup, "structure", blind), patch_config(config, check_kernel_reuse=True), \
            pytest.raises(AssertionError, match="kernel reuse"):
        compile_graph(scales, args)
