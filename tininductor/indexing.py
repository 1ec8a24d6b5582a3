"""Index expressions: sympy with two integer helpers, and printers for generated code.

Every load and store in the IR names a buffer and a *flat* index: a sympy expression over
the loop variables, ``offset + sum(var_i * stride_i)``. Views, broadcasting and strides all
become arithmetic here. Shapes are static (concrete ints), so every expression is a
polynomial in the loop variables plus ``FloorDiv`` / ``ModularIndexing`` where a flat
counter is split back into dimensions.
"""
from __future__ import annotations

import math
from typing import Sequence

import sympy
from sympy.printing.precedence import PRECEDENCE
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


def sym(name: str) -> sympy.Symbol:
    """A non-negative integer loop variable."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


def contiguous_strides(size: Sequence[int]) -> list[int]:
    """Row-major strides for ``size`` (what ``torch.empty(size).stride()`` returns)."""
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(int(s), 1)
    return list(reversed(strides))


def unflatten(flat: sympy.Expr, sizes: Sequence[int]) -> list[sympy.Expr]:
    """Split a flat row-major counter over ``sizes`` into one expression per dimension.

    Size-1 dimensions get 0, the outermost dimension needs no modulus (the counter never
    exceeds the product), the innermost no division.
    """
    out: list[sympy.Expr] = []
    divisor = 1
    sizes = [int(s) for s in sizes]
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


def prod(xs) -> int:
    return math.prod(int(x) for x in xs)


class IndexPrinter(StrPrinter):
    """Prints index expressions as Python/Triton integer arithmetic (``//``, ``%``).

    The C++ backend can subclass it (``/`` for FloorDiv on unsigned/non-negative ints).
    """

    floordiv = "//"

    def _operands(self, expr) -> tuple[str, str]:
        """Both operands of ``//`` / ``%``, parenthesized where needed: those bind as tightly
        as ``*``, so ``(x1 + 4) // 4`` printed bare would be ``x1 + (4 // 4)``."""
        base, div = expr.args
        level = PRECEDENCE["Mul"]
        return self.parenthesize(base, level, strict=True), self.parenthesize(div, level)

    def _print_FloorDiv(self, expr):
        base, div = self._operands(expr)
        return f"({base} {self.floordiv} {div})"

    def _print_ModularIndexing(self, expr):
        base, mod = self._operands(expr)
        return f"({base} % {mod})"


def pexpr(expr) -> str:
    """Print an index expression for Python/Triton source."""
    return IndexPrinter().doprint(sympy.sympify(expr))
