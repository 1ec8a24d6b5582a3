"""tinydynamo's settings, as module attributes (like ``torch._dynamo.config``), patchable for a block:

    with tinydynamo.config.patch(recompile_limit=2):
        ...
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator

#: misses per code object before tinydynamo gives up and runs it eagerly (torch: recompile_limit). Entries
#: compiled for other objects a frame argument is pinned to (``L['self']``: twelve blocks of one class,
#: each its own module) do not count: the limit is per module instance, as TorchDynamo counts it
recompile_limit: int = 8
#: entries per code object whatever objects they are pinned to (torch: accumulated_recompile_limit)
accumulated_recompile_limit: int = 256
#: a frame first pins each module it reads to that object (NN_MODULE); when a miss finds another
#: module of the same class at the same source (a second block, a copy made for every call), that
#: source is guarded by type from then on and one entry serves them all, as TorchDynamo's inlined
#: modules do (torch: inline_inbuilt_nn_modules). False: one entry per module object
unspecialize_replaced_modules: bool = True
#: a graph break inside a loop resumes in a new function at every iteration; after this many in a
#: chain, the frame runs natively from the break on, its callees compiled (torch.compile does so at once)
max_loop_resumes: int = 8
#: internal compiler errors fall back to eager with a warning (False: raise them)
suppress_errors: bool = True
#: deepest chain of inlined user functions
max_inline_depth: int = 32
#: instructions one frame may execute symbolically (stops runaway loops)
max_instructions: int = 200_000
#: the backend ``compile``/``optimize`` use when none is given
default_backend: str = "tininductor"
#: no full (generation 2) garbage collection while a frame compiles: a compile makes a million
#: objects (FX nodes, fake tensors, sympy expressions), and Python's default thresholds would
#: walk the whole, growing heap again and again (2.2 s of BART's 9.5 s compile on the CPU); the
#: collection happens once after (utils.deferred_full_collections; ``TINY_DEFER_FULL_GC=0``: off)
defer_full_gc: bool = os.environ.get("TINY_DEFER_FULL_GC", "1") != "0"

#: never compile: every optimized function runs eagerly (env TINY_DISABLE=1, like TORCHDYNAMO_DISABLE=1)
disable: bool = os.environ.get("TINY_DISABLE", "0") not in ("", "0")

#: keep ``tensor.item()`` in the graph (an FX node whose Python number only feeds tensor arithmetic);
#: off: ``.item()`` is a graph break (torch: ``torch._dynamo.config.capture_scalar_outputs``)
capture_scalar_outputs: bool = False

#: dynamic shapes (tinydynamo.symbolic_shapes), named like torch._dynamo.config's settings:
#: a recompile caused by a size change compiles the changed dims as symbols (``compile(dynamic=None)``)
automatic_dynamic_shapes: bool = True
#: dims are static unless marked or changed; False: every dim of size >= 2 is a symbol (``dynamic=True``)
assume_static_by_default: bool = True
#: parameters and buffers of modules always have static shapes
force_parameter_static_shapes: bool = True

#: tensor subclasses whose own Python ``__torch_function__`` is traced (inlined at each op); a subclass
#: with an override that is not listed makes its frame fall back to eager (torch's name; torch >= 2.5
#: traces every subclass). Subclasses inheriting torch.Tensor's default are always traced.
traceable_tensor_subclasses: set = set()

#: split graphs captured inside a DistributedDataParallel forward at DDP's gradient-bucket boundaries, so
#: that each bucket's all-reduce overlaps the backward of the pieces before it (tinydynamo.distributed;
#: torch's name: ``torch._dynamo.config.optimize_ddp``)
optimize_ddp: bool = True

#: a frame guarding at least this many plain tensors checks them in one call of torch's C++
#: tensor check (``TensorGuards``, what TorchDynamo runs) instead of Python conditions per tensor:
#: a model's parameters then cost microseconds per cached call. Below it, the generated Python
#: conditions stay readable (chapter 3 prints them). ``None``: Python for every tensor.
cpp_tensor_guards_min: int | None = 4

#: guards on one object reached by several paths (a Hugging Face model's one config object, read
#: by every attention module) are checked once, through the first path, plus one identity check
#: per other path (``guards.share_aliased_objects``). ``False``: every path keeps its own guards.
share_aliased_guards: bool = True

_SETTINGS = ("optimize_ddp", "cpp_tensor_guards_min", "share_aliased_guards", "automatic_dynamic_shapes", "assume_static_by_default", "force_parameter_static_shapes", "disable",
             "capture_scalar_outputs", "traceable_tensor_subclasses", "recompile_limit", "accumulated_recompile_limit",
             "unspecialize_replaced_modules", "max_loop_resumes", "suppress_errors",
             "max_inline_depth", "max_instructions", "default_backend", "defer_full_gc")
_this = sys.modules[__name__]


@contextlib.contextmanager
def patch(arg: str | dict | None = None, value: Any = None, **changes: Any) -> Iterator[None]:
    """Temporarily change settings: ``patch(recompile_limit=2)`` or ``patch("recompile_limit", 2)``."""
    if isinstance(arg, str):
        changes[arg] = value
    elif isinstance(arg, dict):
        changes.update(arg)
    for name in changes:
        if name not in _SETTINGS:
            raise AttributeError(f"tinydynamo.config has no setting {name!r}; known: {list(_SETTINGS)}")
    saved = {name: getattr(_this, name) for name in changes}
    for name, v in changes.items():
        setattr(_this, name, v)
    try:
        yield
    finally:
        for name, v in saved.items():
            setattr(_this, name, v)
