"""Real models (torchvision, timm, transformers; tests/model_zoo.py) through tinydynamo, checked against eager.

For every model and backend: a deep copy of the same randomly initialised model is run eagerly and
through ``tinydynamo.compile``; the forward outputs and every parameter's ``.grad`` must match
(fp32, rtol=atol=1e-4 for eager/aot_eager, 1e-3 for tininductor's generated kernels), a parameter
with a gradient in eager must have one compiled (a dropped gradient fails), buffers (BatchNorm's
running stats, ``num_batches_tracked``) must match, and a second call (served from the cache) must
match too. Graph and break counts are recorded next to torch.compile's on the same model.

CI runs eager and aot_eager on every model, tininductor (C++) on a few; ``--runslow`` runs
tininductor on all. The table:  ``python -m tests.test_real_models [names...] [--backends eager,...] [--extra]``
(``--extra``: a wider sweep of 35 more architectures, not run in CI).
"""
from __future__ import annotations

import copy
import dataclasses
import sys
import warnings

import pytest
import torch

import tinydynamo
from bench.dashboard import compare_with_truth
from tests.model_zoo import BY_NAME, EXTRA_MODELS, MODELS, first_tensor, flat_tensors
from tinydynamo.eval_frame import counters
from tinydynamo.testing import CompileCounterWithBackend

TOLERANCE = {"eager": 1e-4, "aot_eager": 1e-4, "tininductor": 1e-3}
CI_TININDUCTOR = ("resnet18", "mobilenet_v3_small", "gpt2", "llama")  # tininductor in CI; all with --runslow


@dataclasses.dataclass
class Result:
    model: str
    backend: str
    status: str  # "ok" or what went wrong
    graphs: int = 0
    breaks: int = 0
    eager_frames: int = 0  # frames that ran eagerly (not resumable / unsupported)
    torch_graphs: int | None = None
    torch_breaks: int | None = None


def _run_step(model, inputs, loss_fn=None):
    """One forward and backward: (outputs, {parameter name: grad}, {buffer name: value})."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same random stream for eager and compiled (models are built without dropout)
    out = model(*inputs)
    loss = first_tensor(out)
    # every output element contributes, with a non-uniform gradient; half precision is summed in float32
    # and float64 stays float64 (the float64 arbiter must not round through float32)
    loss = loss.float() if loss.dtype in (torch.float16, torch.bfloat16) else loss
    loss.pow(2).mean().backward()
    grads = {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    return [t.detach().clone() for t in flat_tensors(out)], grads, buffers


def _compare(what: str, expected, actual, tol: float) -> list[str]:
    problems = []
    if isinstance(expected, list):
        if len(expected) != len(actual):
            return [f"{what}: {len(actual)} output tensors, eager has {len(expected)}"]
        expected, actual = dict(enumerate(expected)), dict(enumerate(actual))
    for name, e in expected.items():
        a = actual.get(name)
        if e is None and a is None:
            continue
        if e is None and what == "grad" and not a.any():
            continue  # AOT autograd gives unused parameters zero gradients where eager leaves None (as torch.compile)
        if e is None or a is None:
            problems.append(f"{what} {name}: {'missing (None)' if a is None else 'not None'} where eager has "
                            f"{'a value' if a is None else 'None'}")
            continue
        if e.shape != a.shape or e.dtype != a.dtype:
            problems.append(f"{what} {name}: {a.dtype}{list(a.shape)} vs eager {e.dtype}{list(e.shape)}")
        elif not torch.allclose(a.float(), e.float(), rtol=tol, atol=tol, equal_nan=True):
            diff = (a.float() - e.float()).abs().max().item()
            problems.append(f"{what} {name}: max abs diff {diff:.3g} (tol {tol})")
    return problems


def torch_compile_counts(name: str) -> tuple[int, int]:
    """(graphs, breaks) torch.compile makes of the same model and step (CompileCounter backend)."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters as torch_counters

    made = BY_NAME[name].make()
    model, inputs = made
    torch._dynamo.reset()
    torch_counters.clear()
    cnt = CompileCounter()
    compiled = torch.compile(model, backend=cnt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _run_step(compiled, inputs)
    breaks = sum(torch_counters["graph_break"].values())
    torch._dynamo.reset()
    return cnt.frame_count, breaks


def check_model(name: str, backend: str, with_torch: bool = False, dtype=torch.float32) -> Result:
    """Run ``name`` eagerly and through tinydynamo with ``backend`` twice; a Result (status 'ok' or the problems).

    A float32 mismatch is arbitrated against the float64 truth, by the dashboard's rule
    (``bench.dashboard.compare_with_truth``): BatchNorm over a handful of values (the last stages
    of a CNN on a small image) amplifies rounding past any fixed tolerance, in float64 too (the
    same ops in another order move MobileNetV2's float64 gradients by 3e-7), while a wrong or lost
    gradient is as far from the truth as it is from eager. The same initial model runs the same
    calls eagerly in float64; each mismatching tensor passes if its error from that truth is at
    most 3x eager float32's own (plus a slack), and only that verdict counts (said in the status).
    """
    zm = BY_NAME[name]
    made = zm.make()
    if made is None:
        return Result(name, backend, f"skipped: {zm.library} is not installed")
    model, inputs = made
    if dtype != torch.float32:
        model = model.to(dtype)
        inputs = tuple(x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
    compiled_model = copy.deepcopy(model)
    initial = copy.deepcopy(model)  # the float64 truth starts from the same weights and buffers
    calls = []  # (eager's, the compiled model's) result of each call
    tinydynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = tinydynamo.compile(compiled_model, backend=counter)
    problems = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in (1, 2):  # the second call is a cache hit
            expected = _run_step(model, inputs)
            actual = _run_step(compiled, inputs)
            calls.append((expected, actual))
            tol = TOLERANCE.get(backend, 1e-4) if dtype == torch.float32 else 1e-7
            for what, e, a in zip(("output", "grad", "buffer"), expected, actual):
                problems += [f"call {step}: {p}" for p in _compare(what, e, a, tol)]
            if step == 1:
                graphs = counter.frame_count
            if problems:
                break
    problems += [f"warning: {w.message}" for w in caught if "tinydynamo" in str(w.message)]
    result = Result(name, backend, "; ".join(problems[:4]) or "ok", graphs,
                    sum(counters["graph_breaks"].values()), counters["frames"]["unsupported"] + counters["frames"]["failed"])
    if counter.frame_count != graphs:
        result.status = (result.status if problems else "") + f" recompiled on the second call ({counter.frame_count} graphs)"
    if graphs == 0 and result.status == "ok":
        result.status = "no graph: ran 100% eagerly"
    if with_torch:
        result.torch_graphs, result.torch_breaks = torch_compile_counts(name)
    tinydynamo.reset()
    if dtype == torch.float32 and any("max abs diff" in p for p in problems) and \
            not any("warning" in p or "missing" in p or "None" in p for p in problems):
        try:
            wrong = _against_float64_truth(initial, inputs, calls)
        except RuntimeError as e:  # a model with a float32-only kernel (transformers' grouped_mm): no arbiter
            result.status += f" (no float64 arbitration: {str(e)[:80]})"
            return result
        result.status = "ok (float32 rounding: as close to float64 as eager)" if not wrong else \
            "float64 truth: " + "; ".join(wrong[:4])
    return result


def _named(step) -> dict:
    """A call's outputs, gradients and buffers as one flat dict (``compare_with_truth``'s input)."""
    outputs, grads, buffers = step
    return {**{f"output {i}": t for i, t in enumerate(outputs)}, **{f"grad {n}": g for n, g in grads.items()},
            **{f"buffer {n}": b for n, b in buffers.items() if b.is_floating_point()}}


def _against_float64_truth(initial, inputs, calls) -> list[str]:
    """The problems left when each call's float32 results are measured against the float64 truth."""
    exact = initial.to(torch.float64)
    inputs64 = tuple(x.to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                     for x in inputs)
    wrong = []
    for n, (expected, actual) in enumerate(calls, 1):
        truth = _named(_run_step(exact, inputs64))
        wrong += [f"call {n}: {p}" for p in compare_with_truth(_named(expected), _named(actual), truth, torch.float32)]
    return wrong


#: (model, backend) -> why it is expected to fail (a strict xfail: it must fail, or the entry goes)
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def _params():
    for zm in MODELS:
        for backend in ("eager", "aot_eager", "tininductor"):
            marks = []
            if backend == "tininductor" and zm.name not in CI_TININDUCTOR:
                marks.append(pytest.mark.slow)
            if (zm.name, backend) in KNOWN_FAILURES:
                marks.append(pytest.mark.xfail(reason=KNOWN_FAILURES[zm.name, backend], strict=True))
            yield pytest.param(zm.name, backend, id=f"{zm.name}-{backend}", marks=marks)


@pytest.mark.parametrize("name,backend", list(_params()))
def test_real_model_matches_eager(name, backend):
    result = check_model(name, backend, with_torch=backend == "eager")
    if result.status.startswith("skipped"):
        pytest.skip(result.status)
    assert result.status.startswith("ok"), f"{name} under {backend}: {result.status}"
    assert result.graphs > 0, f"{name}: no graph captured"
    if result.torch_graphs is not None:  # as many graphs as torch.compile makes of the same model and step
        assert result.graphs == result.torch_graphs, \
            f"{name}: tinydynamo {result.graphs} graphs ({result.breaks} breaks), torch.compile {result.torch_graphs}"


def library_versions() -> str:
    """``torch 2.13.0, transformers 5.24.0, timm ..., torchvision ...``: the table depends on them
    (library code changes between releases: a model that compiles with one may break with another)."""
    import importlib.metadata

    found = []
    for lib in ("torch", "transformers", "timm", "torchvision"):
        try:
            found.append(f"{lib} {importlib.metadata.version(lib)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{lib} (not installed)")
    return ", ".join(found)


def print_table(names, backends) -> None:
    print(library_versions())
    header = f"{'model':20} {'backend':12} {'graphs':>6} {'breaks':>6} {'eager':>5} {'torch g/b':>9}  status"
    print(header)
    print("-" * len(header))
    torch_counts = {}
    for name in names:
        for backend in backends:
            r = check_model(name, backend)
            if name not in torch_counts:
                torch_counts[name] = torch_compile_counts(name)
            tg, tb = torch_counts[name]
            print(f"{name:20} {backend:12} {r.graphs:6} {r.breaks:6} {r.eager_frames:5} {f'{tg}/{tb}':>9}  {r.status}",
                  flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    backends = ["eager", "aot_eager", "tininductor"]
    if "--backends" in args:
        i = args.index("--backends")
        backends = args[i + 1].split(",")
        del args[i:i + 2]
    if "--extra" in args:  # the wider sweep of tests/model_zoo.py's EXTRA_MODELS
        args.remove("--extra")
        args += [m.name for m in EXTRA_MODELS]
    print_table(args or [m.name for m in MODELS], backends)


def test_float64_arbiter_accepts_eager_and_rejects_a_wrong_gradient():
    """The arbiter passes eager's own float32 results and fails a gradient 1% off or one that is lost."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))
    inputs = (torch.randn(2, 3, 8, 8),)
    initial = copy.deepcopy(model)
    expected = _run_step(model, inputs)
    assert _against_float64_truth(initial, inputs, [(expected, expected)]) == []
    outputs, grads, buffers = expected
    for wrong in ({**grads, "1.weight": grads["1.weight"] * 1.01}, {**grads, "0.bias": None}):
        problems = _against_float64_truth(initial, inputs, [(expected, (outputs, wrong, buffers))])
        assert len(problems) == 1 and ("1.weight" in problems[0] or "0.bias" in problems[0]), problems
