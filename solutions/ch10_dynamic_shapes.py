"""Chapter 10: dynamic shapes — sizes as symbols, guards as relations, kernels that take sizes.

Small versions of four pieces of torch.compile's dynamic shapes, on sympy (the library torch's
own ``ShapeEnv`` and Inductor's indexing are built on):

* a ``ShapeEnv``: a symbol per size, 0/1 specialisation, duck sizing, and the guards that a
  branch on a size records (Exercise 10.1);
* size propagation over symbols: broadcasting, ``view(-1)`` (Exercise 10.2);
* the recompile policy: automatic dynamic, ``dynamic=True/False``, ``mark_dynamic`` (Exercise 10.3);
* index expressions over symbols, and a kernel whose sizes are arguments (Exercise 10.4).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import sympy

from course.chapters.ch10_dynamic_shapes import pexpr  # a sympy expression as Python source (guards, indices)

# ---- 1. symbols for sizes, and the guards on them ----------------------------------------------------


class ShapeEnv:
    """The symbols of one compile: each size's example value and where it was read, and the guards.

    Mirrors ``torch.fx.experimental.symbolic_shapes.ShapeEnv``: ``create_symbol`` hands out ``s0``,
    ``s1``... (0 and 1 stay constants: *0/1 specialisation*; with ``duck_shape`` two sizes with
    the same example value get one symbol: *duck sizing*), ``evaluate_expr`` answers a question
    about sizes and records the answer as a guard, ``produce_guards`` writes the guards as
    Python over the sources (``L['x'].size()[0]``), for the check function of chapter 3.
    """

    def __init__(self, duck_shape: bool = True):
        self.duck_shape = duck_shape
        self.var_to_val: dict[sympy.Symbol, int] = {}
        self.var_to_sources: dict[sympy.Symbol, list[str]] = {}
        self.guards: list[sympy.Basic] = []

    def create_symbol(self, val: int, source: str) -> sympy.Expr:
        """The size ``val`` read from ``source`` as a symbol (or as the constant, for 0 and 1)."""
        if val in (0, 1):
            return sympy.Integer(val)
        if self.duck_shape:
            for symbol, seen in self.var_to_val.items():
                if seen == val:
                    self.var_to_sources[symbol].append(source)
                    return symbol
        symbol = sympy.Symbol(f"s{len(self.var_to_val)}", integer=True, positive=True)
        self.var_to_val[symbol] = val
        self.var_to_sources[symbol] = [source]
        return symbol

    def create_sizes(self, name: str, sizes: Sequence[int], dims: Iterable[int] | None = None) -> tuple:
        """Symbolic sizes of the tensor ``L[name]``: the dims in ``dims`` (default all) get symbols."""
        dims = range(len(sizes)) if dims is None else set(dims)
        return tuple(self.create_symbol(n, f"L['{name}'].size()[{i}]") if i in dims else sympy.Integer(n)
                     for i, n in enumerate(sizes))

    def size_hint(self, expr) -> int:
        """The example value of a size expression."""
        return int(sympy.sympify(expr).xreplace(self.var_to_val))

    def evaluate_expr(self, expr) -> bool:
        """The truth of ``expr`` (a relation over symbols) at the example sizes; records it as a guard.

        The compiled code is only right for sizes where the question has the same answer, so what
        holds now (``expr``, or its negation) is appended to ``self.guards`` once. A question
        with no symbols left in it (constants, or settled by the symbols' assumptions) needs no guard.
        """
        # BEGIN SOLUTION (Exercise 10.1: answer a question about sizes at the example values and record what must stay true; checked on branches both ways, equalities, constants and repeats (notebook 10, section 2))
        expr = sympy.sympify(expr)
        value = bool(expr.xreplace(self.var_to_val))
        if expr.free_symbols:
            guard = expr if value else sympy.Not(expr)
            if guard not in self.guards:
                self.guards.append(guard)
        return value
        # END SOLUTION

    def produce_guards(self) -> list[str]:
        """Every guard as Python over the sources, in this order: a duck-sized symbol's other sources
        equal its first (``L['y'].size()[0] == L['x'].size()[0]``); each symbol at least 2
        (``2 <= L['x'].size()[0]``: 0 and 1 were specialised); then the recorded guards, each symbol
        written as its first source."""
        # BEGIN SOLUTION (Exercise 10.1: the guard strings; checked by the strings and by running them on inputs that must pass and fail (notebook 10, section 2))
        names = {symbol: sympy.Symbol(sources[0]) for symbol, sources in self.var_to_sources.items()}
        out = [f"{other} == {sources[0]}" for sources in self.var_to_sources.values() for other in sources[1:]]
        out += [f"2 <= {sources[0]}" for sources in self.var_to_sources.values()]
        out += [pexpr(guard.xreplace(names)) for guard in self.guards]
        return out
        # END SOLUTION


# ---- 2. sizes of results, over symbols -----------------------------------------------------------


def broadcast_shapes(a: Sequence, b: Sequence, guards: list) -> tuple:
    """The broadcast of two shapes whose sizes are ints or sympy expressions (aligned on the right).

    A dim of size 1 takes the other's size. Two sizes that must be equal but are different
    expressions (``s0`` and ``s1``, or ``s0`` and 5) put ``Eq`` of them in ``guards`` and the dim
    takes the constant if there is one. Two different constants raise ``ValueError``, as eager.
    0/1 specialisation is what makes this simple: a symbol is never 1, so no case splits on it.
    """
    # BEGIN SOLUTION (Exercise 10.2: broadcast two symbolic shapes, recording the equalities it needs; checked on ranks, 1s, symbols and constants (notebook 10, section 3))
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = sympy.sympify(a[-i]) if i <= len(a) else sympy.Integer(1)
        y = sympy.sympify(b[-i]) if i <= len(b) else sympy.Integer(1)
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif x.is_number and y.is_number:
            raise ValueError(f"shapes {tuple(a)} and {tuple(b)} do not broadcast: {x} vs {y} at dim {-i}")
        else:
            guards.append(sympy.Eq(x, y))
            out.append(y if y.is_number else x)
    return tuple(reversed(out))
    # END SOLUTION


def view_shape(numel, shape: Sequence) -> tuple:
    """The sizes of ``x.view(*shape)`` for an ``x`` of ``numel`` elements, with one ``-1`` inferred.

    ``numel`` and the sizes may be sympy expressions: ``view_shape(s0*s1*4, (s0, -1))`` is
    ``(s0, 4*s1)``. Raises ``ValueError`` for two ``-1``, or when the sizes cannot hold exactly
    ``numel`` elements for every value of the symbols.
    """
    # BEGIN SOLUTION (Exercise 10.2: infer the -1 of a view over symbols; checked on symbols, constants, and views that must be refused (notebook 10, section 3))
    shape = [sympy.sympify(s) for s in shape]
    numel = sympy.sympify(numel)
    holes = [i for i, s in enumerate(shape) if s == -1]
    if len(holes) > 1:
        raise ValueError(f"view{tuple(shape)}: only one dimension can be -1")
    known = sympy.Mul(*[s for s in shape if s != -1])
    if not holes:
        if sympy.simplify(known - numel) != 0:
            raise ValueError(f"view{tuple(shape)} holds {known} elements, not {numel}")
        return tuple(shape)
    inferred = sympy.simplify(numel / known)
    if sympy.fraction(sympy.together(inferred))[1] != 1:
        raise ValueError(f"view{tuple(shape)}: {numel} elements do not split into rows of {known}")
    shape[holes[0]] = inferred
    return tuple(shape)
    # END SOLUTION


# ---- 3. the recompile policy ---------------------------------------------------------------------


def update_frame_state(state: list | None, sizes: Sequence[int]) -> list:
    """Automatic dynamic's memory of one tensor input, updated at each compile of the frame.

    ``state`` is ``None`` before the first compile, then per dim the size seen so far, or
    ``None`` once that dim has had two different sizes (it is dynamic from then on). A change
    of rank makes every dim dynamic.
    """
    # BEGIN SOLUTION (Exercise 10.3: remember which dims changed between compiles; checked on first calls, changes, repeats and rank changes (notebook 10, section 4))
    if state is None:
        return list(sizes)
    if len(state) != len(sizes):
        return [None] * len(sizes)
    return [old if old == new else None for old, new in zip(state, sizes)]
    # END SOLUTION


def symbolic_dims(state: list, sizes: Sequence[int], dynamic: bool | None, marked: Iterable[int] = ()) -> list[int]:
    """The dims that get a symbol when the frame compiles for ``sizes``.

    ``dynamic=True``: every dim; ``dynamic=None`` (the default): the dims ``state`` marks as
    changed; any setting: the dims ``mark_dynamic`` marked. Sizes 0 and 1 are always
    specialised (no symbol), whatever asked for one.
    """
    # BEGIN SOLUTION (Exercise 10.3: which dims become symbols under dynamic=None/True/False and mark_dynamic; checked against torch.compile's compile counts (notebook 10, section 4))
    marked = set(marked)
    dims = []
    for i, n in enumerate(sizes):
        if n in (0, 1):
            continue
        if dynamic is True or i in marked or (dynamic is None and state[i] is None):
            dims.append(i)
    return dims
    # END SOLUTION


# ---- 4. index expressions over symbols (course/chapters' pointwise_kernel puts them in a kernel) ------


XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)


def contiguous_strides(sizes: Sequence) -> tuple:
    """Strides of a contiguous tensor of ``sizes`` (ints or sympy expressions), innermost 1."""
    # BEGIN SOLUTION (Exercise 10.4: contiguous strides over symbols; checked on symbolic, constant and mixed sizes (notebook 10, section 5))
    strides, running = [], sympy.Integer(1)
    for size in reversed(sizes):
        strides.append(running)
        running = running * size
    return tuple(reversed(strides))
    # END SOLUTION


def broadcast_index(out_sizes: Sequence, in_sizes: Sequence, xindex=XINDEX) -> sympy.Expr:
    """The offset, into a contiguous input of ``in_sizes`` broadcast to ``out_sizes``, of the
    element that output element ``xindex`` (a flat index) reads.

    The output coordinate of dim ``d`` is ``xindex // stride_d``, taken modulo ``size_d`` except
    for the outermost dim (``xindex < numel`` already bounds it, as Inductor's indexing knows).
    Input dims align on the right; an input dim of size 1 (or missing) contributes nothing. An
    input of the output's own sizes is read at ``xindex`` itself.
    """
    # BEGIN SOLUTION (Exercise 10.4: the flat offset an input is read at, over symbols; checked by running one generated kernel at many sizes against eager (notebook 10, section 5))
    if tuple(map(sympy.sympify, in_sizes)) == tuple(map(sympy.sympify, out_sizes)):
        return xindex
    out_strides = contiguous_strides(out_sizes)
    in_strides = contiguous_strides(in_sizes)
    lead = len(out_sizes) - len(in_sizes)
    offset = sympy.Integer(0)
    for d, (size, stride) in enumerate(zip(out_sizes, out_strides)):
        j = d - lead
        if j < 0 or in_sizes[j] == 1:
            continue
        coordinate = sympy.floor(xindex / stride)
        if d > 0:
            coordinate = sympy.Mod(coordinate, size)
        offset += coordinate * in_strides[j]
    return offset
    # END SOLUTION
