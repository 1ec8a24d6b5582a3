"""Helpers for tinydynamo's tests: compare a captured function with eager on several inputs."""
from __future__ import annotations

import torch

import tinydynamo
from tinydynamo.testing import CompileCounter


def check_same(fn, *input_sets, frames=1, nopython=True, repeats=2, **tol):
    """Compile ``fn`` with a CompileCounter; every input set (called ``repeats`` times) must match eager.

    Returns the counter, after asserting it saw exactly ``frames`` compiled frames.
    """
    tinydynamo.reset()
    cnt = CompileCounter()
    compiled = tinydynamo.optimize(cnt, nopython=nopython)(fn)
    for args in input_sets:
        for _ in range(repeats):
            torch.testing.assert_close(compiled(*args), fn(*args), **tol)
    assert cnt.frame_count == frames, f"expected {frames} compiled frames, got {cnt.frame_count}"
    return cnt
