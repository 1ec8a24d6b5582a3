"""What every kernel backend shares, and the protocol between scheduler, backend and wrapper.

The backend-scheduling protocol
===============================

The scheduler (scheduler.py) hands a backend one ``FusedGroup`` at a time:

* ``group.numel`` / ``group.rnumel`` — the kernel's two loop sizes (``rnumel == 1`` and
  ``group.is_reduction == False`` for a pointwise kernel);
* ``group.nodes`` — ``ComputedBuffer``s in program order. For each node,
  ``group.kind(node)`` is ``"pointwise"``, ``"reduction"``, ``"full"`` (pointwise over
  numel*rnumel, computed inside the reduction loop) or ``"xonly"`` (pointwise over numel,
  computed after the reduction loop); ``scheduler.iteration_vars(node, kind, numel, rnumel)``
  gives its ``(index, rindex)`` as sympy expressions in the symbols ``xindex`` and
  ``rindex`` (the flat position in each loop);
* ``node.store_body(index, rindex)`` runs the node's body against the installed ``ops``
  handler (see virtualized.py for the op list): it calls ``ops.load(name, flat_index)``,
  arithmetic ops, at most one ``ops.reduction(dtype, src_dtype, type, value)``, and ends in
  ``ops.store(node.get_name(), flat_index, value)``;
* ``group.internal`` — buffers read only inside this kernel and not outputs: the backend
  may keep them in registers and skip their store (it reports what it did store);
* buffer facts come from ``V.graph.get_buffer(name)``: ``.layout`` has ``size``, ``stride``,
  ``offset`` (elements, relative to the tensor's data pointer), ``dtype`` and ``device``.

The backend returns a ``GeneratedKernel``: its ``name``, the Python ``source`` to place in the
wrapper module (a ``@triton.jit`` function, or a Python statement that compiles and loads
C++), the buffers it takes in argument order, which buffers it ``stored``, and
``call_line()`` — the Python statement the wrapper's ``call()`` runs to launch it. The
wrapper allocates every stored buffer with ``empty_strided`` before the launch.

A backend whose ops handler has ``indirect_indexing`` and ``store(..., mode="atomic_add")``
says so with ``supports_indirect_indexing = True`` on its scheduling class: only then do
embedding, gather, index, index_put and scatter_add lower to kernels on its device (otherwise
they run in torch, logged as fallbacks).

A backend names the table its ops handler prints pointwise ops with as ``op_formats`` on its
scheduling class (op name -> format string); it must cover every op of the op table
(ops_table.py). Backends register with ``register_backend("cuda", TritonScheduling)``, which
checks that; ``get_scheduling`` picks one per device type (CPU: ``config.cpu_backend``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
from typing import Callable, Iterator

import torch

from .. import config
from ..ops_table import missing_ops


class IndentedBuffer:
    """Lines of generated code with an indentation level (``with buf.indent(): ...``)."""

    def __init__(self, indent: int = 0):
        self.lines: list[str] = []
        self.level = indent

    def writeline(self, line: str) -> None:
        self.lines.append(("    " * self.level + line) if line else "")

    def writelines(self, lines) -> None:
        for line in lines:
            self.writeline(line)

    def splice(self, other: "IndentedBuffer | str") -> None:
        text = other.getvalue() if isinstance(other, IndentedBuffer) else other
        for line in text.splitlines():
            self.writeline(line)

    @contextlib.contextmanager
    def indent(self, n: int = 1) -> Iterator[None]:
        self.level += n
        try:
            yield
        finally:
            self.level -= n

    def getvalue(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.lines else "")


class CSE:
    """Common-subexpression elimination: one variable per distinct expression string.

    ``cache`` maps an expression (or a ``("load", name, index)`` key) to the variable
    holding it; backends drop entries made inside a loop when the loop closes.
    """

    def __init__(self, prefix: str = "tmp"):
        self.prefix = prefix
        self.count = 0
        self.cache: dict = {}

    def newvar(self) -> str:
        name = f"{self.prefix}{self.count}"
        self.count += 1
        return name

    def generate(self, buffer: IndentedBuffer, expr: str, key=None) -> str:
        key = expr if key is None else key
        if key in self.cache:
            return self.cache[key]
        var = self.newvar()
        buffer.writeline(f"{var} = {expr}")
        self.cache[key] = var
        return var


@dataclasses.dataclass
class GeneratedKernel:
    """A backend's answer for one FusedGroup."""

    name: str
    source: str  # Python text placed in the wrapper module
    arg_names: list[str]  # buffer names passed in order
    stored: set[str]  # buffers written to memory (the wrapper allocates them)
    launch: Callable[[list[str]], str]  # arg expressions -> the call statement
    origins: list[str] = dataclasses.field(default_factory=list)
    # start compiling it in the background: called by the wrapper for each kernel it keeps (not
    # for one that reuses an earlier kernel's code)
    prebuild: Callable[[], None] | None = None
    # loading the module waits for this kernel's build (C++), where loading a Triton kernel only
    # starts its compile: such kernels go last in the module
    load_waits: bool = False
    # its launcher skips the alignment check of the arguments the wrapper knows to be aligned
    # (``TritonLauncher.assume_aligned``)
    takes_known_alignment: bool = False

    def call_line(self, refs: dict[str, str] | None = None) -> str:
        refs = refs or {}
        return self.launch([refs.get(a, a) for a in self.arg_names])


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


#: device type -> backend scheduling class (``codegen_kernel(group, name) -> GeneratedKernel``)
backends: dict[str, type] = {}


def register_backend(device_type: str, scheduling: type) -> None:
    """Make ``scheduling`` the kernel backend for ``device_type``, once it covers the op table."""
    check_backend(device_type, scheduling)
    backends[device_type] = scheduling


def check_backend(device_type: str, scheduling: type) -> None:
    """Raise a TypeError naming what is missing unless ``scheduling`` covers the op table (what
    :func:`register_backend` checks; a backend swapped in for a while is checked the same way)."""
    name = getattr(scheduling, "__name__", repr(scheduling))
    formats = getattr(scheduling, "op_formats", None)
    if formats is None:
        raise TypeError(f"kernel backend {name} declares no op_formats; give its scheduling class an "
                        "op_formats dict (op name -> format string) covering tininductor/ops_table.py")
    missing = missing_ops(formats)
    if missing:
        raise TypeError(f"kernel backend {name} for {device_type!r} cannot print the ops {missing}; "
                        "add their format strings to its op_formats (the op table is tininductor/ops_table.py)")


def get_scheduling(device: torch.device):
    """The backend for ``device``: Triton on CUDA; on CPU ``config.cpu_backend`` ("cpp" or "triton")."""
    _load_default_backends()
    kind = device.type
    if kind == "cpu":
        choice = config.cpu_backend
        if choice == "auto":
            choice = "cpp" if "cpu" in backends else "triton"
        kind = "cpu_triton" if choice == "triton" else "cpu"
    if kind not in backends:
        raise RuntimeError(
            f"no kernel backend for device {device} (config.cpu_backend={config.cpu_backend!r}); "
            "set tininductor.config.cpu_backend = 'triton' to run CPU graphs in the Triton interpreter"
        )
    return backends[kind]()


#: the kernel backends shipped with tininductor: plugins, imported by name on first use (each registers
#: itself with register_backend), so that this module, the protocol they implement, never imports them
DEFAULT_BACKENDS = ("tininductor.codegen.triton",  # "cuda" and "cpu_triton"
                    "tininductor.codegen.cpp")     # "cpu", when the C++ backend exists


def _load_default_backends() -> None:
    for name in DEFAULT_BACKENDS:
        try:
            importlib.import_module(name)
        except ImportError:
            if name == DEFAULT_BACKENDS[0]:
                raise
