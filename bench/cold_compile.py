"""Benchmark 3: cold compile latency, in a fresh process with empty compile caches.

Each measurement starts a new Python process, imports torch (not counted), then times
``compile(fn)`` plus the first call of the compiled function (imports + trace + compile + run).
Compile-cache directories point at fresh temporary folders so nothing is reused from an earlier
run. Python's bytecode cache is not a compile cache: an installed package has its ``.pyc`` files,
so one untimed process per backend and case fills a shared ``PYTHONPYCACHEPREFIX`` first (where
site-packages is read-only and holds no ``.pyc``, every process would otherwise spend seconds
byte-compiling TorchDynamo, Inductor and Triton).

    python bench/cold_compile.py --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from course import benchmark as harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, sys, time
import torch
import torch.nn.functional as F
backend, case, device = sys.argv[1:4]
if case == "chain":
    fn = lambda x, r: F.gelu(x * 1.5 + 0.25, approximate="tanh") + r
    args = (torch.randn(4096, device=device), torch.randn(4096, device=device))
else:
    from course.models import TinyBlock
    fn = TinyBlock(256).to(device).eval()
    args = (torch.randn(4, 32, 256, device=device),)
if device.startswith("cuda"):
    torch.cuda.synchronize()
with torch.no_grad():
    # the clock starts before compile(): torch.compile imports TorchDynamo right there, while
    # tinydynamo imports lazily at the first call; both pay their imports inside the clock
    start = time.perf_counter()
    if backend == "torch.compile":
        compiled = torch.compile(fn)
    else:
        import tinydynamo
        compiled = tinydynamo.compile(fn, backend="tininductor")
    out = compiled(*args)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    torch.testing.assert_close(out, fn(*args), rtol=1e-3, atol=1e-3)
phases = {}
if backend == "tiny":  # where the seconds went (tinydynamo.utils.compile_times; phases nest)
    from tinydynamo.utils import compile_times
    phases = {phase: total for phase, (calls, total) in compile_times(repr="dict").items()}
print(json.dumps({"seconds": seconds, "phases": phases}))
"""


def measure(backend: str, case: str, device: str, pycache: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(cache, "triton"), TINY_CACHE_DIR=os.path.join(cache, "tiny"),
                   PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
        env.setdefault("PYTHONPYCACHEPREFIX", pycache)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # else the prefix stays empty and every run byte-compiles torch
        result = subprocess.run([sys.executable, "-c", CHILD, backend, case, device], env=env,
                                capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"{backend} on {case} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default="chain,block")
    args = parser.parse_args(argv)
    names = [n for n in args.backends.split(",") if n != "eager"]
    cases = args.cases.split(",")
    rows = []
    jobs = [(c, n) for c in cases for n in names]
    with tempfile.TemporaryDirectory() as pycache:
        for i, (case, name) in enumerate(jobs):
            harness.progress(i, len(jobs), f"{case} {name}")
            measure(name, case, args.device, pycache)  # untimed: fills the bytecode cache only
            runs = sorted((measure(name, case, args.device, pycache) for _ in range(args.repeats)),
                          key=lambda r: r["seconds"])
            times = [r["seconds"] for r in runs]
            row = {"case": case, "backend": name, "median s": statistics.median(times), "min s": min(times)}
            if runs[len(runs) // 2]["phases"]:
                row["phases"] = runs[len(runs) // 2]["phases"]  # of the median run
            rows.append(row)
    by = {(r["case"], r["backend"]): r["median s"] for r in rows}
    for row in rows:
        if row["backend"] == "tiny" and (row["case"], "torch.compile") in by:
            row["tiny / torch.compile"] = row["median s"] / by[(row["case"], "torch.compile")]
    harness.print_table(rows, ["case", "backend", "median s", "min s", "tiny / torch.compile"],
                        title=f"cold compile (first call in a fresh process) on {harness.describe_device(args.device)}")
    for row in rows:
        if "phases" in row:
            phases = [{"phase": k, "seconds": v, "share": v / row["median s"]}
                      for k, v in sorted(row["phases"].items(), key=lambda kv: -kv[1])]
            harness.print_table(phases, ["phase", "seconds", "share"],
                                title=f"where tiny's cold compile of the {row['case']} goes (phases nest)")
    harness.save("cold_compile", args.device, rows, path=args.json)


if __name__ == "__main__":
    main()
