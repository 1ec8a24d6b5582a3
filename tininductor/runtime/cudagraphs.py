"""cudagraphify: record a compiled graph's kernels once as a CUDA graph, then replay it.

``mode="reduce-overhead"``. A compiled graph still pays host time per kernel: a launch is a few
microseconds of Python and driver work, and a small model's kernels finish faster than the host
can issue them. A CUDA graph records the whole sequence of launches (Triton kernels, cuBLAS
calls, allocations from a private pool) once; one ``replay()`` then issues all of them at the
cost of about one launch.

The price is that addresses are frozen at record time, so:

* inputs are copied into static buffers before each replay (parameters are not: their
  addresses are stable, and a parameter that moved triggers a new recording);
* outputs live in the graph's memory and are *overwritten by the next call*, exactly as with
  ``torch.compile(mode="reduce-overhead")``: ``clone()`` an output you keep across calls.

Only inference graphs are recorded (no input needs a gradient). Training graphs would also need
the saved activations to survive until backward, which is what PyTorch's CUDA graph trees manage;
we run them without CUDA graphs.
"""
from __future__ import annotations

import logging
import warnings

import torch

log = logging.getLogger("tininductor.cudagraphs")


class CUDAGraphRunner:
    """``runner(*args)``: copy inputs in, replay, return the static outputs (see module docstring)."""

    def __init__(self, fn):
        self.fn = fn  # the compiled graph: fn(*inputs) -> tuple/list of outputs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: list = []
        self.static_outputs = None
        self.copy_indices: list[int] = []  # inputs copied in on every call
        self.static_ptrs: list[tuple[int, int]] = []  # (index, data_ptr) of inputs used in place
        self.disabled: str | None = None  # why this graph runs without CUDA graphs
        self.recordings = 0

    def __call__(self, *args):
        if self.disabled is not None:
            return self.fn(*args)
        if self.graph is None or any(args[i].data_ptr() != ptr for i, ptr in self.static_ptrs):
            return self._record(args)
        for i in self.copy_indices:
            self.static_inputs[i].copy_(args[i])
        self.graph.replay()
        return self.static_outputs

    def _record(self, args):
        """Warm up on a side stream (Triton compiles there), then capture one run into a CUDA graph."""
        self.recordings += 1
        static, self.copy_indices, self.static_ptrs = [], [], []
        for i, a in enumerate(args):
            if isinstance(a, torch.nn.Parameter) or not isinstance(a, torch.Tensor):
                static.append(a)
                if isinstance(a, torch.Tensor):
                    self.static_ptrs.append((i, a.data_ptr()))
            else:
                buffer = torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device)
                buffer.copy_(a)
                static.append(buffer)
                self.copy_indices.append(i)
        self.static_inputs = static
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.fn(*static)  # warm-up: first launches compile and load kernels outside capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = self.fn(*static)
        except Exception as e:  # e.g. a CPU sync inside the graph: run this graph without CUDA graphs
            self.disabled = f"{type(e).__name__}: {e}"
            warnings.warn(f"tininductor: CUDA graph capture failed ({self.disabled}); running without CUDA graphs")
            torch.cuda.synchronize()
            return self.fn(*args)
        self.graph, self.static_outputs = graph, outputs
        log.info("recorded a CUDA graph (%d inputs copied per call, %d used in place)",
                 len(self.copy_indices), len(self.static_ptrs))
        graph.replay()
        return outputs


def cudagraphify(fn, device_types: set[str]):
    """Wrap a compiled inference graph in a :class:`CUDAGraphRunner` when it runs on CUDA alone."""
    if device_types != {"cuda"}:
        log.info("not using CUDA graphs: the graph runs on %s", sorted(device_types))
        return fn
    return CUDAGraphRunner(fn)
