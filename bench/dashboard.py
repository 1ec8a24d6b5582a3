"""The model dashboard: public models through eager, torch.compile and tinydynamo, in one process.

In the manner of PyTorch's compile dashboard. Each model of torchvision, timm and transformers is
built from a config with random weights (nothing is downloaded) and run, per suite (inference, a
training step) and dtype, by every backend:

1. **accuracy first**: the backend's outputs (inference) or loss and every parameter's gradient
   (training) are compared with eager's; a backend that fails is not timed;
2. then the **time per call** (device synchronised, first call excluded), the **speedup over
   eager**, the **first call** (compile included) and the **peak memory** of the backend's run
   (``torch.cuda.max_memory_allocated`` on CUDA; on the CPU it is not measured). The first call is a
   cold compile: each model runs in a process of its own (a process keeps what it compiled: a later
   model's first call would find an earlier one's kernels in memory), with the compile caches on
   disk at fresh directories; tiny's is split by
   phase in the JSON (``tinydynamo.utils.compile_times``: trace, decompose, lowering, the wait for
   Triton, ...). The backends that
   passed are timed in turns (``course.benchmark.bench_interleaved``: each round times every one),
   so that a noisy host or a drifting clock weighs on all of them alike: timed one after the other,
   two runs of the same model have differed by 2x on a shared host.

Tolerance: the error relative to the tensor's norm, ``|a - e| / |e|``, at most 1e-3 in fp32 and
3e-2 in bf16 (bf16 keeps 8 bits of mantissa, and a fused kernel rounds at other places than
eager's op-by-op kernels). A tensor past that is arbitrated in float64, as scripts/gpu_models.py
does: it passes if its error from the float64 result is at most 3x eager's own plus a slack, 0.01
in bf16 (a batch norm's bias gradient sums 10^5 bf16 values; neither side is exact) and 1e-4 in
fp32 (where a small model's batch norms over a 1x1 map amplify fp32 rounding: eager fp32's first
gradients of the test zoo's MobileNetV3 are 1% from float64, and so are tiny's).
A gradient one side has and the other lacks always fails. TF32 is off.

A model that fails (a library missing, an error, a wrong result, the time limit) is recorded with
its status and the run goes on. ``--sizes small`` uses the test zoo's scaled-down models
(tests/model_zoo.py: seconds per model on a CPU, the CI slice); ``--sizes real`` the architectures at
their published sizes (224x224 images, 128-512 tokens).

    python bench/dashboard.py --device cuda --dtype bf16 --suite inference --models resnet50,bert
    python bench/dashboard.py --device cpu --sizes small --accuracy-only --backends eager,tiny
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

# both compilers' modules are imported before any first call is timed, so that neither first call
# pays imports a process pays once (in a run of many models only the first model's would)
import torch._inductor.compile_fx  # noqa: F401

import tininductor.compile_fx  # noqa: F401
from course import benchmark as harness
from tests import model_zoo
from tests.model_zoo import first_tensor, flat_tensors
from tininductor.runtime.compile_worker import MAX_WORKERS, usable_cores
from tinydynamo.exc import EagerFallbackWarning
from tinydynamo.utils import compile_times, reset_compile_times

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 3e-2}  # relative error in norm
SLACK = {torch.float32: 1e-4, torch.bfloat16: 1e-2}  # over 3x eager's error from float64 (compare_with_truth)
SUITES = ("inference", "training")
MODES = ("default", "reduce-overhead")


# ---- the models at their published sizes ---------------------------------------------------------
def _images(batch=16, hw=224):
    return (torch.randn(batch, 3, hw, hw),)


def _ids(batch=8, seq=256, vocab=30000):
    return (torch.randint(1, vocab, (batch, seq)),)


def _tv(fn_name, **kwargs):
    def build(tv):
        return getattr(tv.models, fn_name)(weights=None, **kwargs), _images()
    return build


def _timm(name, **kwargs):
    def build(timm):
        return timm.create_model(name, pretrained=False, **kwargs), _images()
    return build


def _hf(config_cls, model_cls, inputs=_ids, **cfg):
    """A transformers model from ``config_cls(**cfg)`` (dropout off, SDPA attention where it exists)."""
    def build(tr):
        config = getattr(tr, config_cls)(**cfg)
        for key, value in list(vars(config).items()):  # dropout off: eager and compiled draw other numbers
            if isinstance(value, float) and ("dropout" in key or "pdrop" in key or "drop_path" in key
                                             or key == "layerdrop"):
                setattr(config, key, 0.0)
        config.use_cache = False
        return getattr(tr, model_cls)(config), inputs()
    return build


def _encoder_decoder_ids():
    ids = _ids()[0]
    return ids, None, ids[:, :64]  # input_ids, attention_mask, decoder_input_ids


_LLAMA = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
              "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 1024}


@dataclasses.dataclass
class DashboardModel:
    """One model: ``real`` builds it at its published size, ``small`` names its tests/model_zoo.py version."""

    name: str
    library: str  # "torchvision" / "timm" / "transformers": skipped where it is not installed
    real: Callable[[Any], tuple[torch.nn.Module, tuple]]
    small: str | None = None  # tests/model_zoo.py name; None: only at the real size

    def make(self, size: str):
        if size == "small":
            if self.small is None:
                return None
            return model_zoo.BY_NAME[self.small].make()
        lib = {"torchvision": model_zoo.import_torchvision, "timm": model_zoo.import_timm,
               "transformers": model_zoo.import_transformers}[self.library]()
        if lib is None:
            return None
        torch.manual_seed(0)
        return self.real(lib)


MODELS: list[DashboardModel] = [
    DashboardModel("resnet18", "torchvision", _tv("resnet18"), "resnet18"),
    DashboardModel("resnet50", "torchvision", _tv("resnet50"), "resnext"),
    DashboardModel("resnext50", "torchvision", _tv("resnext50_32x4d")),
    DashboardModel("mobilenet_v2", "torchvision", _tv("mobilenet_v2"), "mobilenet_v2"),
    DashboardModel("mobilenet_v3_large", "torchvision", _tv("mobilenet_v3_large"), "mobilenet_v3_small"),
    DashboardModel("efficientnet_b0", "torchvision", _tv("efficientnet_b0"), "efficientnet_b0"),
    DashboardModel("regnet_y_400mf", "torchvision", _tv("regnet_y_400mf"), "regnet"),
    DashboardModel("convnext_tiny", "torchvision", _tv("convnext_tiny"), "convnext_tv"),
    DashboardModel("swin_t", "torchvision", _tv("swin_t"), "swin_tv"),
    DashboardModel("vit_b_16", "torchvision", _tv("vit_b_16"), "vit_tv"),
    DashboardModel("densenet121", "torchvision", _tv("densenet121"), "densenet"),
    DashboardModel("squeezenet", "torchvision", _tv("squeezenet1_1"), "squeezenet"),
    DashboardModel("shufflenet_v2", "torchvision", _tv("shufflenet_v2_x1_0"), "shufflenet_v2"),
    DashboardModel("timm_vit_small", "timm", _timm("vit_small_patch16_224"), "vit_timm"),
    DashboardModel("timm_convnext_tiny", "timm", _timm("convnext_tiny"), "convnext_timm"),
    DashboardModel("timm_mixer", "timm", _timm("mixer_b16_224"), "mixer_timm"),
    DashboardModel("bert", "transformers", _hf("BertConfig", "BertModel"), "bert"),
    DashboardModel("distilbert", "transformers", _hf("DistilBertConfig", "DistilBertModel"), "distilbert"),
    DashboardModel("roberta", "transformers", _hf("RobertaConfig", "RobertaModel", vocab_size=30000), "roberta"),
    DashboardModel("gpt2", "transformers", _hf("GPT2Config", "GPT2LMHeadModel"), "gpt2"),
    DashboardModel("llama", "transformers", _hf("LlamaConfig", "LlamaForCausalLM", **_LLAMA), "llama"),
    DashboardModel("qwen2", "transformers", _hf("Qwen2Config", "Qwen2ForCausalLM", **_LLAMA), "qwen2"),
    DashboardModel("opt", "transformers", _hf("OPTConfig", "OPTForCausalLM", hidden_size=768, ffn_dim=3072,
                                              num_hidden_layers=12, num_attention_heads=12, vocab_size=30000,
                                              word_embed_proj_dim=768), "opt"),
    DashboardModel("t5", "transformers", _hf("T5Config", "T5Model", _encoder_decoder_ids, vocab_size=30000), "t5"),
    DashboardModel("bart", "transformers", _hf("BartConfig", "BartModel", vocab_size=30000), "bart"),
    DashboardModel("vit_hf", "transformers", _hf("ViTConfig", "ViTModel", _images), "vit_hf"),
]
BY_NAME = {m.name: m for m in MODELS}


# ---- running one model ---------------------------------------------------------------------------
class TimeLimit(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise :class:`TimeLimit` in this thread after ``seconds`` (SIGALRM; no limit where there is none)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise TimeLimit(f"over the per-model time limit of {seconds:.0f}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _no_dropout(model: torch.nn.Module) -> None:
    """Dropout and stochastic depth off: eager and a compiled model would draw different numbers."""
    for module in model.modules():
        if "Drop" in type(module).__name__ or "Stochastic" in type(module).__name__:
            for attr in ("p", "drop_prob"):
                if isinstance(getattr(module, attr, None), float):
                    setattr(module, attr, 0.0)


def _cast(value, dtype, device):
    if isinstance(value, torch.Tensor):
        value = value.to(device)
        return value.to(dtype) if value.is_floating_point() else value
    return value


def make_step(model: torch.nn.Module, suite: str) -> Callable:
    """The callable timed and checked: a no-grad forward, or forward + loss + backward."""
    if suite == "inference":
        def infer(*inputs):
            with torch.no_grad():
                return model(*inputs)
        return infer

    def train(*inputs):
        model.zero_grad(set_to_none=True)
        loss = first_tensor(model(*inputs)).float().pow(2).mean()
        loss.backward()
        return loss
    return train


def snapshot(model: torch.nn.Module, suite: str, result) -> dict[str, torch.Tensor | None]:
    """What accuracy compares, copied out (a CUDA graph's outputs are overwritten by the next call)."""
    if suite == "inference":
        return {f"output {i}": t.detach().float().clone() for i, t in enumerate(flat_tensors(result))
                if t.is_floating_point()}
    grads = {f"grad {n}": None if p.grad is None else p.grad.detach().float().clone()
             for n, p in model.named_parameters()}
    return {"loss": result.detach().float().clone().reshape(1), **grads}


def compare(expected: dict, actual: dict, dtype: torch.dtype) -> list[str]:
    """Problems of ``actual`` against eager's ``expected`` (empty: equal within the dtype's tolerance)."""
    if expected.keys() != actual.keys():
        return [f"outputs {sorted(actual)[:4]} vs eager {sorted(expected)[:4]}"]
    tol, problems = TOLERANCE[dtype], []
    for key, e in expected.items():
        a = actual[key]
        if e is None or a is None:
            if (e is None) != (a is None) and not (e is None and not a.any()):  # zeros for an unused parameter
                problems.append(f"{key}: {'missing' if a is None else 'extra'} gradient")
            continue
        if e.shape != a.shape:
            problems.append(f"{key}: shape {tuple(a.shape)} vs eager {tuple(e.shape)}")
            continue
        scale = e.norm().item()
        err = (a - e).norm().item()
        if not (err <= tol * scale + 1e-6 * math.sqrt(e.numel())):  # NaN fails too
            problems.append(f"{key}: relative error {err / (scale or 1):.3g} > {tol}")
    return problems


def float64_snapshot(model: torch.nn.Module, inputs: tuple, suite: str, device: str) -> dict:
    """The same step in float64: the truth a result past the tolerance is measured against."""
    exact = copy.deepcopy(model).to(torch.float64)
    out = make_step(exact, suite)(*(_cast(x, torch.float64, device) for x in inputs))
    return snapshot(exact, suite, out)


def compare_with_truth(expected: dict, actual: dict, truth: dict, dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """Each tensor's error from the float64 truth, relative to its norm, at most 3x eager's + ``SLACK[dtype]``
    (a fused kernel rounds elsewhere than eager's, and a sum over 10^5 bf16 values is not exact in either)."""
    problems = []
    for key, e in expected.items():
        a, t = actual.get(key), truth.get(key)
        if e is None or a is None or t is None:
            if (e is None) != (a is None) and not (e is None and not a.any()):
                problems.append(f"{key}: {'missing' if a is None else 'extra'} gradient")
            continue
        scale = t.norm().item() or 1.0
        err, eager_err = (a - t).norm().item() / scale, (e - t).norm().item() / scale
        if not err <= 3 * eager_err + SLACK[dtype]:
            problems.append(f"{key}: relative error {err:.3g} from float64 vs eager {DTYPE_NAMES[dtype]}'s {eager_err:.3g}")
    return problems


def compiler(name: str, mode: str) -> Callable[[torch.nn.Module], torch.nn.Module]:
    mode = None if mode == "default" else mode
    return harness.compilers([name], mode)[name]


def run_backend(name: str, zoo_model: torch.nn.Module, inputs: tuple, suite: str, args, device: str,
                base_bytes: int = 0) -> tuple[dict, Callable]:
    """One backend on a deep copy of the model: first call, accuracy snapshot, peak memory; returns the
    row and the step, which :func:`run_model` times later, in turns with the other backends'.

    Peak memory counts the model and inputs (``base_bytes``, allocated before any backend ran) plus
    what this backend allocated at its peak, not the memory other backends' steps still hold."""
    cuda = device.startswith("cuda")
    held_by_others = torch.cuda.memory_allocated() - base_bytes if cuda else 0
    model = copy.deepcopy(zoo_model)
    compiled = compiler(name, args.mode)(model) if name != "eager" else model
    step = make_step(compiled, suite)
    # gradients land on ``model``'s parameters (compiled wraps it)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    if name == "tiny":  # where its first call goes, by phase (nested: compile_frame holds the rest)
        reset_compile_times()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        out = step(*inputs)
        harness.synchronize(device)
        row = {"first call s": time.perf_counter() - start}
        if name == "tiny":
            row["first call phases s"] = {phase: round(total, 4)
                                          for phase, (_, total) in compile_times(repr="dict").items()}
        out = step(*inputs)  # the second call: cached code (and, under reduce-overhead, a replay)
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)  # still shown
    # a graph the compiler gave up on runs in torch, with a warning: right, but not compiled, and its
    # time is eager's; the row says so (the progress line too)
    fallbacks = sorted({str(w.message)[:300] for w in caught if issubclass(w.category, EagerFallbackWarning)})
    if fallbacks:
        row["fallbacks"] = fallbacks
    row["snapshot"] = snapshot(model, suite, out)
    del out
    if cuda:
        harness.synchronize(device)
        row["peak MB"] = (torch.cuda.max_memory_allocated() - held_by_others) / 2**20
    return row, step


def run_model(entry: DashboardModel, suite: str, dtype_name: str, args) -> dict:
    device, dtype = args.device, DTYPES[dtype_name]
    row: dict[str, Any] = {"model": entry.name, "suite": suite, "dtype": dtype_name}
    made = entry.make(args.sizes)
    if made is None:
        reason = "no small version" if args.sizes == "small" and entry.small is None else f"{entry.library} missing"
        return {**row, "status": f"skipped ({reason})"}
    model, inputs = made
    _no_dropout(model)
    model = model.to(device, dtype).train(suite == "training")
    inputs = tuple(_cast(x, dtype, device) for x in inputs)
    results, statuses, steps = {}, {}, {}
    harness.reset_compilers()  # once: each backend's compiled step stays alive until all are timed
    base_bytes = torch.cuda.memory_allocated() if device.startswith("cuda") else 0
    for name in args.backends:
        try:
            results[name], steps[name] = run_backend(name, model, inputs, suite, args, device, base_bytes)
            statuses[name] = "ok"
        except TimeLimit as e:
            statuses[name] = f"timeout: {e}"
        except Exception as e:  # noqa: BLE001  (a crash is that backend's failure, reported with its cause)
            statuses[name] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            row.setdefault("traces", {})[name] = traceback.format_exc()[-2000:]
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    reference = results.get("eager", {}).get("snapshot")
    truth = None
    for name, res in results.items():
        if name != "eager" and reference is not None:
            problems = compare(reference, res["snapshot"], dtype)
            if problems:  # arbitrated by float64, against eager's own error from it
                if truth is None:
                    truth = float64_snapshot(model, inputs, suite, device)
                problems = compare_with_truth(reference, res["snapshot"], truth, dtype)
            if problems:
                statuses[name] = "WRONG: " + "; ".join(problems[:3])
        res.pop("snapshot", None)
    if "eager" in results:
        results["eager"].pop("snapshot", None)
    timed = {name: steps[name] for name in results if statuses[name] == "ok"}  # a wrong backend is not timed
    if timed and not args.accuracy_only:
        # in turns (every round times each backend once): host noise and clock drift hit all alike
        try:
            per_call = harness.bench_interleaved(timed, inputs, device, warmup=args.warmup, iters=args.iters,
                                                 repeats=args.repeats)
        except TimeLimit:
            raise
        except Exception as e:  # noqa: BLE001  (a later call failed: recorded like a first-call failure)
            per_call = {}
            for name in timed:
                statuses[name] = f"error while timing: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            row.setdefault("traces", {})["timing"] = traceback.format_exc()[-2000:]
        for name, seconds in per_call.items():
            results[name]["ms"] = seconds * 1e3
    for name, res in results.items():
        for key, value in res.items():
            row[f"{name} {key}"] = value
    row["statuses"] = statuses
    row["status"] = "ok" if all(s == "ok" for s in statuses.values()) else "failed"
    eager_ms = row.get("eager ms")
    for name in args.backends:
        if name != "eager" and eager_ms and row.get(f"{name} ms"):
            row[f"{name} speedup"] = eager_ms / row[f"{name} ms"]
    if row.get("tiny speedup") and row.get("torch.compile speedup"):
        row["tiny vs torch.compile"] = row["tiny speedup"] / row["torch.compile speedup"]
    return row


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[dict], backends: list[str]) -> list[dict]:
    """Per suite and dtype: pass rate of each compiler, geomean speedups over the models all passed."""
    out = []
    for suite, dtype in dict.fromkeys((r["suite"], r["dtype"]) for r in rows):
        own = [r for r in rows if (r["suite"], r["dtype"]) == (suite, dtype) and not r["status"].startswith("skipped")]
        line = {"suite": suite, "dtype": dtype, "models": len(own)}
        for name in backends:
            if name != "eager":
                passed = sum(r["statuses"].get(name) == "ok" for r in own)
                line[f"{name} pass"] = f"{passed}/{len(own)}"
                line[f"{name} with an eager fallback"] = sorted(r["model"] for r in own if r.get(f"{name} fallbacks"))
                line[f"{name} speedup"] = geomean([r.get(f"{name} speedup") for r in own])
        if "tiny" in backends and "torch.compile" in backends:
            line["tiny vs torch.compile"] = geomean([r.get("tiny vs torch.compile") for r in own])
        out.append(line)
    return out


# ---- the command line ----------------------------------------------------------------------------
def _csv(choices: tuple | list | None, what: str):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{what}: give at least one")
        bad = [t for t in items if choices is not None and t not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"{what}: unknown {', '.join(bad)}; choose from {', '.join(choices)}")
        return list(dict.fromkeys(items))
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", type=_csv(list(DTYPES), "--dtype"), default=["bf16"] if torch.cuda.is_available()
                   else ["fp32"], help="comma list of fp32, bf16")
    p.add_argument("--mode", choices=MODES, default="default", help="both compilers' mode")
    p.add_argument("--models", type=_csv(list(BY_NAME), "--models"), default=list(BY_NAME),
                   help="comma list (default: all): " + ", ".join(BY_NAME))
    p.add_argument("--suite", type=_csv(SUITES, "--suite"), default=list(SUITES), help="inference, training")
    p.add_argument("--sizes", choices=("small", "real"), default="real")
    p.add_argument("--backends", type=_csv(harness.BACKENDS, "--backends"), default=list(harness.BACKENDS))
    p.add_argument("--accuracy-only", action="store_true", help="check accuracy, time nothing")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--timeout", type=float, default=600, help="seconds per model and backend (0: none)")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default bench/results/dashboard-...)")
    p.add_argument("--plot", type=Path, default=None, help="PNG of the speedups")
    p.add_argument("--warm-caches", action="store_true",
                   help="keep the on-disk compile caches (default when timing: fresh empty ones for this run)")
    p.add_argument("--jobs", type=int, default=1,
                   help="run N models at a time, each in a process of its own (on CUDA: one GPU each); one table")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error(f"--jobs {args.jobs}: give at least 1")
    if args.jobs > 1 and ":" in args.device:
        p.error(f"--jobs {args.jobs} gives each process a GPU of its own: use --device cuda, not {args.device}")
    if args.jobs > 1 and args.device.startswith("cuda") and args.jobs > torch.cuda.device_count():
        p.error(f"--jobs {args.jobs}: each job takes a GPU of its own and there are {torch.cuda.device_count()}")
    if "eager" not in args.backends:
        p.error("--backends must include eager: it is the reference every backend is checked against")
    for name in ("warmup", "iters", "repeats"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            p.error(f"--{name} {getattr(args, name)}: too small")
    if args.mode == "reduce-overhead" and not args.device.startswith("cuda"):
        print("note: reduce-overhead records CUDA graphs; on the CPU both compilers run without them", file=sys.stderr)
    return args


#: the on-disk compile caches: TorchInductor's (FX graphs, autotuning), Triton's kernels, tininductor's
COMPILE_CACHES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TINY_CACHE_DIR")


def use_fresh_caches() -> str:
    """Point every compile cache at a new empty directory, so that the first call of each backend is a
    cold compile: a kernel or graph cached by an earlier run would make that backend's compile look
    seconds faster than a user's first run is. Read when a compiler first looks: set before any runs."""
    root = tempfile.mkdtemp(prefix="dashboard_caches_")
    for var in COMPILE_CACHES:
        os.environ[var] = os.path.join(root, var.lower())
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def _child_argv(argv: list[str], job: tuple[str, str, str], out: Path) -> list[str]:
    """This run's command line for one job: its model, suite and dtype, its own JSON file, one GPU."""
    drop = {"--models", "--suite", "--dtype", "--out", "--plot", "--jobs"}
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a.split("=")[0] in drop:
            skip = "=" not in a
            continue
        kept.append(a)
    name, suite, dtype = job
    return [sys.executable, os.path.abspath(__file__), *kept, "--models", name, "--suite", suite, "--dtype", dtype,
            "--out", str(out)]


def run_in_processes(args, argv: list[str], jobs: list[tuple[str, str, str]]) -> list[dict]:
    """Each job in a process of its own, ``args.jobs`` at a time, on CUDA each process on one GPU
    (``CUDA_VISIBLE_DEVICES``, where more than one job runs at a time); a slot takes the next job
    when its last one ends. Each process has
    its own fresh compile caches and its own time limit, as a run of one model would."""
    tmp = Path(tempfile.mkdtemp(prefix="dashboard_jobs_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    pending, running, rows = list(enumerate(jobs)), {}, [None] * len(jobs)
    free = list(range(args.jobs))
    try:
        while pending or running:
            while pending and free:
                i, job = pending.pop(0)
                gpu = free.pop(0)
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)} \
                    if args.jobs > 1 and args.device.startswith("cuda") else None
                log = open(tmp / f"{i}.log", "w")  # noqa: SIM115  (closed when the process ends)
                proc = subprocess.Popen(_child_argv(argv, job, tmp / f"{i}.json"), env=env, stdout=log,
                                        stderr=subprocess.STDOUT)
                running[proc] = (i, job, gpu, time.perf_counter(), log)
            time.sleep(0.5)
            for proc in [p for p in running if p.poll() is not None]:
                i, (name, suite, dtype), gpu, start, log = running.pop(proc)
                log.close()
                free.append(gpu)
                try:
                    rows[i] = json.loads((tmp / f"{i}.json").read_text())["rows"][0]
                except Exception as e:  # noqa: BLE001  (the process died: its log's end says why)
                    tail = (tmp / f"{i}.log").read_text()[-2000:]
                    rows[i] = {"model": name, "suite": suite, "dtype": dtype, "statuses": {},
                               "traces": {"process": tail},
                               "status": f"failed: process exited {proc.returncode} ({type(e).__name__})"}
                rows[i]["wall s"] = time.perf_counter() - start
                _report(sum(r is not None for r in rows), len(jobs), rows[i], f", slot {gpu}")
                if args.out is not None:
                    harness.save("dashboard", args.device, [r for r in rows if r is not None],
                                 meta={"partial": True}, path=args.out)
    finally:  # stopped (Ctrl-C, an error here): no model process is left running
        for proc, (*_, log) in running.items():
            proc.kill()
            proc.wait()
            log.close()
    return rows


def _report(done: int, total: int, row: dict, where: str = "") -> None:
    detail = "; ".join(f"{k}: {v}" for k, v in row.get("statuses", {}).items() if v != "ok")
    for name in ("torch.compile", "tiny"):
        if row.get(f"{name} fallbacks"):
            detail += f" {name} ran {len(row[f'{name} fallbacks'])} graph(s) eagerly: {row[f'{name} fallbacks'][0][:160]}"
    speed = " ".join(f"{k} {v:.3g}" for k, v in row.items() if k.endswith(("speedup", "torch.compile"))
                     and isinstance(v, float))
    print(f"[{done}/{total}] {row['model']} {row['suite']} {row['dtype']}: {row['status']} ({row['wall s']:.0f}s{where}) "
          f"{speed} {detail}", file=sys.stderr, flush=True)


def share_compile_processes(jobs: int) -> None:
    """Both compilers compile kernels in as many processes: TorchInductor's
    ``TORCHINDUCTOR_COMPILE_THREADS`` and tiny's ``TINY_COMPILE_WORKERS``, each the cores shared
    among the jobs that run at once (at most ``MAX_WORKERS``, TorchInductor's cap), where not set; one set alone
    sets the other. Model processes inherit them."""
    share = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS") or os.environ.get("TINY_COMPILE_WORKERS") \
        or str(max(1, min(MAX_WORKERS, usable_cores() // jobs)))
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", share)
    os.environ.setdefault("TINY_COMPILE_WORKERS", share)
    # this process imported TorchInductor, which read its variable then
    torch._inductor.config.compile_threads = int(os.environ["TORCHINDUCTOR_COMPILE_THREADS"])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.device.startswith("cuda"):
        share_compile_processes(args.jobs)
    jobs = [(m, s, d) for m in args.models for s in args.suite for d in args.dtype]
    if args.jobs > 1 or (len(jobs) > 1 and not args.accuracy_only and not args.warm_caches):
        return finish(args, run_in_processes(args, argv, jobs))  # (a first call timed in a fresh process)
    if not args.accuracy_only and not args.warm_caches:
        print(f"compile caches: fresh, in {use_fresh_caches()} (--warm-caches keeps them)", file=sys.stderr)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
        torch.backends.cudnn.allow_tf32 = False
    rows = []
    for i, (name, suite, dtype) in enumerate(jobs):
        start = time.perf_counter()
        try:
            with time_limit(args.timeout * len(args.backends)):
                row = run_model(BY_NAME[name], suite, dtype, args)
        except TimeLimit as e:
            row = {"model": name, "suite": suite, "dtype": dtype, "status": f"failed: {e}", "statuses": {}}
        except Exception as e:  # noqa: BLE001  (building the model failed: recorded, the next one runs)
            row = {"model": name, "suite": suite, "dtype": dtype, "statuses": {},
                   "status": f"failed: {type(e).__name__}: {str(e)[:300]}", "traces": {"build": traceback.format_exc()[-2000:]}}
        row["wall s"] = time.perf_counter() - start
        rows.append(row)
        _report(i + 1, len(jobs), row)
        if args.out is not None:  # after every model, so that a run stopped by its time limit keeps its rows
            harness.save("dashboard", args.device, rows, meta={"partial": True}, path=args.out)
    return finish(args, rows)


def finish(args, rows: list[dict]) -> int:
    """The table, the geomeans, the JSON (and the plot) of a run's rows; 1 if a model failed."""
    columns = ["model", "suite", "dtype", "status", "eager ms"]
    for name in args.backends:
        if name != "eager":
            columns += [f"{name} speedup", f"{name} first call s"]
    if "tiny" in args.backends and "torch.compile" in args.backends:
        columns.append("tiny vs torch.compile")
    if args.device.startswith("cuda"):
        columns += [f"{n} peak MB" for n in args.backends]
    where = f"{harness.describe_device(args.device)}, {args.sizes} sizes, mode {args.mode}"
    if args.accuracy_only:
        columns = [c for c in columns if not c.endswith((" ms", "speedup", "torch.compile"))]
    harness.print_table(rows, columns, title=f"dashboard on {where}")
    summary = summarize(rows, args.backends)
    harness.print_table(summary, list(summary[0]) if summary else [], title="geomean over models (speedup over eager)")
    meta = {"sizes": args.sizes, "mode": args.mode, "accuracy_only": args.accuracy_only, "summary": summary,
            "jobs": args.jobs, "TORCHINDUCTOR_COMPILE_THREADS": os.environ.get("TORCHINDUCTOR_COMPILE_THREADS"),
            "TINY_COMPILE_WORKERS": os.environ.get("TINY_COMPILE_WORKERS"),
            "peak_memory": "torch.cuda.max_memory_allocated" if args.device.startswith("cuda") else "not measured on CPU"}
    harness.save("dashboard", args.device, rows, meta=meta, path=args.out)
    if args.plot:
        import matplotlib  # only for --plot: a heavy optional dependency

        matplotlib.use("Agg")
        fig = harness.plot_result("dashboard", {"benchmark": "dashboard", "device": where, "rows": rows})
        if fig is not None:
            args.plot.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(args.plot)
            print(f"plot: {args.plot}")
    failed = [r for r in rows if r["status"] != "ok" and not r["status"].startswith("skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
