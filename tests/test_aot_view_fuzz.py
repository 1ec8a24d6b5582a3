"""Random programs of views, in-place writes and returned aliases, compiled and compared with eager.

Each program takes a non-leaf input ``a`` and makes a few values from earlier ones: views (``t``,
slices, ``unsqueeze``, ``diagonal``, ``detach``, ...), new tensors (``a * 2``, ``sin``) and in-place
writes (``add_``, ``mul_``, ``zero_``) into any of them, then returns some. After the call one
output may be written in place too. Compiled and eager must agree on every output's values, whether
it requires grad and shares the input's memory, the input's value, and each output's gradient.

Where eager raises (a saved tensor written before the backward, a write into one of several views
a function returned) the compiled call may compute instead: the functional graph keeps the value
it saved. Where the compiled call raises and eager does not, that is a loud failure, not a wrong
answer, and is not what this test looks for. What it must never do is answer differently.
"""
from __future__ import annotations

import random
import warnings

import pytest
import torch

import tinydynamo

VIEWS = {
    "t": lambda a: a.t() if a.dim() == 2 else a.view(-1),
    "flatten": lambda a: a.flatten(),
    "row0": lambda a: a[0],
    "slice": lambda a: a[1:],
    "unsqueeze": lambda a: a.unsqueeze(0),
    "diagonal": lambda a: a.diagonal() if a.dim() == 2 else a[:2],
    "detach": lambda a: a.detach(),
    "narrow": lambda a: a.narrow(0, 0, 1),
}
NEW = {"mul2": lambda a: a * 2, "sin": lambda a: a.sin(), "add1": lambda a: a + 1}
WRITES = {"add_": lambda a: a.add_(1), "mul_": lambda a: a.mul_(2), "zero_": lambda a: a.zero_()}


def random_program(seed: int) -> tuple[list, list[int]]:
    """Steps ``(table, name, source index)`` and the indices of the values returned."""
    rng = random.Random(seed)
    steps, n = [], 1
    for _ in range(rng.randint(2, 6)):
        table = rng.choice([VIEWS, VIEWS, NEW, WRITES])
        steps.append((table, rng.choice(sorted(table)), rng.randrange(n)))
        n += table is not WRITES
    returned = sorted(rng.sample(range(1, n), min(n - 1, rng.randint(1, 3))))
    return steps, returned


def run(steps, returned, a):
    values = [a]
    for table, name, src in steps:
        result = table[name](values[src])
        if table is not WRITES:
            values.append(result)
    return tuple(values[i] for i in returned)


def observe(fn, x0: torch.Tensor, write: int | None, requires_grad: bool):
    """What a caller can see of one call, or the name of the error it raised."""
    x = x0.clone().requires_grad_(requires_grad)
    a = x * 1 if requires_grad else x  # a non-leaf input: writable in place
    try:
        outs = list(fn(a))
        if write is not None:
            outs[write % len(outs)].mul_(3)
    except RuntimeError as e:
        return f"raises {type(e).__name__}"
    seen = {"values": [o.detach().clone() for o in outs], "input": a.detach().clone(),
            "requires_grad": [o.requires_grad for o in outs],
            "shares_input": [o.untyped_storage().data_ptr() == a.untyped_storage().data_ptr() for o in outs],
            "grads": []}
    for o in outs:
        if not (requires_grad and o.requires_grad):
            seen["grads"].append(None)
            continue
        weights = torch.arange(o.numel(), dtype=o.dtype).view(o.shape)
        try:
            seen["grads"].append(torch.autograd.grad((o * weights).sum(), x, retain_graph=True, allow_unused=True)[0])
        except RuntimeError as e:
            seen["grads"].append(f"raises {type(e).__name__}")
    return seen


def differences(want, got) -> list[str]:
    """What the compiled call answered differently (a difference only where both answered)."""
    if isinstance(want, str) or isinstance(got, str):
        return []  # one side raised (see the module docstring)
    found = []
    for key in want:
        for w, g in zip(want[key], got[key]) if isinstance(want[key], list) else [(want[key], got[key])]:
            if isinstance(w, str) or isinstance(g, str):
                continue
            if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor):
                if w.shape != g.shape or not torch.allclose(w, g, equal_nan=True):
                    found.append(key)
            elif w != g:
                found.append(key)
    return found


@pytest.mark.parametrize("backend", ["aot_eager", "tininductor"])
@pytest.mark.parametrize("block", range(4))
def test_random_view_and_write_programs_answer_as_eager(backend, block):
    failures = []
    for seed in range(block * 15, block * 15 + 15):
        steps, returned = random_program(seed)
        if not returned:
            continue
        fn = lambda a, steps=steps, returned=returned: run(steps, returned, a)  # noqa: E731
        x0 = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        for requires_grad in (True, False):
            for write in (None, 0, 1):
                want = observe(fn, x0, write, requires_grad)
                tinydynamo.reset()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a graph run as captured says so; not checked here
                    got = observe(tinydynamo.compile(fn, backend=backend), x0, write, requires_grad)
                diff = differences(want, got)
                if diff:
                    program = " ; ".join(f"{name}(v{src})" for _, name, src in steps)
                    failures.append(f"seed {seed}, requires_grad={requires_grad}, write={write}: "
                                    f"{program} -> {returned}: {sorted(set(diff))}")
    assert not failures, "\n".join(failures)
