"""Triton compile time of every kernel a model's graphs generate, for a GPU, measured on any machine.

A first call waits for its slowest kernel: kernels compile side by side in worker processes, one
core each, so one huge fused kernel can take longer than all the others together (a transformer's
residual stream recomputed end to end in one backward kernel: 125 inputs, 9 s of Triton compile
for BERT-base on an H200's host). This script finds such kernels without a GPU:

1. a child process traces a dashboard model (bench/dashboard.py, real sizes) on the CPU with
   tinydynamo and compiles its graphs with tininductor on the CPU's Triton path
   (``TRITON_INTERPRET=1``: the same code generator; block sizes may differ a little from a GPU's,
   which sizes them by its SM count), without running them; it names the generated modules;
2. a second child loads each module and compiles its kernels for the GPU target with Triton's own
   compiler, which needs ``ptxas`` (shipped with Triton) but no GPU, timing each one.

    python bench/triton_compile_times.py --model bert --suite training
    python bench/triton_compile_times.py --model densenet121 --target 90 --top 5
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import tinydynamo
from bench import dashboard
from tininductor.runtime.triton_launcher import TritonLauncher

TRITON_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float64: "*fp64",
                torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16", torch.int8: "*i8",
                torch.uint8: "*u8", torch.bool: "*i1"}


def generate(name: str, suite: str, dtype_name: str) -> list[str]:
    """(In the child.) The files of the modules tininductor generates for the model's graphs."""
    compile_fx_module = importlib.import_module("tininductor.compile_fx")  # the module, not the backend
    model, inputs = dashboard.BY_NAME[name].make("real")
    dashboard._no_dropout(model)
    dtype = dashboard.DTYPES[dtype_name]
    model = model.to(dtype).train(suite == "training")
    inputs = tuple(dashboard._cast(x, dtype, "cpu") for x in inputs)
    graphs = []

    def record(gm, example_inputs):  # capture only: the call itself runs eagerly
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    files = []
    with torch.set_grad_enabled(suite == "training"):
        tinydynamo.compile(model, backend=record, dynamic=False)(*inputs)
        for gm, example_inputs in graphs:
            start = compile_fx_module._compile_count[0]
            compile_fx_module.compile_fx(gm, example_inputs)
            for compiled in [g for g in compile_fx_module.compiled_graphs if g.seq > start]:
                module = compiled.module if hasattr(compiled, "module") else compiled.fn.module
                files.append(module.__file__)
    return files


def compile_for_gpu(launcher, target) -> float:
    """Seconds Triton takes to compile ``launcher``'s kernel to a cubin for ``target``."""
    fn = launcher.fn
    constants = {k: v for k, v in launcher.constants.items() if k in fn.arg_names}
    runtime = [p for p in fn.arg_names if p not in constants]
    signature = {p: TRITON_TYPES[a] if isinstance(a, torch.dtype) else "i32"
                 for p, a in zip(runtime, launcher.example_args or ())}
    signature.update({k: "constexpr" for k in constants})
    start = time.perf_counter()
    triton.compile(ASTSource(fn, signature, constexprs=constants), target=target,
                   options={"num_warps": launcher.num_warps})
    return time.perf_counter() - start


def kernel_times(files: list[str], target) -> list[tuple[float, str]]:
    """Compile time of each kernel of the generated modules ``files``, slowest first."""
    times = []
    for i, path in enumerate(files):
        spec = importlib.util.spec_from_file_location(f"generated_{i}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for value in vars(module).values():
            if isinstance(value, TritonLauncher):
                times.append((compile_for_gpu(value, target), value.fn.__name__))
    return sorted(times, reverse=True)


def _child(args: list[str], env: dict) -> object:
    """Run this script in a child process with ``env``; the JSON its last line of output holds."""
    child = subprocess.run([sys.executable, os.path.abspath(__file__), *args], env=env, capture_output=True, text=True)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed:\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=list(dashboard.BY_NAME))
    p.add_argument("--suite", choices=("inference", "training"), default="inference")
    p.add_argument("--dtype", choices=list(dashboard.DTYPES), default="bf16")
    p.add_argument("--target", type=int, default=90, help="CUDA compute capability x 10 (90: H100/H200)")
    p.add_argument("--top", type=int, default=10, help="print the slowest N kernels")
    p.add_argument("--emit-modules", action="store_true", help=argparse.SUPPRESS)  # the children's parts
    p.add_argument("--compile-modules", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.emit_modules:
        print(json.dumps(generate(args.model, args.suite, args.dtype)))
        return 0
    if args.compile_modules is not None:
        print(json.dumps(kernel_times(args.compile_modules, GPUTarget("cuda", args.target, 32))))
        return 0
    if args.model is None:
        p.error("--model is required")

    # each step in a process of its own: whether a kernel is interpreted or compiled is decided when the
    # module defining it is loaded (TRITON_INTERPRET), for the kernel and every Triton helper it calls;
    # each child gets its environment at start, before this script's imports run there
    cache = tempfile.mkdtemp(prefix="triton_compile_times_")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    files = _child(["--emit-modules", "--model", args.model, "--suite", args.suite, "--dtype", args.dtype],
                   dict(env, TRITON_INTERPRET="1", TINY_CPU_BACKEND="triton", TINY_CACHE_DIR=os.path.join(cache, "tiny")))
    # loading a module launches nothing and compiles nothing in the background; an empty Triton cache
    # makes every kernel a real compile
    times = _child(["--compile-modules", *files, "--target", str(args.target)],
                   dict(env, TINY_TRITON_PARALLEL_COMPILE="0", TRITON_CACHE_DIR=os.path.join(cache, "triton")))
    total = sum(t for t, _ in times)
    print(f"{args.model} {args.suite} {args.dtype}: {len(files)} generated module(s), {len(times)} Triton kernels "
          f"for sm_{args.target}: {total:.1f} s of compile in all, the slowest {times[0][0] if times else 0:.2f} s")
    for seconds, name in times[: args.top]:
        print(f"  {seconds:6.2f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
