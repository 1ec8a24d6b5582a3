"""A convolution weight in channels-last memory order, converted once and reused across calls.

Under layout optimization (graph.py's ``_wants_channels_last``) a convolution's input is
channels-last, and cuDNN (or oneDNN on the CPU) runs a convolution in one memory format for
all its operands: given a contiguous ``[C_out, C_in, kh, kw]`` weight it converts that weight
with ``weight.contiguous(memory_format=torch.channels_last)`` inside every call, five ATen ops
on the host (``contiguous``, ``clone``, ``empty_like``, ``empty``, ``copy_``) and a copy
kernel, for a value that only changes when the model's weights do. The generated wrapper calls
:func:`channels_last_weight` instead, which converts once and hands back the same copy while it
is still valid:

* the copy belongs to one tensor object (looked up by ``id``; a parameter that was replaced by
  another is another object, so it gets a copy of its own);
* it is taken again when that tensor's ``_version`` counter moved (every in-place op through
  the tensor or a ``detach()``-ed alias bumps it: ``optimizer.step()``, ``p.mul_(2)`` under
  ``no_grad``, ``p.copy_(...)``) or its data pointer did (``p.data = other``);
* it is held next to a weak reference to the weight: when the weight dies (the model is
  deleted), its entry and copy go with it, so the cache never keeps a model's memory alive.

**One hole.** A write through ``p.data`` (``p.data.mul_(2)``) goes to a tensor with a version
counter of its own, so ``p._version`` does not move and the stale copy is reused: the same
writes autograd's "modified by an inplace operation" check cannot see. Update parameters with
``torch.no_grad()`` and in-place ops on the parameter itself (as ``torch.optim`` does), or turn
``config.cache_conv_weights`` off.

How this differs from its neighbours:

* **torch.compile** (TorchInductor without freezing) keeps the weight a graph input and converts
  it in every call (a copy kernel it generates, where here cuDNN's conversion ran): always
  current, paid per call.
* **freezing** (``config.freezing``; TorchInductor's of the same name) makes the weights
  constants of the compiled graph and converts them once at compile time: free per call, but the
  compiled function never sees a later change to the weights.
* this cache: converted once, like freezing, and converted again after a (version-tracked)
  change, like torch.compile; the price is a second copy of every such weight in memory.

Under CUDA graphs (``mode="reduce-overhead"``) the wrapper's Python does not run at replay, so
nothing could check the cache: such graphs let the convolution convert the weight in every
replay (graph.py decides, at compile time).
"""
from __future__ import annotations

import collections
import weakref

import torch

#: id(weight) -> (weak reference to weight, its _version, its data_ptr, the channels-last copy)
_cache: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}

#: "copy": conversions made (a first call, or a weight that changed); tests count these
stats: collections.Counter = collections.Counter()


def channels_last_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` in channels-last memory order: the cached copy while it is still valid, else a
    fresh one (then cached). Called by generated wrappers, once per convolution per call."""
    key = id(weight)
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor (made under torch.inference_mode) tracks no version
        return weight.contiguous(memory_format=torch.channels_last)
    entry = _cache.get(key)
    if entry is not None:
        ref, cached_version, data_ptr, copy = entry
        if ref() is weight and cached_version == version and data_ptr == weight.data_ptr():
            return copy
    # detach: the copy must not carry an autograd graph (it outlives the call that made it)
    copy = weight.detach().contiguous(memory_format=torch.channels_last)
    _cache[key] = (weakref.ref(weight, _forget(key)), version, weight.data_ptr(), copy)
    stats["copy"] += 1
    return copy


def _forget(key: int):
    """The weak reference's callback: drop the entry of a weight that died (and only that entry:
    a new tensor may have been given the same id and its own entry since)."""

    def callback(ref: weakref.ref) -> None:
        entry = _cache.get(key)
        if entry is not None and entry[0] is ref:
            del _cache[key]

    return callback


def clear() -> None:
    """Forget every cached copy and the counters."""
    _cache.clear()
    stats.clear()
