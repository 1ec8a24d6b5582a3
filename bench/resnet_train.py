"""Benchmark: a CNN training step (torchvision ResNet-18, random weights), eager vs torch.compile
vs tiny.

Defaults: batch 32 of 3x224x224, float32 and bfloat16 on a GPU; batch 2 of 3x64x64, float32 on a
CPU. Loss (cross-entropy over 1000 classes) and every gradient are checked against eager, then
steps are timed in turns and each compiler's first call is timed. ``--cold`` adds the cold
compile (fresh process, empty caches) of the float32 step.

    python bench/resnet_train.py [--cold] [--dtypes float32,bfloat16]
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


def import_torchvision():
    """torchvision, also where its C++ ops do not load (they are only declared then: enough for
    the model, which never calls nms)."""
    try:
        import torchvision
    except (RuntimeError, ImportError):
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import_torchvision.lib = lib  # keep the definitions alive
        for name in [m for m in sys.modules if m.startswith("torchvision")]:
            del sys.modules[name]
        import torchvision
    return torchvision


def loss_of(fn, x, targets):
    return F.cross_entropy(fn(x).float(), targets)


def build(args, dtype, device):
    torchvision = import_torchvision()
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).to(device=device, dtype=dtype)
    x = torch.randn(args.batch, 3, args.size, args.size, device=device, dtype=dtype)
    targets = torch.randint(0, 1000, (args.batch,), device=device)
    return model, (x, targets)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(parser)
    gpu = torch.cuda.is_available()
    parser.add_argument("--batch", type=int, default=32 if gpu else 2)
    parser.add_argument("--size", type=int, default=224 if gpu else 64)
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
    shape = f"{args.batch}x3x{args.size}x{args.size}"
    rows = []
    for i, dtype_name in enumerate(dtypes):
        harness.progress(i, len(dtypes), dtype_name)
        dtype = getattr(torch, dtype_name)
        harness.reset_compilers()
        model, inputs = build(args, dtype, device)
        # BatchNorm in training mode: eager and compiled steps each update running stats once per
        # step; the gradients compared come from the first step of identical copies
        tol = 1e-2 if dtype == torch.float32 else 2e-1
        row = {"dtype": dtype_name, "shape": shape}
        row.update(measure_training(model, inputs, loss_of, names, device, args.warmup, args.iters, tol))
        rows.append(row)
    if args.cold:
        child = [f"--{k}={getattr(args, k)}" for k in ("batch", "size", "device")]
        with tempfile.TemporaryDirectory() as pycache:
            cold = {}
            for name in [n for n in names if n != "eager"]:
                if not args.no_fill:
                    cold_compile(__file__, name, child, pycache)  # untimed: fills the bytecode cache only
                cold[name] = cold_compile(__file__, name, child, pycache)
            row = {"dtype": "float32", "shape": shape, "phase": "cold compile"}
            for name, result in cold.items():
                row[f"{name} cold s"] = result["seconds"]
            if "tiny" in cold and "torch.compile" in cold:
                row["tiny / torch.compile cold"] = cold["tiny"]["seconds"] / cold["torch.compile"]["seconds"]
            rows.append(row)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    harness.print_table(rows, columns, title=f"ResNet-18 training step on {harness.describe_device(device)} "
                                             "(speedup > 1: tiny faster)")
    harness.save("resnet_train", device, rows, path=args.json)


if __name__ == "__main__":
    main()
