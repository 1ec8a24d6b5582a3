# GENERATED from solutions/ch08_triton.py by `python -m course.exercises`: edit the marked parts.
"""Chapter 8: a small Triton backend for tininductor's kernels.

``MiniTritonKernel`` turns one ``FusedGroup`` (a pointwise kernel or a *persistent* row
reduction, see scheduler.py) into a ``@triton.jit`` function by running the nodes' bodies
with itself installed as the ``ops`` handler. ``use_mini_backend(MiniTritonScheduling)``
(``course/chapters/ch08_triton.py``) registers it in place of the package's Triton backend, so
``compile_fx`` generates, loads and launches *your* kernels; on CPU they run in the Triton
interpreter (``TRITON_INTERPRET=1``).

* Exercise 8.1 ``triton_op_strings``: the op -> Triton format-string table;
* Exercise 8.2 ``mask_for`` / ``masked_load`` / ``masked_store``: the memory lines;
* Exercise 8.3 ``MiniTritonKernel.reduction``: a persistent row reduction;
* Exercise 8.4 ``launch_config``: block sizes, ``num_warps`` and the grid.

Looped reductions (rows longer than ``PERSISTENT_MAX``) go to the package's backend.
"""
from __future__ import annotations

import math

import sympy
import torch

from tininductor.codegen.common import CSE, GeneratedKernel, IndentedBuffer, next_power_of_2
from tininductor.indexing import pexpr
from tininductor.scheduler import FusedGroup, iteration_vars
from tininductor.virtualized import V

#: rows up to this many elements are reduced in registers (one block holds the whole row)
PERSISTENT_MAX = 1024
#: the register budget of one program: XBLOCK * RBLOCK elements at most
MAX_BLOCK_ELEMENTS = 4096

TRITON_TYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

#: reduction type -> (identity, how to reduce a [XBLOCK, RBLOCK] block along axis 1)
REDUCTIONS = {
    "sum": ("0", "tl.sum({0}, 1)"),
    "prod": ("1", "triton_helpers.prod2({0}, 1)"),
    "max": ("-inf", "triton_helpers.max2({0}, 1)"),
    "min": ("inf", "triton_helpers.min2({0}, 1)"),
}


# --------------------------------------------------------------------------- Exercise 8.1


def triton_op_strings() -> dict[str, str]:
    """Format strings for these ops: ``add sub mul truediv neg exp sqrt sin relu maximum lt where``.

    ``{0}``, ``{1}``, ``{2}`` are the operands (names of earlier temporaries like ``tmp3``,
    or literals like ``2.0``). Use Triton's ``tl.*`` functions (``tl.exp``, ``tl.sqrt``,
    ``tl.sin``, ``tl.where``) or plain Python operators; ``relu`` and ``maximum`` may use
    ``triton_helpers.maximum(a, b)`` (NaN-propagating, like eager) or ``tl.maximum``.
    Example: ``"add": "{0} + {1}"``.
    """
    raise NotImplementedError("Exercise 8.1: Triton expressions for the listed ops; checked in generated kernels against eager, ties and operand order included (notebook 08, Exercise 8.1). Stuck? course.hint('8.1')")


#: the ops the exercise does not cover come from the package's table
def _package_op_strings() -> dict[str, str]:
    from tininductor.codegen.triton import TritonOverrides

    return dict(TritonOverrides.ops)


# --------------------------------------------------------------------------- Exercise 8.2


def mask_for(index: sympy.Expr) -> str | None:
    """The mask a load/store at ``index`` needs: ``"xmask"``, ``"rmask"``, ``"xmask & rmask"`` or None.

    ``index`` is a sympy expression over the kernel's index variables; their names start
    with ``x`` (``x0``, ``x1``, ``xindex``: positions along the rows) or ``r`` (``r0``,
    ``rindex``: along the reduced dimension). An index that uses x-variables needs
    ``xmask``, one that uses r-variables needs ``rmask``; a constant index needs no mask.
    """
    raise NotImplementedError("Exercise 8.2: the mask an index needs; checked on symbols and in masked kernels (notebook 08, Exercise 8.2). Stuck? course.hint('8.2')")


def masked_load(ptr: str, index: str, mask: str | None) -> str:
    """The Triton expression loading ``ptr`` at ``index`` (already printed), masked when ``mask``.

    Masked-off lanes must not touch memory and read as 0 (``other=0``). Example:
    ``masked_load("in_ptr0", "x0 + 8*x1", "xmask")`` -> ``"tl.load(in_ptr0 + (x0 + 8*x1), xmask, other=0)"``.
    """
    raise NotImplementedError("Exercise 8.2: the masked load expression; checked as text and in masked kernels (notebook 08, Exercise 8.2). Stuck? course.hint('8.2')")


def masked_store(ptr: str, index: str, value: str, mask: str | None) -> str:
    """The Triton statement storing ``value`` to ``ptr`` at ``index``, masked when ``mask``.

    Example: ``masked_store("out_ptr0", "x0", "tmp3", "xmask")`` -> ``"tl.store(out_ptr0 + (x0), tmp3, xmask)"``.
    """
    raise NotImplementedError("Exercise 8.2: the masked store statement; checked as text and in masked kernels (notebook 08, Exercise 8.2). Stuck? course.hint('8.2')")


# --------------------------------------------------------------------------- Exercise 8.4


def launch_config(numel: int, rnumel: int, is_reduction: bool) -> tuple[int, int, int, int]:
    """``(XBLOCK, RBLOCK, num_warps, grid)`` for a kernel over ``numel`` rows of ``rnumel``.

    Rules the generated kernels rely on:

    * ``XBLOCK`` and ``RBLOCK`` are powers of two (``tl.arange`` needs them), ``RBLOCK == 1``
      for a pointwise kernel and ``RBLOCK >= rnumel`` for a persistent reduction;
    * one program holds at most ``MAX_BLOCK_ELEMENTS`` (``XBLOCK * RBLOCK``) values, and
      pointwise blocks are at most 1024 wide; no block much larger than the work;
    * ``grid`` programs cover every row: ``grid * XBLOCK >= numel``;
    * ``num_warps`` (1, 2, 4 or 8): about one warp (32 threads) per 256 elements of a block.

    ``next_power_of_2(n)`` is available.
    """
    raise NotImplementedError("Exercise 8.4: a launch configuration that follows the listed rules; checked rule by rule and in kernels (notebook 08, Exercise 8.4). Stuck? course.hint('8.4')")


# --------------------------------------------------------------------------- the kernel


def reduction_init(reduction_type: str, dtype: torch.dtype) -> str:
    """The identity of a reduction as Triton source (``float("-inf")`` for a float max...)."""
    init = REDUCTIONS[reduction_type][0]
    if init in ("inf", "-inf"):
        if dtype.is_floating_point:
            return f'float("{init}")'
        info = torch.iinfo(dtype)
        return str(info.max if init == "inf" else info.min)
    return init


def constant_repr(value, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return str(bool(value))
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value) or math.isinf(value):
            return f'float("{value}")'
        return repr(value)
    return repr(int(value))


class MiniTritonKernel:
    """One FusedGroup -> one ``@triton.jit`` kernel; installed as the ``ops`` handler meanwhile.

    Every op appends a line ``tmpN = <expr>`` to ``self.body`` (``self.generate(expr)``,
    common-subexpression eliminated) and returns the name ``tmpN``.
    """

    def __init__(self, group: FusedGroup, name: str):
        self.group = group
        self.name = name
        self.is_reduction = group.is_reduction
        self.op_strings = {**_package_op_strings(), **triton_op_strings()}
        self.cse = CSE("tmp")
        self.body = IndentedBuffer()
        self.index_defs = IndentedBuffer()
        self.index_vars: dict[sympy.Expr, sympy.Symbol] = {}
        self.in_args: dict[str, str] = {}  # buffer name -> in_ptrN
        self.out_args: dict[str, str] = {}  # buffer name -> out_ptrN
        self.literals: set[str] = set()

    def generate(self, expr: str) -> str:
        """``tmpN = expr`` (once per distinct expression); returns ``tmpN``."""
        return self.cse.generate(self.body, expr)

    # ---------------------------------------------------------------- index variables

    def name_index(self, expr: sympy.Expr) -> sympy.Expr:
        """``xindex // 8 % 4`` becomes a named variable ``x1`` (defined once at the top)."""
        if expr.is_Integer:
            return expr
        if expr not in self.index_vars:
            prefix = "r" if any(s.name == "rindex" for s in expr.free_symbols) else "x"
            count = sum(1 for s in self.index_vars.values() if s.name[0] == prefix)
            symbol = sympy.Symbol(f"{prefix}{count}", integer=True, nonnegative=True)
            self.index_vars[expr] = symbol
            self.index_defs.writeline(f"{symbol} = {pexpr(expr)}")
        return self.index_vars[expr]

    def pointer(self, name: str, output: bool) -> str:
        if name in self.out_args:
            return self.out_args[name]
        table, prefix = (self.out_args, "out_ptr") if output else (self.in_args, "in_ptr")
        return table.setdefault(name, f"{prefix}{len(table)}")

    # ---------------------------------------------------------------- the ops handler

    def __getattr__(self, op):
        if op in self.op_strings:
            fmt = self.op_strings[op]
            return lambda *args: self.generate(fmt.format(*args))
        raise AttributeError(f"MiniTritonKernel has no op {op!r}")

    def constant(self, value, dtype):
        text = constant_repr(value, dtype)
        self.literals.add(text)
        return text

    def index_expr(self, expr, dtype):
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return self.constant(int(expr), dtype)
        return self.generate(f"({pexpr(expr)}).to({TRITON_TYPES[dtype]})")

    def to_dtype(self, x, dtype):
        if x in self.literals:
            return self.generate(f"tl.full([1], {x}, {TRITON_TYPES[dtype]})")
        return self.generate(f"{x}.to({TRITON_TYPES[dtype]})")

    def load(self, name, index):
        index = sympy.expand(index)
        key = ("load", name, index)
        if key in self.cse.cache:  # stored earlier in this kernel: reuse the register
            return self.cse.cache[key]
        line = masked_load(self.pointer(name, output=False), pexpr(index), mask_for(index))
        return self.cse.generate(self.body, line, key=key)

    def store(self, name, index, value):
        index = sympy.expand(index)
        self.cse.cache[("load", name, index)] = value
        if name in self.group.internal:  # nobody outside this kernel reads it
            return None
        self.body.writeline(masked_store(self.pointer(name, output=True), pexpr(index), value, mask_for(index)))
        return None

    def reduction(self, dtype, src_dtype, reduction_type, value):
        """Reduce ``value`` (an ``[XBLOCK, RBLOCK]`` block) along the row; return a ``[XBLOCK, 1]`` temporary.

        Lanes outside the tensor (``xmask & rmask`` false) must not count: replace them by
        the reduction's identity ``reduction_init(reduction_type, src_dtype)`` with
        ``tl.where`` first. Then reduce along axis 1 with ``REDUCTIONS[reduction_type][1]``
        (``tl.sum(block, 1)``...) and keep a column, ``[:, None]``, so the result broadcasts
        against the block in later nodes (softmax divides every element by its row's sum).
        Use ``self.generate(expr)`` for each step.
        """
        raise NotImplementedError("Exercise 8.3: a persistent row reduction that ignores lanes outside the tensor and broadcasts like eager; checked on sums, max, min, softmax and layer_norm (notebook 08, Exercise 8.3). Stuck? course.hint('8.3')")

    # ---------------------------------------------------------------- assembling the kernel

    def codegen(self) -> GeneratedKernel:
        group = self.group
        with V.set_ops_handler(self):
            for node in group.nodes:
                self.body.writeline(f"# {node.get_name()}: {group.kind(node)} node from {', '.join(node.origins)}")
                index, rindex = iteration_vars(node, group.kind(node), group.numel, group.rnumel)
                node.store_body([self.name_index(e) for e in index], [self.name_index(e) for e in rindex])
        params = list(self.in_args.values()) + list(self.out_args.values()) + ["xnumel"]
        params += ["rnumel"] if self.is_reduction else []
        params += ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if self.is_reduction else [])
        code = IndentedBuffer()
        code.writeline("@triton.jit")
        code.writeline(f"def {self.name}({', '.join(params)}):")
        with code.indent():
            code.writeline(f"# source nodes: {', '.join(dict.fromkeys(o for n in group.nodes for o in n.origins))}")
            code.writeline("xoffset = tl.program_id(0) * XBLOCK  # first row of this program")
            if self.is_reduction:
                code.writeline("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]  # a column of rows")
                code.writeline("xmask = xindex < xnumel")
                code.writeline("rindex = tl.arange(0, RBLOCK)[None, :]  # the whole row at once")
                code.writeline("rmask = rindex < rnumel")
            else:
                code.writeline("xindex = xoffset + tl.arange(0, XBLOCK)")
                code.writeline("xmask = xindex < xnumel")
            code.splice(self.index_defs)
            code.splice(self.body)
        xblock, rblock, warps, grid = launch_config(group.numel, group.rnumel, self.is_reduction)
        sizes = [str(group.numel)] + ([str(group.rnumel)] if self.is_reduction else [])
        consts = f"XBLOCK={xblock}" + (f", RBLOCK={rblock}" if self.is_reduction else "")
        name = self.name

        def launch(arg_refs):
            return f"{name}[({grid},)]({', '.join(arg_refs + sizes)}, {consts}, num_warps={warps})"

        origins = [o for n in group.nodes for o in n.origins]
        return GeneratedKernel(name, code.getvalue(), list(self.in_args) + list(self.out_args),
                               set(self.out_args), launch, origins)


class MiniTritonScheduling:
    """The backend entry point (see tininductor/codegen/common.py): FusedGroup -> GeneratedKernel."""

    kind = "triton"
    #: what register_backend checks against the op table: the package's strings, which cover
    #: every op (MiniTritonKernel puts Exercise 8.1's on top of them)
    op_formats = _package_op_strings()

    def codegen_kernel(self, group: FusedGroup, index: int) -> GeneratedKernel:
        if group.is_reduction and group.rnumel > PERSISTENT_MAX:
            from tininductor.codegen.triton import TritonScheduling

            return TritonScheduling().codegen_kernel(group, index)  # looped reduction: the package's
        prefix = "per" if group.is_reduction else "poi"
        ops_ = []
        for node in group.nodes:
            ops_ += [o for o in V.graph.origin_ops(node.origins) if o not in ops_]
        name = f"triton_{prefix}_fused_{'_'.join(ops_[:4]) or 'kernel'}_{index}"
        return MiniTritonKernel(group, name).codegen()

    @staticmethod
    def header() -> str:
        return "import triton\nimport triton.language as tl\nfrom tininductor.codegen import triton_helpers\n"

