"""Run every benchmark, each in its own process, and gather the results into one JSON file.

Chapter 11 reads such a file for the GPU numbers (notebooks/data/gpu_results.json, from a run
on the device machine). A benchmark that fails is recorded with its error; the rest still run.

    python bench/run_all.py --out bench/results/all.json [--quick]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent

# name -> (script, arguments, --quick arguments: appended, so they override)
BENCHMARKS = {
    "pointwise_chain": ("pointwise_chain", [], ["--max-log2", "16", "--iters", "10"]),
    "call_overhead": ("call_overhead", [], ["--calls", "2000"]),
    "cold_compile": ("cold_compile", ["--repeats", "2"], ["--repeats", "1", "--cases", "chain"]),
    "block": ("block", [], ["--iters", "5", "--batch", "2", "--seq", "16", "--hidden", "64"]),
    "softmax_layernorm": ("softmax_layernorm", [], ["--elements-log2", "16", "--max-log2", "10", "--iters", "5"]),
    "guard_overhead": ("guard_overhead", [], []),
    "gpt_train": ("gpt_train", ["--cold"], ["--iters", "3", "--warmup", "1", "--layers", "1", "--embd", "32",
                                            "--heads", "2", "--batch", "2", "--seq", "16", "--vocab", "64"]),
    "resnet_train": ("resnet_train", [], ["--iters", "2", "--warmup", "1", "--batch", "2", "--size", "32"]),
    "dynamic_shapes": ("dynamic_shapes", [], ["--seqs", "16,24", "--batch", "2", "--hidden", "32", "--iters", "3",
                                              "--warmup", "1"]),
}
# CUDA graphs and autotuning (modes for both compilers): GPU only
CUDA_BENCHMARKS = {
    "call_overhead reduce-overhead": ("call_overhead", ["--mode", "reduce-overhead"], ["--calls", "2000"]),
    "block reduce-overhead": ("block", ["--mode", "reduce-overhead"],
                              ["--iters", "5", "--batch", "2", "--seq", "16", "--hidden", "64"]),
    "profile_step": ("profile_step", [], ["--iters", "5", "--batch", "2", "--seq", "16", "--hidden", "64"]),
    # both compilers time block-size candidates per kernel (large sizes: where it can matter)
    "pointwise_chain max-autotune": ("pointwise_chain", ["--mode", "max-autotune-no-cudagraphs", "--min-log2", "22"],
                                     ["--min-log2", "14", "--max-log2", "16", "--iters", "10"]),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "all.json")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--only", default="", help="comma list of benchmarks to run, in that order")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per benchmark")
    parser.add_argument("--plots", type=Path, default=None, help="also draw one PNG per benchmark into this folder")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    table = {**BENCHMARKS, **(CUDA_BENCHMARKS if device == "cuda" else {})}
    names = [n for n in args.only.split(",") if n in table] if args.only else list(table)  # --only: in its order
    combined = {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "results": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            script, full, quick = table[name]
            out = Path(tmp) / f"{name.replace(' ', '_')}.json"
            cmd = [sys.executable, str(HERE / f"{script}.py"), *full, *(quick if args.quick else []), "--json", str(out)]
            print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
            try:
                run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                print(run.stdout, flush=True)
                if run.returncode or not out.exists():
                    combined["results"][name] = {"error": run.stderr[-4000:]}
                    print(run.stderr[-4000:], flush=True)
                else:
                    combined["results"][name] = json.loads(out.read_text())
            except subprocess.TimeoutExpired:
                combined["results"][name] = {"error": f"timed out after {args.timeout}s"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(combined, indent=1))
    print(f"all results: {args.out}")
    if args.plots is not None:
        from bench import plot_results

        plot_results.main([str(args.out), "--out", str(args.plots)])
    return 0 if all("error" not in r for r in combined["results"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
