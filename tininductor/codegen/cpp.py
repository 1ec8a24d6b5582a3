"""C++ code generation: loop IR -> an OpenMP C++ function -> g++ -> ctypes.

A fused group becomes one ``extern "C"`` function. Pointwise groups are one loop over
``xindex`` (or nested loops when all nodes share a multi-dim shape). A reduction group is an
outer loop over ``xindex`` (one output row per iteration, rows in parallel) whose body holds
one inner loop over ``rindex`` per phase, each ``#pragma omp simd`` so g++ vectorises it.
Softmax is::

    #pragma omp parallel for
    for (xindex ...) {                 // rows in parallel
        for (rindex ...) acc1 = tiny_max(acc1, x[...]);       // simd reduction(tiny_max:acc1)
        for (rindex ...) acc6 += exp(x[...] - max);            // simd reduction(+:acc6)
        for (rindex ...) out[...] = exp(x[...] - max) / sum;   // simd
    }

Nodes are ``inner_fn(index)`` bodies run against the ``ops`` handler; :class:`CppKernel` is
that handler for C++. Each op is a format string in :data:`CPP_OPS` (a dict, like tinygrad's
renderers); each result becomes a ``tmpN`` variable, and a repeated expression reuses its
variable (common-subexpression elimination). fp16/bf16 are stored as 16-bit integers and
computed in float. Sums accumulate in double (or int64), which keeps float32 sums within
eager's tolerance without tricks. Kernels take data pointers; sizes are constants, or, in a
graph compiled for dynamic shapes, ``int64_t`` arguments named after their size symbols
(``s0``) that loop bounds and indices use (``for (xindex = 0; xindex < 4*s0; ...)``), with
OpenMP's ``if(...)`` clause deciding at run time whether the work is worth threads.
:class:`CppScheduling` is the backend the scheduler talks to (protocol: codegen/common.py).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import sympy
import torch

from tininductor import ops_table
from tininductor.codecache import CppCodeCache
from tininductor.codegen.common import GeneratedKernel, register_backend
from tininductor.indexing import is_static, prod, size_expr
from tininductor.runtime.index_check import IndexOutOfBounds
from tininductor.scheduler import iteration_vars
from tininductor.virtualized import V

_TMP_RE = re.compile(r"\btmp\d+\b")
#: helpers every kernel includes (precompiled once per cache by CppCodeCache)
PRELUDE_NAME = "tiny_prelude.h"
PRELUDE = (Path(__file__).with_name("cpp_prelude.h")).read_text()

#: torch dtype -> (C++ type in memory, C++ type computed in)
CPP_DTYPES: dict[torch.dtype, tuple[str, str]] = {
    torch.float32: ("float", "float"),
    torch.float64: ("double", "double"),
    torch.float16: ("uint16_t", "float"),
    torch.bfloat16: ("uint16_t", "float"),
    torch.int64: ("int64_t", "int64_t"),
    torch.int32: ("int32_t", "int32_t"),
    torch.int16: ("int16_t", "int16_t"),
    torch.int8: ("int8_t", "int8_t"),
    torch.uint8: ("uint8_t", "uint8_t"),
    torch.bool: ("bool", "bool"),
}
_LOAD_CONVERT = {torch.float16: "tiny_half_to_float", torch.bfloat16: "tiny_bfloat16_to_float"}
_STORE_CONVERT = {torch.float16: "tiny_float_to_half", torch.bfloat16: "tiny_float_to_bfloat16"}


def cpp_type(dtype: torch.dtype) -> str:
    """The C++ type values of ``dtype`` are computed in."""
    try:
        return CPP_DTYPES[dtype][1]
    except KeyError:
        raise NotImplementedError(f"C++ codegen has no mapping for {dtype}; add it to CPP_DTYPES") from None


#: op name -> C++ expression template ({0}, {1}, {2} are the operands' C++ expressions), from the
#: op table (ops_table.py); a dict the course may patch.
CPP_OPS: dict[str, str] = ops_table.formats("cpp")

#: reduction type -> (identity for a dtype's C++ type, update statement, OpenMP reduction identifier)
CPP_REDUCTIONS: dict[str, tuple[Callable[[str], str], str, str]] = {
    "sum": (lambda t: f"static_cast<{t}>(0)", "{acc} += {value}", "+"),
    "prod": (lambda t: f"static_cast<{t}>(1)", "{acc} *= {value}", "*"),
    "max": (lambda t: f"-std::numeric_limits<{t}>::infinity()" if t in ("float", "double")
            else f"std::numeric_limits<{t}>::lowest()", "{acc} = tiny_max({acc}, {value})", "tiny_max"),
    "min": (lambda t: f"std::numeric_limits<{t}>::infinity()" if t in ("float", "double")
            else f"std::numeric_limits<{t}>::max()", "{acc} = tiny_min({acc}, {value})", "tiny_min"),
    "any": (lambda t: "false", "{acc} = {acc} || {value}", "||"),
    "all": (lambda t: "true", "{acc} = {acc} && {value}", "&&"),
}
_REDUCTION_ALIASES = {"amax": "max", "amin": "min"}


def reduction_code(reduction_type: str, acc_type: str) -> tuple[str, str, str]:
    """(initial value, update statement with ``{acc}``/``{value}``, OpenMP reduction identifier)."""
    init, update, omp = CPP_REDUCTIONS[reduction_type]
    return init(acc_type), update, omp


#: OpenMP only pays off above this many element-iterations per kernel.
PARALLEL_THRESHOLD = 32768


def accumulator_type(reduction_type: str, dtype: torch.dtype) -> str:
    """Sums accumulate in double (floats) or int64 (ints/bools): accurate and still vectorised."""
    if reduction_type in ("sum", "prod"):
        if dtype.is_floating_point:
            return "double"
        return "int64_t"
    if reduction_type in ("any", "all"):
        return "bool"
    ctype = cpp_type(dtype)
    return "int64_t" if ctype in ("int32_t", "int16_t", "int8_t", "uint8_t", "bool") else ctype


# ----------------------------------------------------------------------------------- indexing
class _IndexPrinter(sympy.printing.str.StrPrinter):
    """Prints integer index expressions as C++ (``//`` is C++ ``/`` for the non-negative
    values indices are; ``FloorDiv``/``ModularIndexing``-style functions are printed by name)."""

    printmethod = "_tiny_cpp_print"  # not the expressions' own ``_sympystr`` (torch's FloorDiv prints ``//``)

    def _print_Integer(self, expr):
        return str(int(expr))

    def _print_Symbol(self, expr):
        return expr.name

    def _print_Mul(self, expr):
        return " * ".join(self.parenthesize(a, sympy.printing.precedence.precedence(expr)) for a in expr.args)

    def _print_Add(self, expr):
        terms = [self._print(a) for a in sympy.Add.make_args(expr)]
        out = terms[0]
        for t in terms[1:]:
            out += f" - {t[1:]}" if t.startswith("-") else f" + {t}"
        return f"{out}"

    def _print_Pow(self, expr):
        base, exp = expr.args
        if exp.is_Integer and int(exp) > 0:
            return " * ".join([self.parenthesize(base, 100)] * int(exp))
        raise NotImplementedError(f"cannot print index power {expr}")

    def _print_floor(self, expr):
        (arg,) = expr.args
        num, den = sympy.fraction(sympy.together(arg))
        return f"(({self._print(num)}) / ({self._print(den)}))"

    def _print_Mod(self, expr):
        a, b = expr.args
        return f"(({self._print(a)}) % ({self._print(b)}))"

    def _print_Function(self, expr):
        name = type(expr).__name__
        args = [self._print(a) for a in expr.args]
        if name in ("PythonMod", "Mod"):  # ShapeEnv's modulus of non-negative sizes
            return f"(({args[0]}) % ({args[1]}))"
        if name in ("FloorDiv", "floordiv"):
            return f"(({args[0]}) / ({args[1]}))"
        if name == "ModularIndexing":  # base % mod, or (base // div) % mod
            if len(args) == 2:
                return f"(({args[0]}) % ({args[1]}))"
            return f"((({args[0]}) / ({args[1]})) % ({args[2]}))"
        if name in ("Min", "Max"):
            return f"std::{name.lower()}<int64_t>({args[0]}, {args[1]})"
        raise NotImplementedError(f"cannot print index function {name} in C++")

    _print_Min = _print_Max = _print_Function


_printer = _IndexPrinter()


def cpp_index(expr: Any) -> str:
    """C++ text of an index: a sympy expression, an int, or already-printed text."""
    if isinstance(expr, str):
        return expr
    if isinstance(expr, int):
        return str(expr)
    return _printer.doprint(sympy.sympify(expr))


def _operand(value: Any) -> str:
    """An operand for a template: parenthesised unless it is one token (``tmp3``, ``static_cast<float>(2.0)``)."""
    text = str(value)
    return f"({text})" if " " in text or text.startswith("-") else text


def cpp_constant(value: Any, dtype: torch.dtype) -> str:
    """A C++ literal of ``value`` in the compute type of ``dtype`` (inf/nan included)."""
    ctype = cpp_type(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if isinstance(value, float) and math.isnan(value):
        return f"std::numeric_limits<{ctype}>::quiet_NaN()"
    if isinstance(value, float) and math.isinf(value):
        sign = "-" if value < 0 else ""
        return f"{sign}std::numeric_limits<{ctype}>::infinity()"
    if dtype.is_floating_point:
        return f"static_cast<{ctype}>({float(value)!r})"
    return f"static_cast<{ctype}>({int(value)})"


# ------------------------------------------------------------------------------------ kernel
@dataclasses.dataclass
class _Step:
    """One step of the outer loop body: an inner loop nest (``inner_ranges``), or straight-line code."""

    sid: int
    inner_vars: list[str]
    inner_ranges: list[int]
    prefix: list[str] = dataclasses.field(default_factory=list)   # accumulators, before the inner loop
    rdefs: list[str] = dataclasses.field(default_factory=list)    # r0 = rindex / 7 ... at the top of the loop
    body: list[str] = dataclasses.field(default_factory=list)     # inside the innermost loop
    suffix: list[str] = dataclasses.field(default_factory=list)   # after the loop: reduction results, their stores
    reductions: list[tuple[str | None, str]] = dataclasses.field(default_factory=list)  # (omp identifier, acc)

    @property
    def looped(self) -> bool:
        return bool(self.inner_vars)


class CppKernel:
    """One generated C++ function, and the ``ops`` handler that fills it in.

    The function is an outer loop nest over ``outer_ranges``; its body is a list of *steps*,
    each an inner loop nest (a reduction, or pointwise work over the reduced dims) or
    straight-line code. Scoping follows C++: values made inside an inner loop die with it,
    reduction results (made after the loop) live on for later steps. Usage::

        kernel = CppKernel(outer_ranges=[rows])
        with kernel.loop(inner_ranges=[cols]) as (x, r):   # sympy index symbols
            value = kernel.load("buf0", x[0] * cols + r[0], torch.float32)
            kernel.store("buf1", x[0], kernel.reduction(torch.float32, torch.float32, "sum", value))
        source = kernel.codegen("cpp_fused_sum_0", origins=["sum_1"])

    ``CppScheduling`` below drives it from the scheduler's fused groups.
    """

    def __init__(self, outer_ranges: Sequence[int], outer_names: Sequence[str] | None = None,
                 keep_in_registers: Sequence[str] = ()):
        self.outer_ranges = [size_expr(s) for s in outer_ranges]
        names = list(outer_names) if outer_names else [f"x{i}" for i in range(len(self.outer_ranges))]
        self.outer_vars = [sympy.Symbol(n, integer=True, nonnegative=True) for n in names]
        self.xdefs: list[str] = []
        self.steps: list[_Step] = []
        self.inputs: dict[str, torch.dtype] = {}    # buffer name -> dtype, in first-use order
        self.outputs: dict[str, torch.dtype] = {}
        self.stored: set[str] = set()
        self.keep_in_registers = set(keep_in_registers)
        self.needs_memory: set[str] = set()         # kept-in-register buffers that a later step re-read
        self.buffer_dtypes: dict[str, torch.dtype] = {}
        self._arg_names: dict[str, str] = {}
        self._tmp = 0
        self._cse: dict[Any, str] = {}
        self._scope: dict[str, tuple[str, int]] = {}  # var -> ("outer" | "body" | "suffix", step id)
        self._defs: dict[str, str] = {}                # var -> its expression (to re-make it after a loop)
        self._forward: dict[tuple[str, str], tuple[str, torch.dtype]] = {}  # (buffer, index) -> (stored value, dtype)
        self._step: _Step | None = None
        self._rvar_count = 0
        self._range_names: dict[Any, sympy.Symbol] = {}
        self.checks_indices = False   # calls tiny_check_index: the runner looks for an error after a call
        self.serial = False           # scatters to computed indices: no parallel/simd loops (races)

    # -- structure ---------------------------------------------------------------------------
    def open_loop(self, inner_ranges: Sequence[int] = (), inner_names: Sequence[str] | None = None):
        """Start a step; returns (outer index symbols, inner index symbols)."""
        if self._step is not None:
            self.close_loop()
        if inner_names is None:
            inner_names = [f"r{self._rvar_count + i}" for i in range(len(inner_ranges))]
            self._rvar_count += len(inner_ranges)
        rvars = [sympy.Symbol(n, integer=True, nonnegative=True) for n in inner_names]
        self._step = _Step(len(self.steps), [v.name for v in rvars], [size_expr(s) for s in inner_ranges])
        return list(self.outer_vars), rvars

    def close_loop(self) -> None:
        step = self._step
        if step is None:
            return
        for var, (scope, sid) in list(self._scope.items()):
            if sid == step.sid and (scope == "suffix" or not step.looped):
                self._scope[var] = ("outer", sid)   # visible to every later step
        self.steps.append(step)
        self._step = None

    @contextlib.contextmanager
    def loop(self, inner_ranges: Sequence[int] = (), inner_names: Sequence[str] | None = None):
        """``with kernel.loop([cols]) as (x, r):`` -- one step (see :meth:`open_loop`)."""
        handles = self.open_loop(inner_ranges, inner_names)
        try:
            yield handles
        finally:
            self.close_loop()

    def range_symbol(self, expr: Any) -> Any:
        """Name an index sub-expression once: ``int64_t x1 = xindex / 16;`` and return ``x1``."""
        expr = sympy.sympify(expr)
        if expr.is_Integer or expr.is_Symbol:
            return expr
        inner = {v for v in self._need_step().inner_vars}
        is_r = any(s.name in inner for s in expr.free_symbols)
        key = (expr, self._step.sid if is_r else None)
        if key not in self._range_names:
            prefix = "r" if is_r else "x"
            count = sum(1 for k in self._range_names.values() if k.name[0] == prefix)
            symbol = sympy.Symbol(f"{prefix}{count}", integer=True, nonnegative=True)
            self._range_names[key] = symbol
            line = f"const int64_t {symbol} = {cpp_index(expr)};"
            (self._step.rdefs if is_r else self.xdefs).append(line)
        return self._range_names[key]

    def comment(self, text: str) -> None:
        """A ``// text`` line at the current point (before the inner loop of a looped step)."""
        step = self._need_step()
        (step.prefix if step.looped else step.body).append(f"// {text}")

    def _need_step(self) -> _Step:
        if self._step is None:
            raise RuntimeError("CppKernel ops must run inside `with kernel.loop(...)`")
        return self._step

    # -- values and scopes -------------------------------------------------------------------
    def _alive(self, var: str) -> bool:
        scope, sid = self._scope.get(var, ("outer", -1))
        return scope == "outer" or (self._step is not None and sid == self._step.sid)

    def _emit(self, expr: str, key: Any = None, suffix: bool = False) -> str:
        """Bind ``expr`` to a fresh ``tmpN`` (or reuse a live variable holding the same thing).

        It goes after the current inner loop when it uses a reduction result of that loop.
        """
        step = self._need_step()
        operands = _TMP_RE.findall(expr)
        suffix = suffix or any(self._scope.get(v, ("outer", -1)) == ("suffix", step.sid) for v in operands)
        if suffix and step.looped:
            # values made inside the loop are out of scope after it: make them again there
            expr = _TMP_RE.sub(lambda m: self._in_suffix(m.group(0)), expr)
        key = (key if key is not None else expr, suffix)
        if key in self._cse and self._alive(self._cse[key]):
            return self._cse[key]
        var = f"tmp{self._tmp}"
        self._tmp += 1
        (step.suffix if suffix else step.body).append(f"auto {var} = {expr};")
        self._cse[key] = var
        self._defs[var] = expr
        self._scope[var] = ("suffix" if suffix and step.looped else "body" if step.looped else "outer", step.sid)
        return var

    def _in_suffix(self, var: str) -> str:
        if self._scope.get(var, ("outer", -1)) == ("body", self._need_step().sid):
            return self._emit(self._defs[var], suffix=True)
        return var

    def _arg(self, name: str, dtype: torch.dtype, output: bool) -> str:
        if output:
            self.outputs.setdefault(name, dtype)
            self.inputs.pop(name, None) if name not in self._arg_names else None
        elif name not in self.outputs:
            self.inputs.setdefault(name, dtype)
        if name not in self._arg_names:
            prefix = "out_ptr" if output else "in_ptr"
            count = sum(1 for a in self._arg_names.values() if a.startswith(prefix))
            self._arg_names[name] = f"{prefix}{count}"
        elif output and self._arg_names[name].startswith("in_ptr"):
            raise RuntimeError(f"buffer {name} is written after being read in the same kernel")
        return self._arg_names[name]

    def _buffer_dtype(self, name: str) -> torch.dtype:
        if name in self.buffer_dtypes:
            return self.buffer_dtypes[name]
        for table in (self.outputs, self.inputs):
            if name in table:
                return table[name]
        try:
            return V.graph.get_buffer(name).get_dtype()
        except Exception:
            raise KeyError(f"dtype of buffer {name!r} unknown: pass dtype= or set kernel.buffer_dtypes") from None

    # -- the ops handler ----------------------------------------------------------------------
    def load(self, name: str, index: Any, dtype: torch.dtype | None = None) -> str:
        """Read ``name[index]`` (converted to its compute type), or reuse the value this kernel stored there."""
        self._need_step()
        text = cpp_index(index)
        value, stored_dtype = self._forward.get((name, text), (None, None))
        if value is not None and self._alive(value):
            if stored_dtype in _STORE_CONVERT:  # a read sees the value rounded to 16 bits, as in memory
                return self._emit(f"{_LOAD_CONVERT[stored_dtype]}({_STORE_CONVERT[stored_dtype]}({value}))")
            return value
        if name in self.keep_in_registers:
            # its register died with an earlier loop, or this read is at another index (a later
            # loop names its index variables afresh): store it after all
            self.needs_memory.add(name)
        dtype = dtype or self._buffer_dtype(name)
        ptr = self._arg(name, dtype, output=name in self.outputs)
        expr = f"{ptr}[{text}]"
        if dtype in _LOAD_CONVERT:
            expr = f"{_LOAD_CONVERT[dtype]}({expr})"
        return self._emit(expr, key=("load", name, text))

    def store(self, name: str, index: Any, value: str, dtype: torch.dtype | None = None, mode: str | None = None) -> None:
        """Write ``value`` to ``name[index]`` (converted to the storage type).

        ``mode="atomic_add"`` adds it there instead (a scatter-add). A store to a computed
        (indirect) index may hit one place from several iterations, so such a kernel runs its
        loops serially: the result is exact and deterministic, in eager's order.
        """
        step = self._need_step()
        if mode not in (None, "atomic_add"):
            raise NotImplementedError(f"store mode {mode!r}")
        text = cpp_index(index)
        value = str(value)
        if not _TMP_RE.fullmatch(value):    # a literal: give it a variable so it can be forwarded
            value = self._emit(value)
        dtype = dtype or self._buffer_dtype(name)
        if _TMP_RE.search(text):
            self.serial = True
        if mode is None:
            self._forward[(name, text)] = (value, dtype)
        if name in self.keep_in_registers and mode is None:
            return
        ptr = self._arg(name, dtype, output=True)
        self.stored.add(name)
        in_suffix = self._scope.get(value, ("outer", -1)) == ("suffix", step.sid)
        if mode == "atomic_add":
            self.serial = True
            old = f"{_LOAD_CONVERT[dtype]}({ptr}[{text}])" if dtype in _LOAD_CONVERT else f"{ptr}[{text}]"
            value = f"({old} + {value})"
        stored = f"{_STORE_CONVERT[dtype]}({value})" if dtype in _STORE_CONVERT else f"static_cast<{CPP_DTYPES[dtype][0]}>({value})"
        (step.suffix if in_suffix else step.body).append(f"{ptr}[{text}] = {stored};")

    def store_reduction(self, name: str, index: Any, value: str, dtype: torch.dtype | None = None) -> None:
        """Inductor's spelling: the value is a reduction result, stored after the loop."""
        self.store(name, index, value, dtype)

    def reduction(self, dtype: torch.dtype, src_dtype: torch.dtype, reduction_type: str, value: str) -> str:
        """Fold ``value`` over the current inner loop; returns the variable holding the result after it."""
        step = self._need_step()
        if not step.looped:
            raise RuntimeError("ops.reduction needs an inner loop: open the step with inner_ranges")
        if reduction_type in ("argmax", "argmin"):
            return self._arg_reduction(step, dtype, src_dtype, reduction_type, value)
        rtype = _REDUCTION_ALIASES.get(reduction_type, reduction_type)
        if rtype not in CPP_REDUCTIONS:
            raise NotImplementedError(f"C++ reduction {reduction_type!r}; known: {sorted(CPP_REDUCTIONS)}")
        acc_t = accumulator_type(rtype, src_dtype)
        init, update, omp = reduction_code(rtype, acc_t)
        acc = f"acc{self._tmp}"
        self._tmp += 1
        step.prefix.append(f"{acc_t} {acc} = {init};")
        step.body.append(update.format(acc=acc, value=f"static_cast<{acc_t}>({value})") + ";")
        step.reductions.append((omp, acc))
        return self._emit(f"static_cast<{cpp_type(dtype)}>({acc})", suffix=True)

    def _arg_reduction(self, step: _Step, dtype, src_dtype, reduction_type: str, value: str) -> str:
        """argmax/argmin: keep (best value, its flat inner index); the first NaN wins, as in eager.
        The update is a loop-carried branch, so this loop gets no simd/parallel pragma."""
        best_t = accumulator_type("max", src_dtype)
        n = self._tmp
        self._tmp += 1
        best, idx = f"best{n}", f"idx{n}"
        init, _, _ = reduction_code("max" if reduction_type == "argmax" else "min", best_t)
        cmp = ">" if reduction_type == "argmax" else "<"
        flat = " + ".join(
            f"{v} * {cpp_index(prod(step.inner_ranges[i + 1:]))}" for i, v in enumerate(step.inner_vars)
        )
        step.prefix += [f"{best_t} {best} = {init};", f"int64_t {idx} = 0;"]
        step.body += [
            "{",
            f"    auto v = static_cast<{best_t}>({value});",
            f"    if ({best} == {best} && (v != v || v {cmp} {best})) {{ {best} = v; {idx} = {flat}; }}",
            "}",
        ]
        step.reductions.append((None, idx))
        return self._emit(f"static_cast<{cpp_type(dtype)}>({idx})", suffix=True)

    def constant(self, value: Any, dtype: torch.dtype) -> str:
        return cpp_constant(value, dtype)

    def index_expr(self, expr: Any, dtype: torch.dtype) -> str:
        return self._emit(f"static_cast<{cpp_type(dtype)}>({cpp_index(expr)})")

    def indirect_indexing(self, value: str, size: Any, check: bool = True) -> sympy.Symbol:
        """A loaded integer as an index variable (negative indices wrap, as in eager).

        ``check``: an index still out of range is recorded by ``tiny_check_index`` (the prelude)
        and read as 0; the runner raises IndexError after the call (CppKernelRunner).
        """
        if check:
            self.checks_indices = True
            var = self._emit(f"tiny_check_index({value}, {cpp_index(size)})")
        else:
            var = self._emit(f"{value} < 0 ? {value} + {cpp_index(size)} : {value}")
        return sympy.Symbol(var, integer=True)

    def to_dtype(self, value: str, dtype: torch.dtype, src_dtype: torch.dtype | None = None, **_: Any) -> str:
        if dtype == torch.bool:
            return self._emit(f"static_cast<bool>({value} != 0)")
        if dtype in _STORE_CONVERT:  # computed in float, but rounded to 16 bits here, as eager's cast does
            return self._emit(f"{_LOAD_CONVERT[dtype]}({_STORE_CONVERT[dtype]}({value}))")
        return self._emit(f"static_cast<{cpp_type(dtype)}>({value})")

    def __getattr__(self, name: str) -> Callable[..., str]:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in CPP_OPS:
            template = CPP_OPS[name]

            def op(*args: Any) -> str:
                return self._emit(template.format(*(_operand(a) for a in args)))

            op.__name__ = name
            return op
        raise AttributeError(f"C++ codegen has no op {name!r}; add a format string to CPP_OPS")

    # -- emitting the function ----------------------------------------------------------------
    @property
    def arg_order(self) -> list[str]:
        """Buffer names in the order the C++ function takes their pointers."""
        return list(self._arg_names)

    def codegen(self, name: str, origins: Sequence[str] = (), comment: str = "") -> str:
        """The C++ source of this kernel: ``extern "C" void name(pointers...)`` (the prelude is
        added when it is compiled: see :func:`load_cpp_kernel`)."""
        self.close_loop()
        params = []
        for buf, arg in self._arg_names.items():
            is_out = buf in self.outputs
            ctype = CPP_DTYPES[self.outputs[buf] if is_out else self.inputs[buf]][0]
            params.append(f"{'' if is_out else 'const '}{ctype}* __restrict__ {arg}")
        loops = self._codegen_loops()
        params += [f"const int64_t {name}" for name in self.size_args(loops)]
        lines = []
        if origins:
            lines.append(f"// source nodes: {', '.join(origins)}")
        if comment:
            lines.append(f"// {comment}")
        lines.append(f'extern "C" void {name}({", ".join(params)})')
        lines.append("{")
        lines += ["    " + line for line in loops]
        lines.append("}")
        return "\n".join(lines) + "\n"

    def size_args(self, lines: Sequence[str] | None = None) -> list[str]:
        """The size symbols (dynamic shapes) the kernel's code uses, sorted: its int64 arguments."""
        names = {str(s) for s in self.size_symbols}
        if not names:
            return []
        text = "\n".join(lines if lines is not None else self._codegen_loops())
        return sorted(names & set(re.findall(r"\b[A-Za-z_]\w*\b", text)))

    @property
    def size_symbols(self) -> set:
        try:
            return set(getattr(V.graph, "size_sources", ()))
        except Exception:  # used on its own, outside a graph: static sizes
            return set()

    def _work(self):
        outer = prod(self.outer_ranges)
        inner = sum(prod(st.inner_ranges) if st.looped else 1 for st in self.steps) or 1
        return size_expr(outer * inner)

    def _codegen_loops(self) -> list[str]:
        """Outer loops around the steps; OpenMP pragmas chosen by the shape of the work."""
        n = len(self.outer_ranges)
        has_inner = any(st.looped for st in self.steps)
        work = self._work()
        # a symbolic amount of work: threads or not is decided per call (OpenMP's if clause)
        when = "" if is_static(work) else f" if({cpp_index(work)} >= {PARALLEL_THRESHOLD})"
        parallel = (not is_static(work) or work >= PARALLEL_THRESHOLD) and not self.serial
        single_row = prod(self.outer_ranges) == 1
        # one outer iteration (e.g. a full reduction): parallelise the inner loops instead
        parallel_inner = parallel and has_inner and single_row
        body: list[str] = list(self.xdefs)
        for st in self.steps:
            body += self._codegen_step(st, parallel_inner, when)
        pragmas: dict[int, str] = {}
        if has_inner:
            if parallel and not single_row:
                pragmas[0] = "#pragma omp parallel for" + (f" collapse({n})" if n > 1 else "") + when
        elif n >= 1:
            if parallel and n == 1:
                pragmas[0] = "#pragma omp parallel for simd" + when
            elif parallel:
                pragmas[0] = "#pragma omp parallel for" + (f" collapse({n - 1})" if n > 2 else "") + when
            if (n >= 2 or not parallel) and not self.serial:
                pragmas[n - 1] = "#pragma omp simd"
        out: list[str] = []
        for depth, (var, size) in enumerate(zip(self.outer_vars, self.outer_ranges)):
            ind = "    " * depth
            if depth in pragmas:
                out.append(ind + pragmas[depth])
            out.append(f"{ind}for (int64_t {var} = 0; {var} < {cpp_index(size)}; ++{var})")
            out.append(ind + "{")
        out += ["    " * n + line for line in body]
        for depth in reversed(range(n)):
            out.append("    " * depth + "}")
        return out

    def _codegen_step(self, st: _Step, parallel_inner: bool, when: str = "") -> list[str]:
        if not st.looped:
            return st.prefix + st.body + st.suffix
        out = list(st.prefix)
        clauses = "".join(f" reduction({omp}:{acc})" for omp, acc in st.reductions)
        sequential = any(omp is None for omp, _ in st.reductions)  # argmax/argmin: a loop-carried branch
        m = len(st.inner_ranges)
        for depth, (var, size) in enumerate(zip(st.inner_vars, st.inner_ranges)):
            ind = "    " * depth
            if sequential or self.serial:
                pass
            elif depth == 0 and parallel_inner:
                collapse = f" collapse({m})" if m > 1 else ""
                out.append(f"{ind}#pragma omp parallel for simd{collapse}{clauses}{when}")
            elif depth == m - 1 and not parallel_inner:
                out.append(f"{ind}#pragma omp simd{clauses}")
            out.append(f"{ind}for (int64_t {var} = 0; {var} < {cpp_index(size)}; ++{var})")
            out.append(ind + "{")
        out += ["    " * m + line for line in st.rdefs + st.body]
        for depth in reversed(range(m)):
            out.append("    " * depth + "}")
        return out + st.suffix


# --------------------------------------------------------------------------------- launching
class CppKernelRunner:
    """A compiled kernel: call it with tensors (one per pointer argument); it passes data pointers."""

    def __init__(self, name: str, source: str, arg_order: Sequence[str] | int, nsizes: int = 0):
        self.name, self.source = name, source
        self.arg_order = list(arg_order) if not isinstance(arg_order, int) else [f"arg{i}" for i in range(arg_order)]
        full_source, headers = _with_prelude(source), {PRELUDE_NAME: PRELUDE}
        lib = CppCodeCache.load(full_source, headers=headers)
        _loaded.add(full_source)
        self.library_path = CppCodeCache.paths(full_source, headers=headers)["so"]
        self.fn = getattr(lib, name)
        # pointers, then the int64 sizes of a kernel compiled for dynamic shapes
        self.nsizes = nsizes
        self.fn.argtypes = [ctypes.c_void_p] * len(self.arg_order) + [ctypes.c_int64] * nsizes
        self.fn.restype = None
        # the out-of-range index record of this library (prelude: tiny_check_index), if it checks any
        self._index_error = (ctypes.c_int64 * 3).in_dll(lib, "tiny_index_error") if "tiny_check_index(" in source else None

    def __call__(self, *tensors: torch.Tensor) -> None:
        if self.nsizes:  # the trailing arguments are sizes (ints)
            sizes, tensors = tensors[len(tensors) - self.nsizes:], tensors[:len(tensors) - self.nsizes]
        if len(tensors) != len(self.arg_order):
            raise TypeError(f"{self.name} takes {len(self.arg_order)} buffers ({self.arg_order}), got {len(tensors)}")
        if self.nsizes:
            self.fn(*[t.data_ptr() for t in tensors], *sizes)
        else:
            self.fn(*[t.data_ptr() for t in tensors])
        self.raise_index_error()

    def raise_index_error(self) -> None:
        """Raise the IndexError the last call recorded (prelude: ``tiny_check_index``), if any."""
        if self._index_error is not None and self._index_error[0]:
            value, size = self._index_error[1], self._index_error[2]
            self._index_error[0] = 0
            raise IndexOutOfBounds(f"index {value} is out of bounds for dimension with size {size} (in kernel {self.name})")

    def launcher(self) -> Callable[..., None]:
        """A plain function with one parameter per argument that passes their pointers straight on.

        What the generated wrapper calls once per kernel per call: on the small kernels of a small
        model the Python around the C call (``*args``, a list of pointers, the arity check) costs
        as much as the call itself, so each kernel gets a function of its own arity. It is
        ``self``'s ``__call__`` without the generality (TorchInductor's CPU kernels are Python
        extension functions for the same reason); ``launcher.runner`` is this runner.
        """
        params = [f"a{i}" for i in range(len(self.arg_order))] + [f"s{i}" for i in range(self.nsizes)]
        pointers = [f"a{i}.data_ptr()" for i in range(len(self.arg_order))] + params[len(self.arg_order):]
        lines = [f"def {self.name}({', '.join(params)}):", f"    fn({', '.join(pointers)})"]
        if self._index_error is not None:
            lines += ["    if error[0]:", "        runner.raise_index_error()"]
        scope = {"fn": self.fn, "error": self._index_error, "runner": self}
        exec(compile("\n".join(lines) + "\n", f"<cpp launcher {self.name}>", "exec"), scope)
        launch = scope[self.name]
        launch.runner = self
        return launch

    def __repr__(self) -> str:
        return f"<CppKernelRunner {self.name}({', '.join(self.arg_order)})>"


def load_cpp_kernel(name: str, nargs: int, source: str, nsizes: int = 0) -> Callable[..., None]:
    """What generated wrapper modules call: compile (or fetch from the code cache) and load; returns
    the runner's :meth:`~CppKernelRunner.launcher`. ``nsizes``: how many int64 size arguments
    follow the ``nargs`` pointers (dynamic shapes)."""
    return CppKernelRunner(name, source, nargs, nsizes).launcher()


_build_pool = None
_pending: set = set()   # futures of prebuilds not finished yet


def prebuild(source: str) -> None:
    """Start compiling ``source`` in the background (g++ runs as a subprocess, so a graph's
    kernels build on all cores at once). ``load_cpp_kernel`` later finds the library in the
    cache, or waits on the entry's lock; a failed build is simply redone there, where its
    error is raised. ``TINY_CPP_PARALLEL_BUILD=0`` turns this off."""
    global _build_pool

    if os.environ.get("TINY_CPP_PARALLEL_BUILD", "1") == "0":
        return
    if _build_pool is None:
        _build_pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="tiny_cpp_build")
    future = _build_pool.submit(_prebuild_job, _with_prelude(source))
    _pending.add(future)
    future.add_done_callback(_pending.discard)


def wait_for_prebuilds() -> None:
    """Block until every background build has finished (so the code cache's counters, and the
    files on disk, no longer change behind the caller's back)."""
    concurrent.futures.wait(list(_pending))


_loaded: set[str] = set()   # sources a CppKernelRunner has loaded: a queued prebuild of one is moot


def _prebuild_job(full_source: str) -> None:
    if full_source not in _loaded:
        CppCodeCache.load(full_source, headers={PRELUDE_NAME: PRELUDE})


def _with_prelude(source: str) -> str:
    """The text actually compiled: the prelude's ``#include`` first (so its .gch is used)."""
    return f'#include "{PRELUDE_NAME}"\n{source.lstrip()}'



def kernel_name(origins: Sequence[str], index: int) -> str:
    """``cpp_fused_add_sin_0`` from the op names a kernel came from."""
    parts: list[str] = []
    for o in origins:
        short = str(o).split(".")[0]
        if short not in parts:
            parts.append(short)
    return f"cpp_fused_{'_'.join(parts[:5]) or 'kernel'}_{index}"


# -------------------------------------------------------------------------- the backend
class CppScheduling:
    """The C++ backend of the scheduling protocol (codegen/common.py): FusedGroup -> GeneratedKernel.

    A pointwise group is one loop over ``xindex``. A reduction group is an outer loop over
    ``xindex`` (one output row per iteration, rows in parallel) whose body has one inner loop
    over ``rindex`` per *phase*: a node starts a new inner loop when it reads a reduction
    finished in the current one (softmax: max | sum of exp | normalise). Nodes over the kept
    elements only (``xonly``) run between the inner loops. Buffers the scheduler marked
    internal stay in registers unless a later inner loop re-reads them.
    """

    kind = "cpp"
    #: ops.indirect_indexing (bounds-checked) and store(..., mode="atomic_add") work (common.py)
    supports_indirect_indexing = True
    #: op -> C++ format string (checked against the op table by register_backend)
    op_formats = CPP_OPS

    @staticmethod
    def header() -> str:
        return "from tininductor.codegen.cpp import load_cpp_kernel\n"

    def kernel_name(self, group, index: int) -> str:
        ops_: list[str] = []
        for node in group.nodes:
            for op in V.graph.origin_ops(node.origins):
                if op not in ops_:
                    ops_.append(op)
        return kernel_name(ops_, index)

    @staticmethod
    def phases(group) -> list[tuple[str, list]]:
        """[("loop" | "outer", nodes)]: the steps of the outer loop body."""
        if not group.is_reduction:
            return [("outer", list(group.nodes))]
        return group.loop_phases()

    #: nest a pointwise kernel's loops only when the innermost one is long enough to vectorise
    MIN_NESTED_INNER = 16

    @classmethod
    def nested_ranges(cls, group) -> list[int] | None:
        """The common ranges of a pointwise group's nodes, when nesting loops over them pays."""
        if group.is_reduction:
            return None
        ranges = {tuple(size_expr(r) for r in n.get_ranges()) for n in group.nodes}
        if len(ranges) != 1:
            return None
        (only,) = ranges
        if len(only) < 2 or (is_static(only[-1]) and only[-1] < cls.MIN_NESTED_INNER):
            return None
        return list(only)

    def generate(self, group, keep_in_registers) -> CppKernel:
        """Run every node's body with a fresh :class:`CppKernel` installed as the ops handler."""
        nested = self.nested_ranges(group)
        if nested is not None:
            # every node iterates the same multi-dim ranges: nested loops, no div/mod in the index
            kernel = CppKernel(nested, keep_in_registers=keep_in_registers)
            with V.set_ops_handler(kernel):
                index, _ = kernel.open_loop()
                for node in group.nodes:
                    kernel.comment(f"{node.get_name()}: pointwise node from {', '.join(node.origins)}")
                    node.store_body(index, [])
                kernel.close_loop()
            return kernel
        kernel = CppKernel([group.numel], ["xindex"], keep_in_registers=keep_in_registers)
        with V.set_ops_handler(kernel):
            for kind, nodes in self.phases(group):
                looped = kind == "loop"
                kernel.open_loop([group.rnumel] if looped else [], ["rindex"] if looped else None)
                for node in nodes:
                    kernel.comment(f"{node.get_name()}: {group.kind(node)} node from {', '.join(node.origins)}")
                    index, rindex = iteration_vars(node, group.kind(node), group.numel, group.rnumel)
                    node.store_body([kernel.range_symbol(e) for e in index], [kernel.range_symbol(e) for e in rindex])
                kernel.close_loop()
        return kernel

    def codegen_kernel(self, group, index: int):
        name = self.kernel_name(group, index)
        keep = set(group.internal)
        kernel = self.generate(group, keep)
        while kernel.needs_memory & keep:   # a later inner loop re-reads it: store it after all
            keep -= kernel.needs_memory
            kernel = self.generate(group, keep)
        origins = [o for n in group.nodes for o in n.origins]
        shape = f"numel={group.numel}" + (f", rnumel={group.rnumel}" if group.is_reduction else "")
        source = kernel.codegen(name, origins, comment=f"{len(group.nodes)} node(s) over {shape}")
        args = kernel.arg_order
        sizes = kernel.size_args()
        nsizes = f", nsizes={len(sizes)}" if sizes else ""
        text = f'{name} = load_cpp_kernel({name!r}, {len(args)}, r"""\n{source}"""{nsizes})'

        def launch(arg_refs: list[str]) -> str:
            return f"{name}({', '.join(arg_refs + sizes)})"

        return GeneratedKernel(name, text, args, set(kernel.stored), launch, origins,
                               prebuild=lambda: prebuild(source), load_waits=True)


def _register() -> None:
    register_backend("cpu", CppScheduling)


_register()
