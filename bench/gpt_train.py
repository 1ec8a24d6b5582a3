"""Benchmark: a GPT-style training step (token + position embeddings, causal attention written
out, no SDPA: course.models.GPT), eager vs torch.compile vs tiny.

Defaults: 6 layers x 192 wide, 6 heads, 32 x 128 tokens, vocabulary 1024, float32 and bfloat16
on a GPU; 2 layers x 64, 4 x 32 tokens, float32 on a CPU. Loss and every gradient are checked
against eager first; then steps are timed in turns, and each compiler's first call is timed.
``--cold`` adds the cold compile (fresh process, empty caches) of the float32 step.

    python bench/gpt_train.py [--cold] [--dtypes float32,bfloat16]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.nn.functional as F
from train_steps import cold_child, cold_compile, measure_training  # noqa: E402  (bench/ is on sys.path)

from course import benchmark as harness
from course.models import GPT


def loss_of(fn, idx, targets):
    logits = fn(idx)
    return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def build(args, dtype, device):
    torch.manual_seed(0)
    model = GPT(args.vocab, args.seq, args.layers, args.heads, args.embd).to(device=device, dtype=dtype)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
    targets = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
    return model, (idx, targets)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(parser)
    gpu = torch.cuda.is_available()
    parser.add_argument("--layers", type=int, default=6 if gpu else 2)
    parser.add_argument("--embd", type=int, default=192 if gpu else 64)
    parser.add_argument("--heads", type=int, default=6 if gpu else 2)
    parser.add_argument("--batch", type=int, default=32 if gpu else 4)
    parser.add_argument("--seq", type=int, default=128 if gpu else 32)
    parser.add_argument("--vocab", type=int, default=1024 if gpu else 256)
    parser.add_argument("--dtypes", default=None)
    parser.add_argument("--cold", action="store_true", help="also time a cold compile in fresh processes")
    parser.add_argument("--no-fill", action="store_true",
                        help="--cold: skip the untimed run per backend that fills the bytecode cache")
    parser.add_argument("--cold-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = args.device
    if args.cold_child:
        model, inputs = build(args, torch.float32, device)
        cold_child(args.cold_child, model, inputs, loss_of, device)
        return
    dtypes = (args.dtypes or ("float32,bfloat16" if device.startswith("cuda") else "float32")).split(",")
    names = args.backends.split(",")
    shape = f"{args.layers}x{args.embd}, {args.batch}x{args.seq} tokens, vocab {args.vocab}"
    rows = []
    for i, dtype_name in enumerate(dtypes):
        harness.progress(i, len(dtypes), dtype_name)
        dtype = getattr(torch, dtype_name)
        harness.reset_compilers()
        model, inputs = build(args, dtype, device)
        tol = 1e-3 if dtype == torch.float32 else 1e-1
        row = {"dtype": dtype_name, "shape": shape}
        row.update(measure_training(model, inputs, loss_of, names, device, args.warmup, args.iters, tol))
        rows.append(row)
    if args.cold:
        child = [f"--{k}={getattr(args, k)}" for k in ("layers", "embd", "heads", "batch", "seq", "vocab", "device")]
        with tempfile.TemporaryDirectory() as pycache:
            cold = {}
            for name in [n for n in names if n != "eager"]:
                if not args.no_fill:
                    cold_compile(__file__, name, child, pycache)  # untimed: fills the bytecode cache only
                cold[name] = cold_compile(__file__, name, child, pycache)
            row = {"dtype": "float32", "shape": shape, "phase": "cold compile"}
            for name, result in cold.items():
                row[f"{name} cold s"] = result["seconds"]
                if result["phases"]:
                    row["tiny phases"] = result["phases"]
            if "tiny" in cold and "torch.compile" in cold:
                row["tiny / torch.compile cold"] = cold["tiny"]["seconds"] / cold["torch.compile"]["seconds"]
            rows.append(row)
    columns = [c for c in dict.fromkeys(k for r in rows for k in r) if c != "tiny phases"]
    harness.print_table(rows, columns, title=f"GPT training step on {harness.describe_device(device)} "
                                             "(speedup > 1: tiny faster)")
    harness.save("gpt_train", device, rows, path=args.json)


if __name__ == "__main__":
    main()
