"""cudagraphify: record a compiled graph's kernels once as a CUDA graph, then replay it.

``mode="reduce-overhead"``. A compiled graph still pays host time per kernel: a launch is a few
microseconds of Python and driver work, and a small model's kernels finish faster than the host
can issue them (a training step of the course's block on an H100 is host-bound). A CUDA graph
records the whole sequence of launches (Triton kernels, cuBLAS calls, allocations from a
private pool) once; one ``replay()`` then issues all of them at the cost of about one launch.

The price is that addresses are frozen at record time, so:

* inputs are copied into static buffers before each replay, except those whose address is
  stable: parameters and buffers (``static_input_idxs``: AOT autograd marks the module state; one
  that moved triggers a new recording), and tensors that are the static
  outputs of another graph (a backward graph reads the activations its forward graph saved
  right where that graph wrote them);
* outputs live in the graph's memory and are *overwritten by the next call*, exactly as with
  ``torch.compile(mode="reduce-overhead")``: ``clone()`` an output you keep across calls.

A graph compiled for dynamic shapes serves many sizes, and a recording serves one: such a runner
keeps one recording per distinct set of input sizes and scalar arguments (at most
``MAX_RECORDINGS``; past that it runs without CUDA graphs), as ``torch.compile``'s CUDA graph trees
record per shape. A graph with a CPU tensor input is not recorded at all: a replay would reuse the
value that tensor had at record time (torch.compile skips such graphs the same way).

Training adds one hazard, handled here rather than left to luck: the activations a forward
replay saves must survive until its backward. So a forward graph is not replayed while an
earlier replay's backward is still pending (that forward runs without CUDA graphs, in fresh
memory), and a backward whose saved activations were overwritten anyway (a second backward with
``retain_graph=True`` after a later forward) raises instead of computing garbage. Gradients are
returned as copies, so ``.grad`` never aliases graph memory.
"""
from __future__ import annotations

import logging
import warnings
import weakref

import torch

log = logging.getLogger("tininductor.cudagraphs")

#: data pointers of every recorded graph's static outputs (a hint: such inputs are used in place)
_static_output_ptrs: set[int] = set()

#: recordings one dynamic-shape graph keeps (one per distinct input sizes); more run without CUDA graphs
MAX_RECORDINGS = 8

#: what one recording holds (CUDAGraphRunner's attributes of the same names)
_RECORDING_FIELDS = ("graph", "static_inputs", "static_outputs", "copy_indices", "param_ptrs", "borrowed_ptrs")


class ReplayToken:
    """One forward replay; CompiledFunction keeps it until that replay's backward has run."""

    __slots__ = ("runner", "generation", "backward_done", "__weakref__")

    def __init__(self, runner: "CUDAGraphRunner"):
        self.runner, self.generation, self.backward_done = runner, runner.generation, False

    def check_saved_tensors(self) -> None:
        """Raise if a later replay overwrote the activations this forward saved."""
        if self.runner.generation != self.generation:
            raise RuntimeError(
                "the activations this backward needs were overwritten by a later replay of the same "
                "CUDA graph (mode='reduce-overhead'): run backward before the next forward, or compile "
                "with the default mode")
        self.backward_done = True


class CUDAGraphRunner:
    """``runner(*args)``: copy inputs in, replay, return the static outputs (see module docstring).

    ``kind`` is "inference", "forward" (a training forward: outputs include saved activations)
    or "backward" (returns gradients, copied). ``dynamic``: the graph takes symbolic sizes, so the
    recording is chosen by the inputs' sizes and scalar arguments on every call.
    """

    def __init__(self, fn, kind: str = "inference", dynamic: bool = False, static_input_idxs=()):
        self.fn = fn  # the compiled graph: fn(*inputs) -> tuple/list of outputs
        #: inputs that keep their address from call to call (parameters, buffers): read in place
        self.static_input_idxs = frozenset(static_input_idxs)
        self.kind = kind
        self.dynamic = dynamic
        self.shape_key = None  # dynamic: the sizes the current recording is for
        self._recordings: dict = {}  # dynamic: shape key -> the recording's fields (_RECORDING_FIELDS)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: list = []
        self.static_outputs = None
        self.copy_indices: list[int] = []  # inputs copied in on every call
        self.param_ptrs: list[tuple[int, int]] = []  # (index, data_ptr): parameters used in place
        self.borrowed_ptrs: list[tuple[int, int]] = []  # (index, data_ptr): other graphs' outputs
        self.disabled: str | None = None  # why this graph runs without CUDA graphs
        self.recordings = 0
        self.replays = 0
        self.generation = 0  # bumped by every forward replay
        self.replay_token: ReplayToken | None = None  # the latest call's token (forward graphs)
        self._pending: weakref.ref | None = None

    def __call__(self, *args):
        if self.disabled is not None:
            return self._finish(self.fn(*args), replayed=False)
        if self.kind == "forward" and self._backward_pending():
            return self._finish(self.fn(*args), replayed=False)  # fresh memory: the pending one survives
        if self.dynamic and not self._select(args):
            return self._finish(self.fn(*args), replayed=False)  # too many sizes recorded already
        if self.graph is None or any(args[i].data_ptr() != p for i, p in self.param_ptrs):
            return self._finish(self._record(args), replayed=self.graph is not None)
        if any(args[i].data_ptr() != p for i, p in self.borrowed_ptrs):
            return self._finish(self.fn(*args), replayed=False)  # not where the graph reads them
        for i in self.copy_indices:
            self.static_inputs[i].copy_(args[i])
        self.graph.replay()
        self.replays += 1
        return self._finish(self.static_outputs, replayed=True)

    def _select(self, args) -> bool:
        """Dynamic shapes: make the recording for these sizes current (False: no room for another)."""
        key = tuple((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor) else a for a in args)
        if key == self.shape_key:
            return True
        if self.shape_key is not None and self.graph is not None:
            self._recordings[self.shape_key] = {f: getattr(self, f) for f in _RECORDING_FIELDS}
        if key not in self._recordings and len(self._recordings) >= MAX_RECORDINGS:
            return False
        saved = self._recordings.get(key)
        for field in _RECORDING_FIELDS:
            setattr(self, field, saved[field] if saved else ([] if field.endswith(("inputs", "indices", "ptrs"))
                                                              else None))
        self.shape_key = key
        return True

    def _backward_pending(self) -> bool:
        token = self._pending() if self._pending is not None else None
        return token is not None and not token.backward_done

    def _finish(self, outputs, replayed: bool):
        if self.kind == "forward":
            self.replay_token = None
            if replayed:
                self.generation += 1
                self.replay_token = ReplayToken(self)
                self._pending = weakref.ref(self.replay_token)
                # fresh tensor objects over the static memory: autograd attaches a new grad_fn
                # to each call's outputs, never to the ones an earlier call returned
                return type(outputs)(o.detach() if isinstance(o, torch.Tensor) else o for o in outputs)
        elif self.kind == "backward" and replayed:
            return type(outputs)(o.clone() if isinstance(o, torch.Tensor) else o for o in outputs)
        return outputs

    def _record(self, args):
        """Warm up on a side stream (Triton compiles there), then capture one run into a CUDA graph."""
        cpu = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and not a.is_cuda]
        if cpu:  # a replay would read the value the CPU tensor had when the graph was recorded
            self.disabled = f"input {cpu[0]} is a {args[cpu[0]].device.type} tensor"
            log.info("not using CUDA graphs: %s", self.disabled)
            return self.fn(*args)
        self.recordings += 1
        static, self.copy_indices, self.param_ptrs, self.borrowed_ptrs = [], [], [], []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                static.append(a)
            elif isinstance(a, torch.nn.Parameter) or i in self.static_input_idxs:
                static.append(a)
                self.param_ptrs.append((i, a.data_ptr()))
            elif a.data_ptr() in _static_output_ptrs:
                static.append(a)
                self.borrowed_ptrs.append((i, a.data_ptr()))
            else:
                buffer = torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device)
                buffer.copy_(a)
                static.append(buffer)
                self.copy_indices.append(i)
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
            self.graph = None
            return self.fn(*args)
        self.graph, self.static_inputs, self.static_outputs = graph, static, outputs
        _static_output_ptrs.update(o.data_ptr() for o in outputs if isinstance(o, torch.Tensor))
        log.info("recorded a CUDA graph (%s; %d inputs copied per call, %d used in place)", self.kind,
                 len(self.copy_indices), len(self.param_ptrs) + len(self.borrowed_ptrs))
        graph.replay()
        self.replays += 1
        return outputs


def cudagraphify(fn, device_types: set[str], kind: str = "inference", dynamic: bool = False,
                 static_input_idxs=()):
    """Wrap a compiled graph in a :class:`CUDAGraphRunner` when it runs on CUDA alone;
    ``static_input_idxs``: positions of the inputs that keep their address (parameters, buffers)."""
    if device_types != {"cuda"}:
        log.info("not using CUDA graphs: the graph runs on %s", sorted(device_types))
        return fn
    return CUDAGraphRunner(fn, kind, dynamic, static_input_idxs)
