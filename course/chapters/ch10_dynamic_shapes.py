"""Chapter 10's helpers: print sympy as Python, run guards, replay a frame's cache, generate and run a
kernel whose sizes are arguments. Not exercises.

A helper that runs the learner's code takes it as an argument, from the chapter module the caller
loaded: ``SymInt(expr, env)`` asks ``env`` (a ``ch.ShapeEnv``), ``simulate_cache(
ch.update_frame_state, ch.symbolic_dims, calls)``, ``pointwise_kernel(ch.broadcast_index, ...)``.
``pexpr`` is the printer the exercise file imports for its guards.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Callable, Iterable, Sequence

import sympy
from sympy.printing.str import StrPrinter

# ---- printing sympy expressions as Python (guards, index expressions) -----------------------------


class PythonPrinter(StrPrinter):
    """sympy -> Python source: ``Eq(a, b)`` as ``a == b``, ``floor(a/b)`` as ``a // b``, ``Mod`` as ``%``."""

    def _print_Relational(self, expr):
        return f"{self._print(expr.lhs)} {expr.rel_op} {self._print(expr.rhs)}"

    def _print_Mod(self, expr):
        return f"({self._atom(expr.args[0])} % {self._atom(expr.args[1])})"

    def _print_floor(self, expr):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        return f"({self._atom(num)} // {self._atom(den)})"

    def _atom(self, expr):
        text = self._print(expr)
        return text if expr.is_Atom or isinstance(expr, (sympy.Mod, sympy.floor)) else f"({text})"


def pexpr(expr) -> str:
    """A sympy expression (guard or index) as Python source."""
    return PythonPrinter().doprint(sympy.sympify(expr))


# ---- guards: running them, and where they are born ------------------------------------------------


def check_fn(guards: list[str]) -> Callable[[dict], bool]:
    """One generated function that checks every guard (as chapter 3's), given ``L``."""
    body = "\n".join(f"    if not ({guard}): return False" for guard in guards)
    source = f"def check(L):\n{body or '    pass'}\n    return True\n"
    scope: dict = {}
    exec(source, scope)
    check = scope["check"]
    check.source = source
    return check


class SymInt:
    """An int whose value is a symbol: arithmetic builds expressions, comparisons ask the ShapeEnv.

    ``bool()`` of a comparison is where a guard is born (``if n > 4:`` in user code), which is
    what torch's ``SymInt``/``SymBool`` do through ``guard_bool``.
    """

    def __init__(self, expr, env):  # env: the learner's ch.ShapeEnv
        self.expr, self.env = sympy.sympify(expr), env

    def _wrap(self, other, op, reverse=False):
        other = other.expr if isinstance(other, SymInt) else sympy.sympify(other)
        a, b = (other, self.expr) if reverse else (self.expr, other)
        return SymInt(op(a, b), self.env)

    def __add__(self, other): return self._wrap(other, operator.add)
    def __radd__(self, other): return self._wrap(other, operator.add, True)
    def __mul__(self, other): return self._wrap(other, operator.mul)
    def __rmul__(self, other): return self._wrap(other, operator.mul, True)
    def __sub__(self, other): return self._wrap(other, operator.sub)
    def __floordiv__(self, other): return self._wrap(other, lambda a, b: sympy.floor(a / b))

    def _compare(self, other, op):
        other = other.expr if isinstance(other, SymInt) else sympy.sympify(other)
        return SymBool(op(self.expr, other), self.env)

    def __gt__(self, other): return self._compare(other, sympy.Gt)
    def __ge__(self, other): return self._compare(other, sympy.Ge)
    def __lt__(self, other): return self._compare(other, sympy.Lt)
    def __le__(self, other): return self._compare(other, sympy.Le)
    def __eq__(self, other): return self._compare(other, sympy.Eq)
    def __ne__(self, other): return self._compare(other, sympy.Ne)
    __hash__ = None

    def __int__(self):  # reading the value specialises: a guard that it stays this value
        value = self.env.size_hint(self.expr)
        self.env.evaluate_expr(sympy.Eq(self.expr, value))
        return value

    def __repr__(self):
        return f"SymInt({self.expr})"


class SymBool:
    def __init__(self, expr, env):  # env: the learner's ch.ShapeEnv
        self.expr, self.env = expr, env

    def __bool__(self):
        return self.env.evaluate_expr(self.expr)

    def __repr__(self):
        return f"SymBool({self.expr})"


# ---- the recompile policy, replayed -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """A compiled graph's shape contract: per dim an int (static) or a symbol name (any size >= 2;
    dims sharing a name must be equal: duck sizing)."""

    pattern: tuple

    def accepts(self, sizes: Sequence[int]) -> bool:
        if len(sizes) != len(self.pattern):
            return False
        bound: dict[str, int] = {}
        for want, n in zip(self.pattern, sizes):
            if isinstance(want, int):
                if want != n:
                    return False
            elif n < 2 or bound.setdefault(want, n) != n:
                return False
        return True


def compile_entry(sizes: Sequence[int], dims: Iterable[int], duck: Iterable[int] = ()) -> CacheEntry:
    """The entry a compile for ``sizes`` with symbols on ``dims`` leaves in the cache; the dims in
    ``duck`` share a symbol when their sizes are equal, the others get one each."""
    dims, duck, names, pattern = set(dims), set(duck), {}, []
    for i, n in enumerate(sizes):
        if i not in dims:
            pattern.append(n)
        elif i in duck:
            pattern.append(names.setdefault(n, f"s{len(names)}"))
        else:
            pattern.append(f"u{i}")
    return CacheEntry(tuple(pattern))


def simulate_cache(update_frame_state: Callable, symbolic_dims: Callable, calls: Iterable[Sequence[int]],
                   dynamic: bool | None = None, marked: Iterable[int] = (), recompile_limit: int = 8) -> list[tuple]:
    """Replay a frame's cache over the input sizes of ``calls``: the pattern of every compile, with the
    recompile policy of Exercise 10.3 (the ``update_frame_state`` and ``symbolic_dims`` given).

    Newest entry first on lookup; a miss compiles (automatic dynamic updates its state first),
    until ``recompile_limit`` compiles, after which misses run eagerly. Duck sizing only for the
    dims ``dynamic=True`` made symbolic: torch gives automatic and marked dims a symbol each.
    """
    state, entries = None, []
    for sizes in calls:
        if any(entry.accepts(sizes) for entry in entries) or len(entries) >= recompile_limit:
            continue
        state = update_frame_state(state, sizes)
        dims = symbolic_dims(state, sizes, dynamic, marked)
        duck = [d for d in dims if d not in set(marked)] if dynamic is True else []
        entries.insert(0, compile_entry(sizes, dims, duck))
    return [entry.pattern for entry in reversed(entries)]


# ---- a kernel that takes its sizes as arguments -------------------------------------------------


def kernel_symbols(out_sizes: Sequence, in_shapes: Sequence[Sequence]) -> list[sympy.Symbol]:
    """The size symbols a kernel needs as arguments, in a fixed order."""
    found = set().union(*(sympy.sympify(s).free_symbols for shape in (out_sizes, *in_shapes) for s in shape))
    return sorted(found, key=str)


def pointwise_kernel(broadcast_index: Callable, name: str, out_sizes: Sequence, in_shapes: Sequence[Sequence],
                     op: str) -> str:
    """Python source of a pointwise kernel: one loop ``for xindex in range(xnumel)``, with
    ``xnumel`` and every size symbol as arguments, so one source serves every size. Each input is
    loaded at ``broadcast_index(out_sizes, its_shape)`` (Exercise 10.4); ``op`` combines the loads,
    e.g. ``"{0} + {1}"``."""
    symbols = kernel_symbols(out_sizes, in_shapes)
    args = [f"in_ptr{i}" for i in range(len(in_shapes))] + ["out_ptr0", "xnumel"] + [str(s) for s in symbols]
    lines = [f"def {name}({', '.join(args)}):", "    for xindex in range(xnumel):"]
    for i, shape in enumerate(in_shapes):
        lines.append(f"        tmp{i} = in_ptr{i}[{pexpr(broadcast_index(out_sizes, shape))}]")
    loads = [f"tmp{i}" for i in range(len(in_shapes))]
    lines.append(f"        out_ptr0[xindex] = {op.format(*loads)}")
    return "\n".join(lines) + "\n"


def bind_symbols(shapes: Sequence[Sequence], tensors: Sequence) -> dict[sympy.Symbol, int]:
    """Each size symbol's value, read from the actual tensors (what the wrapper does per call)."""
    values: dict[sympy.Symbol, int] = {}
    for shape, tensor in zip(shapes, tensors):
        for size, actual in zip(shape, tensor.shape):
            size = sympy.sympify(size)
            if isinstance(size, sympy.Symbol):
                values.setdefault(size, int(actual))
    return values


def run_pointwise(source: str, out_sizes: Sequence, in_shapes: Sequence[Sequence], inputs: Sequence):
    """Compile ``source`` (once per source text) and run it on ``inputs``: sizes come from the tensors."""
    import torch

    scope: dict = {}
    exec(source, scope)
    kernel = next(v for k, v in scope.items() if callable(v) and not k.startswith("__"))
    values = bind_symbols(in_shapes, inputs)
    shape = [int(sympy.sympify(s).xreplace(values)) for s in out_sizes]
    out = [0.0] * math.prod(shape)
    flat = [t.contiguous().flatten().tolist() for t in inputs]
    kernel(*flat, out, len(out), *[values[s] for s in kernel_symbols(out_sizes, in_shapes)])
    return torch.tensor(out, dtype=inputs[0].dtype).view(shape)
