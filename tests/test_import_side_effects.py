"""Importing the packages does no work: no threads, no worker processes, no Triton warm-up.

tininductor's background work (Triton's driver, the compile worker processes) starts when the backend
is chosen (``tinydynamo.backends.lookup_backend`` calls its ``warm_up``) or first called, so that it
still overlaps with capturing the first frame. Each check runs in a fresh interpreter.
"""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_fresh(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for name in ("TRITON_INTERPRET", "TINY_TRITON_PARALLEL_COMPILE", "TINY_TRITON_WARMUP"):  # as on a GPU machine
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_packages_starts_no_thread_or_process():
    out = run_fresh("""
        import multiprocessing, threading
        import tinydynamo, tininductor
        import tininductor.compile_fx, tinydynamo.eval_frame
        print(threading.active_count(), len(multiprocessing.active_children()))
    """)
    assert out == "1 0"


def test_the_backend_warms_up_when_looked_up_not_when_imported():
    """As on a GPU machine (CUDA reported available): importing compile_fx starts nothing, looking
    the backend up starts Triton's driver and the compile workers (both stubbed here)."""
    out = run_fresh("""
        import torch
        torch.cuda.is_available = lambda: True
        from tininductor.runtime import compile_worker, triton_launcher
        calls = []
        triton_launcher.warm_up_driver = lambda: calls.append("driver")
        compile_worker.start_workers = lambda: calls.append("workers")
        import tininductor.compile_fx
        print(calls)
        from tinydynamo.backends import lookup_backend
        lookup_backend("tininductor")
        print(calls)
    """)
    assert out.splitlines() == ["[]", "['driver', 'workers']"]
