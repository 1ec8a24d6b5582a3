"""Benchmark harness: eager, ``torch.compile`` and tiny, timed side by side in one run.

Every script under ``bench/`` uses it the same way: build the compiled callables with
:func:`compilers`, check each one's output against eager *before* timing it, time them with
:func:`bench` or :func:`bench_interleaved` (first call excluded, device synchronised), print a table of ratios with
:func:`print_table`, and save the rows as JSON under ``bench/results/``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
BACKENDS = ("eager", "torch.compile", "tiny")


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma list of " + ", ".join(BACKENDS))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--mode", default=None, help="torch.compile / tiny mode (default, reduce-overhead, max-autotune)")
    parser.add_argument("--json", type=Path, default=None, help="where to write results (default bench/results/...)")


def describe_device(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.processor() or platform.machine()} x{torch.get_num_threads()} threads"


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def compilers(names: list[str], mode: str | None = None) -> dict[str, Callable[[Callable], Callable]]:
    """name -> a function that turns an eager callable into that backend's callable."""
    table: dict[str, Callable[[Callable], Callable]] = {}
    for name in names:
        if name == "eager":
            table[name] = lambda fn: fn
        elif name == "torch.compile":
            table[name] = lambda fn: torch.compile(fn, mode=mode, dynamic=False)
        elif name == "tiny":
            import tinydynamo

            table[name] = lambda fn: tinydynamo.compile(fn, backend="tininductor", mode=mode, dynamic=False)
        else:
            raise SystemExit(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    return table


def reset_compilers() -> None:
    """Forget compiled code between configurations, so each one compiles for its own shapes."""
    torch._dynamo.reset()
    if "tinydynamo" in sys.modules:
        sys.modules["tinydynamo"].reset()


def check_close(name: str, got: Any, expected: Any, rtol: float, atol: float) -> None:
    """Refuse to time a backend whose output is wrong."""
    try:
        torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
    except AssertionError as error:
        raise SystemExit(f"{name}: output differs from eager, not timing it:\n{error}") from None


@contextlib.contextmanager
def no_gc():
    """Python's cyclic garbage collector off while timing, as ``timeit`` does: a full collection
    after compiling a large model walks every object the compilers left alive (tens of
    milliseconds), and whichever callable it interrupts would be charged for it."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def bench(fn: Callable, args: tuple, device: str, warmup: int, iters: int, repeats: int = 5) -> float:
    """Median seconds per call over ``repeats`` batches of ``iters`` calls, after ``warmup`` calls."""
    return bench_spread(fn, args, device, warmup, iters, repeats).median


@dataclasses.dataclass(frozen=True)
class Spread:
    """Seconds per call of each timed batch, summarised: a median alone hides how noisy it was."""

    samples: tuple[float, ...]

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def format(self, scale: float = 1e6) -> str:
        """``"min-max"`` scaled (default: microseconds), for a table column beside the median."""
        return f"{_fmt(self.min * scale)}-{_fmt(self.max * scale)}"


def bench_spread(fn: Callable, args: tuple, device: str, warmup: int, iters: int, repeats: int = 5) -> Spread:
    """Like :func:`bench`, but keeps every batch's seconds per call (min / median / max)."""
    for _ in range(warmup):
        fn(*args)
    synchronize(device)
    samples = []
    with no_gc():
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(iters):
                fn(*args)
            synchronize(device)
            samples.append((time.perf_counter() - start) / iters)
    return Spread(tuple(samples))


def pin_threads(threads: int | None = None) -> int:
    """Fix the CPU thread count (default: one per physical core, at most 8) so timings repeat.

    Left alone, torch picks a count per process and a busy machine's load changes what each
    thread gets; a fixed count at least makes runs comparable. Returns the count now in use.
    """
    if threads is None:
        threads = max(1, min(8, (os.cpu_count() or 2) // 2))
    torch.set_num_threads(threads)
    return torch.get_num_threads()


def bench_interleaved(fns: dict[str, Callable], args: tuple, device: str, warmup: int, iters: int,
                      repeats: int = 15, min_sample_s: float = 0.02) -> dict[str, float]:
    """Median seconds per call for several callables, timed in turns: round r times every one of them.

    Short workloads (a block at fp16 takes ~0.1 ms) drift with clocks and host noise; timing the
    backends back to back within each round exposes them to the same drift, and ``iters`` grows
    until one sample lasts at least ``min_sample_s``. The garbage collector waits (:func:`no_gc`).
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn(*args)
    synchronize(device)
    counts = {}
    for name, fn in fns.items():
        start = time.perf_counter()
        fn(*args)
        synchronize(device)
        counts[name] = max(iters, int(min_sample_s / max(time.perf_counter() - start, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    with no_gc():
        for _ in range(repeats):
            for name, fn in fns.items():
                start = time.perf_counter()
                for _ in range(counts[name]):
                    fn(*args)
                synchronize(device)
                samples[name].append((time.perf_counter() - start) / counts[name])
    return {name: statistics.median(times) for name, times in samples.items()}


def copy_bandwidth(device: str, nbytes: int = 1 << 28) -> float:
    """Bytes per second a device-to-device copy moves (read + write), the roofline for pointwise work."""
    n = nbytes // 4
    src = torch.empty(n, device=device)
    dst = torch.empty_like(src)
    seconds = bench(lambda: dst.copy_(src), (), device, warmup=3, iters=10)
    return 2 * n * 4 / seconds


def progress(i: int, n: int, label: str) -> None:
    width = 24
    done = int(width * (i + 1) / n)
    print(f"\r[{'#' * done}{'.' * (width - done)}] {i + 1}/{n} {label:<40}", end="", file=sys.stderr, flush=True)
    if i + 1 == n:
        print(file=sys.stderr)


def print_table(rows: list[dict], columns: list[str], title: str = "") -> None:
    if title:
        print(title)
    cells = [[_fmt(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for r in cells:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def save(name: str, device: str, rows: list[dict], meta: dict | None = None, path: Path | None = None) -> Path:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    payload = {
        "benchmark": name,
        "device": describe_device(device),
        "date": stamp,
        "torch": torch.__version__,
        "python": platform.python_version(),
        **(meta or {}),
        "rows": rows,
    }
    path = path or RESULTS / f"{name}-{device.split(':')[0]}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1))
    print(f"results: {path}")
    return path


# ---- plots of stored results (chapter 11, bench/plot_results.py) ------------------------------------
COLOURS = {"eager": "tab:blue", "torch.compile": "tab:orange", "tiny": "tab:green"}


def _backends_in(rows: list[dict], suffix: str) -> list[str]:
    return [b for b in BACKENDS if any(f"{b} {suffix}" in r for r in rows)]


def plot_chain(rows: list[dict], title: str = "pointwise chain"):
    """Pointwise sweep rows -> a figure: speedup over eager, and percent of copy bandwidth, vs size."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=80)
    for dtype, style in zip(dict.fromkeys(r["dtype"] for r in rows), ("-", "--", ":")):
        own = [r for r in rows if r["dtype"] == dtype]
        sizes = [2 ** int(str(r["n"]).split("^")[1]) if "^" in str(r["n"]) else int(r["n"]) for r in own]
        for name in _backends_in(own, "us"):
            kw = dict(color=COLOURS[name], linestyle=style, marker="o", markersize=3, label=f"{name} {dtype}")
            ax1.plot(sizes, [r["eager us"] / r[f"{name} us"] for r in own], **kw)
            ax2.plot(sizes, [r[f"{name} %bw"] for r in own], **kw)
    ax1.set(xscale="log", xlabel="elements", ylabel="speedup over eager", title=title)
    ax2.set(xscale="log", yscale="log", xlabel="elements", ylabel="% of copy bandwidth", title="bandwidth used")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_rows(rows: list[dict], title: str = "row-wise reductions"):
    """Softmax / LayerNorm sweep rows -> a figure: GB/s against row length, one panel per op."""
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, axes = plt.subplots(1, len(ops), figsize=(4.5 * len(ops), 3.5), dpi=80, squeeze=False)
    for ax, op in zip(axes[0], ops):
        own = [r for r in rows if r["op"] == op]
        cols = [int(r["shape"].split("x")[1]) for r in own]
        for name in _backends_in(own, "GB/s"):
            ax.plot(cols, [r[f"{name} GB/s"] for r in own], color=COLOURS[name], marker="o", markersize=3, label=name)
        ax.set(xscale="log", xlabel="row length", ylabel="GB/s", title=f"{title}: {op}")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_bars(rows: list[dict], label_keys: list[str], suffix: str, title: str):
    """Rows of per-backend times (``"<backend> <suffix>"`` columns) -> grouped bars, one group a row."""
    import matplotlib.pyplot as plt

    names = _backends_in(rows, suffix)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(rows)), 3.5), dpi=80)
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        ax.bar([j + i * width for j in range(len(rows))], [r.get(f"{name} {suffix}", 0) or 0 for r in rows],
               width, color=COLOURS[name], label=name)
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels(["\n".join(str(r[k]) for k in label_keys) for r in rows], fontsize=8)
    ax.set(ylabel=suffix, title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_result(name: str, payload: dict):
    """The figure for one saved benchmark result (as ``save`` wrote it), or None for a kind without one."""
    kind, rows = payload.get("benchmark", name), payload.get("rows") or []
    title = f"{name} on {payload.get('device', '?')}"
    if not rows:
        return None
    if kind == "pointwise_chain":
        return plot_chain(rows, title)
    if kind == "softmax_layernorm":
        return plot_rows(rows, title)
    if kind == "block":
        return plot_bars(rows, ["phase", "dtype"], "ms", title)
    if kind == "call_overhead":  # functions, or models (--model)
        return plot_bars(rows, ["function" if "function" in rows[0] else "model"], "us/call", title)
    if kind == "dashboard":  # speedup over eager per model (bench/dashboard.py)
        timed = [{**r, "label": f"{r['model']}\n{r['suite'][:5]} {r['dtype']}"} for r in rows if r.get("eager ms")]
        return plot_bars(timed, ["label"], "speedup", title) if timed else None
    if kind == "cold_compile":
        pivot = {}
        for r in rows:
            pivot.setdefault(r["case"], {"case": r["case"]})[f"{r['backend']} s"] = r["median s"]
        return plot_bars(list(pivot.values()), ["case"], "s", title)
    if kind in ("gpt_train", "resnet_train"):  # a training step per dtype (the cold-compile row aside)
        steps = [r for r in rows if r.get("tiny ms") is not None]
        return plot_bars(steps, ["dtype"], "ms", title) if steps else None
    return None
