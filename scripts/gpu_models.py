"""The real-model suite on a GPU: every zoo model through tininductor (real Triton), fp32 and bf16.

For each model (tests/model_zoo.py) and dtype, a deep copy runs eagerly and through
``tinydynamo.compile(..., backend="tininductor")``; the forward outputs, every parameter's
gradient and the buffers are compared, on the first and the second (cached) call.

Tolerances: fp32 compares elementwise (rtol = atol = 1e-3). bf16 has 8 bits of mantissa, and a
fused kernel rounds at other places than eager's op-by-op kernels, so both bf16 runs are measured
against a float64 run of the same model (as torch's own model tests do): the compiled result's
relative error in norm must be at most 3x eager bf16's plus 0.01. A wrong or missing gradient
(relative error ~1) still fails.
An fp32 mismatch is arbitrated in float64 (rtol = atol = 1e-5): BatchNorm over a handful of values
amplifies rounding, a real bug does not go away. Where float64 differs too, the model is so
ill-conditioned that two equal formulas disagree even in float64 (mnasnet at 32x32: BatchNorm over
the 2 values of a 1x1 map; eager fp32 itself is off from float64 in most gradients): then the fp32
run is measured against float64 as bf16's is, with a slack of 1e-4 instead of 0.01.
TF32 is off (fp32 means fp32).
A gradient that eager has and the compiled model lacks (or the reverse) always fails.

    python scripts/gpu_models.py [names...] [--dtypes fp32,bf16] [--json out.json]
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tinydynamo  # noqa: E402
from tests.model_zoo import EXTRA_MODELS, MODELS, first_tensor, flat_tensors  # noqa: E402

DEVICE = "cuda"  # --device cpu: the same checks on the CPU (C++ kernels, or TINY_CPU_BACKEND=triton)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}
# fp32 means fp32: TF32 matmuls/convolutions would differ from the compiled graph's by more than rounding
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def _cast(value, dtype, device):
    if isinstance(value, torch.Tensor):
        value = value.to(device)
        return value.to(dtype) if value.is_floating_point() else value
    return value


def _step(model, inputs):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    out = model(*inputs)
    first_tensor(out).float().pow(2).mean().backward()
    grads = {n: None if p.grad is None else p.grad.detach().float().clone() for n, p in model.named_parameters()}
    bufs = {n: b.detach().float().clone() for n, b in model.named_buffers() if b.is_floating_point()}
    return [t.detach().float().clone() for t in flat_tensors(out) if t.is_floating_point()], grads, bufs


def _problems(what, expected, actual, dtype, reference=None, against_truth=False):
    if isinstance(expected, list):
        if len(expected) != len(actual):
            return [f"{what}: {len(actual)} tensors vs eager {len(expected)}"]
        expected, actual = dict(enumerate(expected)), dict(enumerate(actual))
        reference = dict(enumerate(reference)) if reference is not None else None
    out = []
    for name, e in expected.items():
        a = actual.get(name)
        if e is None and a is None:
            continue
        if e is None and not a.any():
            continue  # eager None, compiled zeros: an unused parameter (torch.compile does the same)
        if (e is None) != (a is None):
            out.append(f"{what} {name}: {'missing' if a is None else 'extra'} gradient")
            continue
        if dtype in (torch.float32, torch.float64) and not against_truth:
            tol = 1e-3 if dtype == torch.float32 else 1e-5
            # float64 arbitration: atol scales with the tensor (mnasnet's gradients reach 1e6, and
            # float64 rounding at that scale leaves 0.06 on elements near zero)
            atol = tol if dtype == torch.float32 else tol * max(1.0, e.abs().max().item())
            if not torch.allclose(a, e, rtol=tol, atol=atol, equal_nan=True):
                out.append(f"{what} {name}: max abs diff {(a - e).abs().max().item():.3g} (max |eager| {e.abs().max().item():.3g})")
        else:  # bf16 (or ill-conditioned fp32): as close to the float64 truth as eager's own result, up to a factor
            r = reference.get(name) if reference is not None else None
            if r is None:
                r = e
            denom = r.norm().item() or 1.0
            err_compiled = (a - r).norm().item() / denom
            err_eager = (e - r).norm().item() / denom
            if not err_compiled <= 3 * err_eager + (0.01 if dtype == torch.bfloat16 else 1e-4):
                out.append(f"{what} {name}: relative error {err_compiled:.3g} vs eager's {err_eager:.3g}")
    return out


def check(zoo, dtype, against_truth=False) -> dict:
    """Eager vs compiled ``zoo`` model in ``dtype``; ``against_truth``: both measured against float64."""
    made = zoo.make()
    if made is None:
        return {"status": "skipped (library missing)"}
    model, inputs = made
    model = model.to(DEVICE, dtype)
    inputs = tuple(_cast(x, dtype, DEVICE) for x in inputs)
    compiled_model = copy.deepcopy(model)
    compiled = tinydynamo.compile(compiled_model, backend="tininductor")
    reference = None
    if dtype == torch.bfloat16 or against_truth:  # the float64 truth both runs are measured against
        ref_model, _ = zoo.make()
        ref_model = ref_model.to(DEVICE, torch.float64)
        ref_inputs = tuple(_cast(x, torch.float64, DEVICE) for x in made[1])
    problems = []
    start = time.perf_counter()
    for call in (1, 2):
        exp = _step(model, inputs)
        if dtype == torch.bfloat16 or against_truth:
            try:
                reference = _step(ref_model, ref_inputs)
            except RuntimeError:  # a float32-only kernel (transformers' grouped_mm): float32 is the reference
                ref_model, ref_inputs = ref_model.float(), tuple(_cast(x, torch.float32, DEVICE) for x in made[1])
                reference = _step(ref_model, ref_inputs)
        act = _step(compiled, inputs)
        for i, (what, e, a) in enumerate(zip(("output", "grad", "buffer"), exp, act)):
            ref = reference[i] if reference is not None else None
            problems += [f"call {call} {p}" for p in _problems(what, e, a, dtype, ref, against_truth)]
        if call == 1:
            first = time.perf_counter() - start
    result = {"status": "ok" if not problems else "WRONG", "problems": problems[:8], "first_call_s": round(first, 2)}
    if problems and dtype == torch.float32 and not against_truth and not any("gradient" in p for p in problems):
        # BatchNorm over a few values amplifies fp32 rounding: a real bug stays large in float64
        tinydynamo.reset()
        exact = check(zoo, torch.float64)
        if exact["status"] == "ok":
            result["status"], result["problems"] = "ok", ["fp32 rounding only: equal in float64"]
            return result
        # so ill-conditioned that float64 formulas disagree too: is compiled fp32 as near the truth as eager fp32?
        tinydynamo.reset()
        truth = check(zoo, torch.float32, against_truth=True)
        result["status"] = truth["status"]
        result["problems"] = (["ill-conditioned: as close to float64 as eager fp32"] if truth["status"] == "ok"
                              else exact["problems"][:4] + truth["problems"][:4])
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("names", nargs="*")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--extra", action="store_true", help="also the wider sweep (tests/model_zoo.py EXTRA_MODELS)")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    results = []
    for zoo in MODELS + (EXTRA_MODELS if args.extra or args.names else []):
        if args.names and zoo.name not in args.names:
            continue
        for dname in args.dtypes.split(","):
            tinydynamo.reset()
            try:
                res = check(zoo, DTYPES[dname])
            except Exception as e:  # a crash is a failure, reported with its cause
                res = {"status": "ERROR", "problems": [f"{type(e).__name__}: {e}"[:400]],
                       "trace": traceback.format_exc()[-1500:]}
            res.update(model=zoo.name, dtype=dname)
            results.append(res)
            print(f"{zoo.name:20s} {dname:5s} {res['status']:8s} {res.get('first_call_s', '')} "
                  f"{'; '.join(res.get('problems', []))[:300 if res['status'] == 'ok' else 2000]}", flush=True)
            if res["status"] == "ERROR":
                print(res["trace"], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    bad = [r for r in results if r["status"] not in ("ok",) and not r["status"].startswith("skipped")]
    print(f"{len(results) - len(bad)} passed, {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
