"""ResNet-50, GPT-2 and a small Llama inference with tininductor's graph passes on and off, next to eager and
torch.compile, in one process: outputs checked against eager, time per call, and what the GPU runs
(kernel launches per call, the kernels that take the most time, from torch.profiler).

Passes (tininductor/config.py): batch norm decomposed (``decompose_batch_norm``), matmul padding
(``shape_padding``), pointwise ``cat`` (``max_pointwise_cat_inputs``), and, for ResNet-50, freezing.
"Passes off" restores the earlier behaviour (batch norm, padding and layout optimization off, ``cat``
stored into slices); one variant per model turns off only the pass it shows.

    python bench/model_passes.py [--small] [--models resnet50,gpt2] [--top 6]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import tininductor  # noqa: E402
import tinydynamo  # noqa: E402
from tests.model_zoo import import_torchvision, import_transformers  # noqa: E402

OFF = {"decompose_batch_norm": False, "shape_padding": False, "max_pointwise_cat_inputs": 0,
       "layout_optimization": False}
VARIANTS = {
    "resnet50": [("tiny", {}), ("torch.compile", None), ("tiny passes off", OFF),
                 ("tiny without layout opt", {"layout_optimization": False}), ("tiny + freezing", {"freezing": True})],
    "gpt2": [("tiny", {}), ("torch.compile", None), ("tiny passes off", OFF), ("tiny without pad_mm", {"shape_padding": False})],
    "llama": [("tiny", {}), ("torch.compile", None), ("tiny, cat into slices", {"max_pointwise_cat_inputs": 0})],
}


def build(name: str, small: bool, device: str, dtype):
    torch.manual_seed(0)
    if name == "resnet50":
        tv = import_torchvision()
        model = tv.models.resnet50(weights=None)
        x = torch.randn((2, 3, 64, 64) if small else (32, 3, 224, 224))
        model = model.eval().to(device, dtype)
        return model, (x.to(device, dtype),)
    import_torchvision()  # transformers' image utilities import it: its ops defined first (model_zoo)
    tr = import_transformers()
    if name == "llama":
        config = tr.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=4, vocab_size=1000) if small else tr.LlamaConfig(
            hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
            num_key_value_heads=16, vocab_size=32000)
        lm = tr.LlamaForCausalLM(config).eval().to(device, dtype)
    else:
        config = tr.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1001) if small else tr.GPT2Config()
        lm = tr.GPT2LMHeadModel(config).eval().to(device, dtype)
    config.use_cache = False
    ids = torch.randint(0, config.vocab_size, (2, 32) if small else (8, 512), device=device)

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(ids, use_cache=False).logits

    return Logits(), (ids,)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_per_call(fn, device, iters):
    for _ in range(3):
        fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return (time.perf_counter() - start) / iters * 1e3


def gpu_kernels(fn, top: int):
    """(kernel launches per call, GPU ms per call, [(name, ms per call, calls per call)])."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    n = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    total: dict[str, list] = {}
    for e in events:
        entry = total.setdefault(e.name, [0.0, 0])
        entry[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        entry[1] += 1
    ranked = sorted(total.items(), key=lambda kv: -kv[1][0])[:top]
    gpu_ms = sum(v[0] for v in total.values()) / n / 1e3
    return len(events) / n, gpu_ms, [(k[:70], v[0] / n / 1e3, v[1] / n) for k, v in ranked]


def rel_err(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def run(name, small, device, dtype, top, iters):
    model, args = build(name, small, device, dtype)
    with torch.no_grad():
        ref = model(*args)
        eager_ms = time_per_call(lambda: model(*args), device, iters)
        print(f"== {name} ({'small' if small else 'full'} size, {dtype}, {device}): eager {eager_ms:.3f} ms/call", flush=True)
        if device == "cuda":
            k, g, tops = gpu_kernels(lambda: model(*args), top)
            print(f"   eager: {k:.0f} kernels/call, GPU {g:.3f} ms/call; top: " + "; ".join(f"{n} {t:.3f}ms x{c:.0f}" for n, t, c in tops))
        results = {"eager": eager_ms}
        callables = {"eager": model}
        for label, options in VARIANTS[name]:
            torch._dynamo.reset() if options is None else None
            if options is None:
                compiled = torch.compile(model)
            else:
                compiled = tinydynamo.compile(model, backend=tininductor.compile_fx.with_options(options=options))
            start = time.perf_counter()
            try:
                out = compiled(*args)
            except Exception as e:  # noqa: BLE001 - report and go on with the next variant
                print(f"   {label}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            sync(device)
            first = time.perf_counter() - start
            err = rel_err(out, ref)
            ms = time_per_call(lambda: compiled(*args), device, iters)
            results[label] = ms
            callables[label] = compiled
            line = (f"   {label}: {ms:.3f} ms/call ({eager_ms / ms:.2f}x eager), first call {first:.1f}s, "
                    f"rel. error vs eager {err:.2e}")
            if device == "cuda":
                k, g, tops = gpu_kernels(lambda: compiled(*args), top)
                line += f"\n      {k:.0f} kernels/call, GPU {g:.3f} ms/call; top: " + "; ".join(
                    f"{n} {t:.3f}ms x{c:.0f}" for n, t, c in tops)
            print(line, flush=True)
        # again, once every compile is done (background compile threads and workers are idle)
        results = {k: time_per_call(lambda f=f: f(*args), device, iters) for k, f in callables.items()}
        print("   again, after all compiles: " + ", ".join(f"{k} {v:.3f} ms" for k, v in results.items()), flush=True)
        if "torch.compile" in results:
            print("   tiny / torch.compile speed: " + ", ".join(
                f"{k} {results['torch.compile'] / v:.2f}x" for k, v in results.items() if k.startswith("tiny")), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke test)")
    p.add_argument("--models", default="resnet50,gpt2,llama")
    p.add_argument("--top", type=int, default=6)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    for name in a.models.split(","):
        run(name, a.small, device, dtype, a.top, a.iters)


if __name__ == "__main__":
    main()
