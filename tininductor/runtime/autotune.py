"""max-autotune: time a kernel's candidate launch configs on its real arguments, keep the fastest.

The block-size heuristics (``codegen/triton.py``, ``block_sizes``) choose one config from the
sizes alone, and are right most of the time. With ``mode="max-autotune"`` the wrapper gives each
kernel's launcher a short list of candidates (the heuristic's first). At the first launch on a
GPU, each candidate is compiled and timed with ``triton.testing.do_bench``, and the fastest
one is used from then on. This is what TorchInductor's ``max-autotune`` does for its Triton
kernels.

The choice is written to the code cache, keyed by the kernel's source, the candidates, the GPU
and the Triton version. A second process then reuses it without timing anything. A cache
entry that does not name one of the candidates is ignored and the kernel is timed again.

A kernel may be run several times here because generated kernels only write buffers that the
wrapper has just allocated: running one again writes the same values.
"""
from __future__ import annotations

import collections
import inspect
import json
import logging
from typing import Callable

import torch

from ..codecache import _subdir, code_hash, write_atomic

log = logging.getLogger("tininductor.autotune")

#: "disk_hit" (a stored choice was used) and "tuned" (candidates were timed), for tests
stats: collections.Counter = collections.Counter()


def _key(launcher, device: str) -> str:
    import triton  # triton: a second to import, loaded at the first kernel

    try:
        source = inspect.getsource(launcher.fn.fn)
    except (OSError, TypeError):
        source = launcher.fn.fn.__qualname__
    return code_hash(source, json.dumps(launcher.autotune, sort_keys=True), device, triton.__version__)


def _time_with_do_bench(launch: Callable[[], None]) -> float:
    """Milliseconds per launch, measured on the GPU with CUDA events (Triton's do_bench)."""
    from triton.testing import do_bench  # triton: a second to import, loaded at the first kernel

    return do_bench(launch, warmup=5, rep=25)


def autotune(launcher, args, timer: Callable[[Callable[[], None]], float] = _time_with_do_bench,
             device: str | None = None) -> dict:
    """The fastest of ``launcher.autotune`` on ``args`` (from the cache, or timed with ``timer``)."""
    candidates = launcher.autotune
    if device is None:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    path = _subdir("autotune") / f"{_key(launcher, device)}.json"
    try:
        stored = json.loads(path.read_text())["best"]
        if stored in candidates:
            stats["disk_hit"] += 1
            return stored
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not tuned yet, or an unreadable entry: tune (again)

    timings = []
    for config in candidates:
        trial = launcher.with_config(config)
        try:
            trial.run(*args)  # compile (and check it launches) outside the timing
        except Exception as e:  # e.g. out of registers or shared memory on this GPU: not a candidate
            log.info("autotune %s: %s does not run here (%s: %s)", launcher.fn.__name__, config, type(e).__name__, e)
            timings.append(float("inf"))
            continue
        timings.append(timer(lambda: trial.run(*args)))
    if all(t == float("inf") for t in timings[1:]):
        return candidates[0]  # only the heuristic's config is left: nothing to choose or remember
    best = candidates[min(range(len(candidates)), key=timings.__getitem__)]
    stats["tuned"] += 1
    log.info("autotuned %s: %s (%s)", launcher.fn.__name__, best,
             ", ".join(f"{c} {t * 1e3:.1f} us" for c, t in zip(candidates, timings)))
    record = {"kernel": launcher.fn.__name__, "best": best,
              "timings_ms": [[c, t] for c, t in zip(candidates, timings)]}
    write_atomic(path, json.dumps(record, indent=1).encode())
    return best
