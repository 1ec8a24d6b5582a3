"""Index expressions: sympy with two integer helpers, and printers for generated code.

Every load and store in the IR names a buffer and a *flat* index: a sympy expression over
the loop variables, ``offset + sum(var_i * stride_i)``. Views, broadcasting and strides all
become arithmetic here. Every expression is a polynomial in the loop variables plus
``FloorDiv`` / ``ModularIndexing`` where a flat counter is split back into dimensions.

Sizes are ints, or sympy expressions over the ShapeEnv's size symbols (``s0``, ``2*s1``) in a
graph compiled for dynamic shapes (``size_expr``): the same arithmetic then yields index
expressions over those symbols, which kernels take as arguments.

PyTorch spreads this over ``torch/utils/_sympy/functions.py`` (``FloorDiv``,
``ModularIndexing``), ``torch/_inductor/sizevars.py`` (``SizeVarAllocator``: simplifying and
comparing size expressions) and the printers in ``torch/_inductor/codegen/common.py``.
"""
from __future__ import annotations

import functools
from typing import Sequence

import sympy
from sympy.printing.str import StrPrinter


class FloorDiv(sympy.Function):
    """``base // divisor`` for non-negative integers (prints as ``//``)."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        return None


class ModularIndexing(sympy.Function):
    """``base % modulus`` for non-negative integers (prints as ``%``)."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, base, modulus):
        if modulus == 1 or base == 0:
            return sympy.Integer(0)
        if base.is_Integer and modulus.is_Integer:
            return sympy.Integer(int(base) % int(modulus))
        return None


def _dimension(atom):
    """``(base, divisor, modulus)`` when ``atom`` is one dimension of a flat counter: ``X // d % n``
    (``modulus`` None for ``X // d``, the outermost dimension); None for anything else."""
    modulus = None
    if isinstance(atom, ModularIndexing):
        atom, modulus = atom.args
    if isinstance(atom, FloorDiv):
        base, divisor = atom.args
    else:
        base, divisor = atom, sympy.Integer(1)
    return (base, divisor, modulus) if base.is_Symbol else None


def _make_dimension(base, divisor, modulus):
    inner = FloorDiv(base, divisor)
    return inner if modulus is None else ModularIndexing(inner, modulus)


def _split_term(term, bases):
    """``c * dim`` -> ``(c, (base, divisor, modulus))`` for a term with exactly one dimension factor."""
    dims = [f for f in sympy.Mul.make_args(term)
            if isinstance(f, (FloorDiv, ModularIndexing)) or f in bases]
    if len(dims) != 1 or _dimension(dims[0]) is None:
        return None
    return sympy.Mul(*[f for f in sympy.Mul.make_args(term) if f is not dims[0]]), _dimension(dims[0])


@functools.lru_cache(maxsize=8192)
def join_dimensions(expr):
    """Undo a split of a flat counter that an index puts back together.

    ``unflatten`` gives each loop dimension its own ``X // d % n``; an access that walks those
    dimensions contiguously adds them back, ``196608*(X // 196608) + 3072*(X // 3072 % 64) +
    X % 3072``, which is just ``X``, but costs a kernel two divisions and two remainders per
    element (by runtime values when sizes are symbolic). Two rules, exact for non-negative
    integers and applied until nothing changes:

    * ``c*(X//d % n) + c*n*(X//(d*n) % m)  ->  c*(X//d % (n*m))``
    * ``c*(X//d % n) + c*n*(X//(d*n))      ->  c*(X//d)``

    PyTorch: ``SizeVarAllocator.join_dimensions`` (torch/_inductor/sizevars.py).
    """
    expr = sympy.expand(sympy.sympify(expr))
    if not expr.is_Add:
        return expr
    bases = {a.args[0].args[0] if isinstance(a.args[0], FloorDiv) else a.args[0]
             for a in expr.atoms(FloorDiv, ModularIndexing)}
    bases = {b for b in bases if b.is_Symbol}
    if not bases:
        return expr
    terms = list(expr.args)
    changed = True
    while changed:
        changed = False
        split = [_split_term(t, bases) for t in terms]
        for i, a in enumerate(split):
            if a is None or a[1][2] is None:
                continue
            coeff, (base, divisor, modulus) = a
            for j, b in enumerate(split):
                if j == i or b is None or b[1][0] != base:
                    continue
                if sympy.expand(b[1][1] - divisor * modulus) != 0 or sympy.expand(b[0] - coeff * modulus) != 0:
                    continue
                outer = b[1][2]
                joined = coeff * _make_dimension(base, divisor, None if outer is None else modulus * outer)
                terms = [t for k, t in enumerate(terms) if k not in (i, j)] + [joined]
                changed = True
                break
            if changed:
                break
    return sympy.expand(sympy.Add(*terms))


def size_expr(x):
    """A size as IR uses it: an ``int`` when it is known, else a sympy expression over size symbols.

    ``torch.SymInt`` (from a fake tensor of a dynamic-shape graph) gives its ShapeEnv expression
    (``SymInt.node.expr``, e.g. ``s0`` or ``2*s0``); a sympy integer becomes a plain int.
    """
    if isinstance(x, int):
        return x
    if hasattr(x, "node") and hasattr(x.node, "expr"):  # torch.SymInt
        x = _drop_max_min(x.node.expr, getattr(x.node, "shape_env", None))
    if isinstance(x, sympy.Basic):
        return int(x) if x.is_Integer else x
    return int(x)


def _drop_max_min(expr, shape_env):
    """``Max(1, s0 // 2)`` (a stride rule's guard against size 0) -> ``s0 // 2`` where the ShapeEnv
    knows which argument is larger (sizes >= 2 after 0/1 specialisation), so generated code is
    plain arithmetic; undecided ones are kept."""
    def is_max_min(e) -> bool:  # sympy's Max/Min or torch's own (torch.utils._sympy.functions)
        return type(e).__name__ in ("Max", "Min") and len(e.args) == 2

    if shape_env is None or not any(is_max_min(e) for e in sympy.preorder_traversal(expr)):
        return expr

    def decide(e):
        a, b = e.args
        is_max = type(e).__name__ == "Max"
        if shape_env._maybe_evaluate_static(sympy.Ge(a, b) if is_max else sympy.Le(a, b)) == sympy.true:
            return a
        if shape_env._maybe_evaluate_static(sympy.Ge(b, a) if is_max else sympy.Le(b, a)) == sympy.true:
            return b
        return e

    try:
        return expr.replace(is_max_min, decide)
    except Exception:  # a ShapeEnv without that query: keep the expression
        return expr


def is_static(x) -> bool:
    """True when ``x`` (a size or expression) is a known integer."""
    return isinstance(x, int) or (isinstance(x, sympy.Basic) and x.is_Integer)


def statically_known(condition) -> bool:
    """True only when ``condition`` (a bool or sympy relation) holds for every value of the symbols
    sympy can decide it for; an undecidable condition is False (the caller takes the safe path)."""
    if isinstance(condition, bool):
        return condition
    return bool(condition) if condition in (sympy.true, sympy.false) else False


def sym(name: str) -> sympy.Symbol:
    """A non-negative integer loop variable."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


def contiguous_strides(size: Sequence[int]) -> list[int]:
    """Row-major strides for ``size`` (what ``torch.empty(size).stride()`` returns)."""
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        s = size_expr(s)
        acc = acc * (max(s, 1) if isinstance(s, int) else s)  # a symbolic size is >= 2 (0/1 are specialised)
    return list(reversed(strides))


def unflatten(flat: sympy.Expr, sizes: Sequence[int]) -> list[sympy.Expr]:
    """Split a flat row-major counter over ``sizes`` into one expression per dimension.

    Size-1 dimensions get 0, the outermost dimension needs no modulus (the counter never
    exceeds the product), the innermost no division.
    """
    out: list[sympy.Expr] = []
    divisor = 1
    sizes = [size_expr(s) for s in sizes]
    nontrivial = [i for i, s in enumerate(sizes) if s != 1]
    outermost = nontrivial[0] if nontrivial else -1
    for i in reversed(range(len(sizes))):
        size = sizes[i]
        if size == 1:
            out.append(sympy.Integer(0))
            continue
        e = FloorDiv(flat, divisor)
        if i != outermost:
            e = ModularIndexing(e, size)
        out.append(e)
        divisor *= size
    return list(reversed(out))


def flatten(index: Sequence[sympy.Expr], sizes: Sequence[int]) -> sympy.Expr:
    """The row-major flat position of ``index`` in a tensor of ``sizes``."""
    return sympy.expand(sum((i * s for i, s in zip(index, contiguous_strides(sizes))), sympy.Integer(0)))


def free_names(expr: sympy.Expr) -> set[str]:
    return {s.name for s in expr.free_symbols}


def prod(xs):
    """The product of sizes: an int when all are known, else a sympy expression."""
    out = 1
    for x in xs:
        out = out * size_expr(x)
    return size_expr(out) if isinstance(out, sympy.Basic) else out


class IndexPrinter(StrPrinter):
    """Prints index expressions as Python/Triton integer arithmetic (``//``, ``%``).

    The C++ backend can subclass it (``/`` for FloorDiv on unsigned/non-negative ints).
    """

    floordiv = "//"

    def _operand(self, expr) -> str:
        """An operand of ``//`` or ``%``: parenthesised unless it is one symbol or number (a
        symbolic size such as ``2*s0`` must not bind to the operator)."""
        text = self._print(expr)
        return text if expr.is_Atom or expr.func in (FloorDiv, ModularIndexing) else f"({text})"

    def _base(self, expr) -> str:
        """The left operand of ``//`` or ``%``: a sum needs parentheses (a product does not)."""
        text = self._print(expr)
        return f"({text})" if expr.is_Add else text

    def _print_Pow(self, expr):
        """``s0**2`` (a product of symbolic sizes) as ``s0*s0``: Triton has no ``**`` on integers."""
        base, exp = expr.args
        if exp.is_Integer and int(exp) > 0:
            return "*".join([self._operand(base)] * int(exp))
        return super()._print_Pow(expr)

    def _print_Mul(self, expr):
        """A size with a fractional coefficient (``s0*s1/2``: the ShapeEnv knows the product is even)
        is an exact integer division, not a float."""
        coeff, rest = expr.as_coeff_Mul()
        if coeff.is_Rational and not coeff.is_Integer:
            return f"({self._base(coeff.p * rest)} {self.floordiv} {coeff.q})"
        return super()._print_Mul(expr)

    def _print_Mod(self, expr):
        """sympy's ``Mod`` and torch's ``PythonMod`` (sizes from the ShapeEnv): Python's ``%``."""
        base, mod = expr.args
        return f"({self._base(base)} % {self._operand(mod)})"

    _print_PythonMod = _print_Mod

    def _print_Max(self, expr):
        """``Max``/``Min`` of sizes the ShapeEnv cannot order (a strided convolution's output strides,
        ``Max(1, (h - k)//2 + 1)``): Python's ``max``/``min``, which Triton also takes on scalars."""
        return f"max({', '.join(self._print(a) for a in expr.args)})"

    def _print_Min(self, expr):
        return f"min({', '.join(self._print(a) for a in expr.args)})"

    def _print_FloorDiv(self, expr):
        base, div = expr.args
        return f"({self._base(base)} {self.floordiv} {self._operand(div)})"

    def _print_ModularIndexing(self, expr):
        base, mod = expr.args
        return f"({self._base(base)} % {self._operand(mod)})"


def pexpr(expr) -> str:
    """Print an index expression for Python/Triton source."""
    if type(expr) is int:
        return str(expr)
    return _print_index(sympy.sympify(expr))


@functools.lru_cache(maxsize=16384)
def _print_index(expr: sympy.Expr) -> str:
    """One printing per expression: a graph's kernels print the same indices again and again,
    and sympy's printer orders an ``Add``'s terms each time."""
    return IndexPrinter().doprint(expr)


def host_expr(expr) -> str:
    """Print a size expression for host Python code (the wrapper): sizes, strides, grids, launch
    arguments. The same text as in a Triton kernel; named apart because it runs on the host."""
    return pexpr(expr)


def tuple_source(xs) -> str:
    """``(8, s0)``: a tuple of sizes (ints or symbolic expressions) as Python source."""
    xs = [host_expr(x) for x in xs]
    return f"({', '.join(xs)}{',' if len(xs) == 1 else ''})"
