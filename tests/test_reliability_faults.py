"""Reliability: a backend stage that raises.

With ``fullgraph=True`` or ``tinydynamo.config.suppress_errors = False`` the error reaches the
user as :class:`tinydynamo.exc.BackendCompilerFailed` naming the stage (torch.compile raises
its ``BackendCompilerFailed`` the same way); otherwise the frame falls back to eager with ONE
warning and eager's results. Each fault is injected by patching one stage's entry point.

These cases compare against a rule, not against eager (eager has no compiler to fail), so they
are counted in the table by :func:`fault_outcomes`.
"""
from __future__ import annotations

import contextlib
import warnings
from unittest import mock

import pytest
import torch

import tinydynamo
from tinydynamo.exc import BackendCompilerFailed


def _boom(*args, **kwargs):
    raise RuntimeError("injected fault")


#: stage -> (backend, patch target, train?)  (train: the graph needs a backward)
STAGES = {
    "aliasing": ("aot_eager", "tininductor.aliasing.analyze", False),
    "decompose": ("aot_eager", "tininductor.aot_autograd.decompose", False),
    "joint_graph": ("aot_eager", "tininductor.aot_autograd.create_joint", True),
    "partition": ("tininductor", "tininductor.partitioners.min_cut_partition", True),
    "lowering": ("tininductor", "tininductor.graph.GraphLowering.run", False),
    "scheduling": ("tininductor", "tininductor.scheduler.Scheduler.__init__", False),
    "codegen": ("tininductor", "tininductor.codegen.wrapper.WrapperCodeGen.generate", False),
    "load_module": ("tininductor", "tininductor.codecache.PyCodeCache.load", False),
}


def _fn(x, w):
    return (x * w).sin() + 1


def _inputs(train: bool):
    return torch.arange(4.0), torch.ones(4, requires_grad=train)


def run_fault(stage: str, mode: str):
    """``(raised exception or None, warnings, result matches eager)`` for one injected fault;
    mode: "fullgraph", "suppress_errors=False" or "default"."""
    backend, target, train = STAGES[stage]
    tinydynamo.reset()
    x, w = _inputs(train)
    expected = _fn(x, w)
    kw = {"fullgraph": True} if mode == "fullgraph" else {}
    cfg = tinydynamo.config.patch(suppress_errors=False) if mode == "suppress_errors=False" else contextlib.nullcontext()
    with cfg, mock.patch(target, _boom), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = tinydynamo.compile(_fn, backend=backend, **kw)(x, w)
            out2 = tinydynamo.compile(_fn, backend=backend, **kw)(x, w)  # a second call: no new warning
        except Exception as e:  # noqa: BLE001
            return e, caught, False
    ok = torch.allclose(out, expected) and torch.allclose(out2, expected) and out.requires_grad == expected.requires_grad
    return None, [w for w in caught if "injected fault" in str(w.message)], ok


@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("mode", ["fullgraph", "suppress_errors=False"])
def test_fault_raises_when_asked(stage, mode):
    error, _, _ = run_fault(stage, mode)
    assert isinstance(error, BackendCompilerFailed), f"expected BackendCompilerFailed, got {error!r}"
    assert error.stage == stage, f"stage named {error.stage!r}, not {stage!r}"
    assert "injected fault" in str(error)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_fault_falls_back_with_one_warning(stage):
    error, caught, ok = run_fault(stage, "default")
    assert error is None, f"raised {error!r}"
    assert ok, "the fallback's result differs from eager"
    assert len(caught) == 1, [str(w.message) for w in caught]


def fault_outcomes() -> dict[str, int]:
    """For the table: every (stage, mode) case as ok / wrong / raised."""
    counts = {"cases": 0, "ok": 0, "wrong": 0, "raised": 0}
    for stage in STAGES:
        for mode in ("fullgraph", "suppress_errors=False", "default"):
            error, caught, ok = run_fault(stage, mode)
            counts["cases"] += 1
            if mode == "default":
                key = "raised" if error is not None else "ok" if ok and len(caught) == 1 else "wrong"
            else:
                key = "ok" if isinstance(error, BackendCompilerFailed) and error.stage == stage else "wrong"
            counts[key] += 1
    return counts
