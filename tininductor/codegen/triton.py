"""Triton code generation: one FusedGroup -> one ``@triton.jit`` kernel.

Three kernel shapes:

* pointwise (``triton_poi_*``): a 1-D block of ``XBLOCK`` elements per program, masked
  with ``xmask = xindex < xnumel``;
* persistent reduction (``triton_per_*``): ``XBLOCK`` rows per program, the whole row
  (``RBLOCK >= rnumel``) in registers, reductions are ``tl.sum(..., 1)``;
* looped reduction (``triton_red_*``): rows too long for registers are walked in
  ``RBLOCK`` chunks, accumulating into ``[XBLOCK, RBLOCK]`` accumulators. A row sum gets one
  row per program (``XBLOCK = 1``); a long column sum (a bias gradient: the reduced elements
  are strided, the kept ones contiguous) gets a tile of 16-64 neighbouring columns, so that
  every row of the tile is one contiguous load.

The body is produced by running each node's ``inner_fn`` with ``TritonKernel`` installed as
the ``ops`` handler; ``TritonOverrides`` holds the op -> Triton format strings. Each op
result becomes a CSE'd temporary (``tmp3 = tmp1 + tmp2``). A load of a buffer this kernel
already stored at the same index reuses the stored value (that is what makes fusion pay).

Dynamic shapes: when sizes are symbols (``s0``), a kernel takes ``xnumel``/``rnumel`` and every
size symbol its index expressions use as runtime arguments, and the wrapper computes its grid
per call (``launcher.run_grid(grid, ...)``). A symbolic pointwise size gets ``XBLOCK =
max_xblock``, masked. A symbolic reduction size gets two kernels, chosen per call from the
actual row length: a persistent one whose ``RBLOCK`` (the row rounded up to a power of two) and
``XBLOCK`` are picked at launch (``launcher.run_rows``: one compiled variant per power of two),
used up to ``persistent_reduction_max``, and a looped one beyond. A static reduction size keeps
the static choice. One module serves every size.
"""
from __future__ import annotations

import math
import os
import re
from typing import Any, Callable

import sympy
import torch

# Without CUDA the generated kernels can only run in Triton's interpreter, which must be on before
# triton is first imported (triton.language's own @jit helpers are decorated at import).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from .. import config, ops_table
from ..indexing import FloorDiv, ModularIndexing, host_expr, is_static, join_dimensions, pexpr
from ..runtime.index_check import ASSERT_MESSAGE
from ..runtime.triton_launcher import compile_early
from ..scheduler import FusedGroup, iteration_vars
from ..virtualized import V
from .common import CSE, GeneratedKernel, IndentedBuffer, next_power_of_2, register_backend

TRITON_TYPES = {
    torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
    torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}


def triton_type(dtype: torch.dtype) -> str:
    if dtype not in TRITON_TYPES:
        raise NotImplementedError(f"dtype {dtype} has no Triton type here")
    return TRITON_TYPES[dtype]


class TritonOverrides:
    """op name -> Triton expression format string (operands are CSE'd names or literals).

    PyTorch's inductor has a class of that name with one method per op; here the strings come
    from the op table (ops_table.py).
    """

    #: op -> format string, from the op table (ops_table.py); a dict the course may patch
    ops = ops_table.formats("triton")

    #: reduction type -> (initial value, combine format, final reduction over axis 1)
    reductions = {
        "sum": ("0", "{0} + {1}", "tl.sum({0}, 1)"),
        "prod": ("1", "{0} * {1}", "triton_helpers.prod2({0}, 1)"),
        "max": ("-inf", "triton_helpers.maximum({0}, {1})", "triton_helpers.max2({0}, 1)"),
        "min": ("inf", "triton_helpers.minimum({0}, {1})", "triton_helpers.min2({0}, 1)"),
    }


def constant_repr(value, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return str(bool(value))
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return repr(int(value))


def reduction_init(rtype: str, dtype: torch.dtype) -> str:
    init = TritonOverrides.reductions[rtype][0]
    if init in ("inf", "-inf"):
        if dtype.is_floating_point:
            return f'float("{init}")'
        info = torch.iinfo(dtype)
        bound = info.max if init == "inf" else info.min
        # an int64 bound is no int32 literal: typed, or Triton narrows it to the other operand's int32
        return f"tl.full([], {bound}, tl.int64)" if dtype == torch.int64 else str(bound)
    return init


def _used(defs: list[str], body: str) -> list[str]:
    """The ``name = expr`` lines of ``defs`` whose name ``body`` uses (a joined index may leave some unused)."""
    return [line for line in defs if re.search(rf"\b{line.split(' = ', 1)[0]}\b", body)]


def masked_load(ptr: str, index: str, mask: str | None) -> str:
    """``tl.load`` of ``ptr`` at ``index`` (printed); masked-off lanes touch no memory and read 0."""
    return f"tl.load({ptr} + ({index}){f', {mask}, other=0' if mask else ''})"


def masked_store(ptr: str, index: str, value: str, mask: str | None) -> str:
    """``tl.store`` of ``value`` to ``ptr`` at ``index`` (printed), only in the lanes ``mask`` keeps."""
    return f"tl.store({ptr} + ({index}), {value}{f', {mask}' if mask else ''})"


class TritonKernel:
    """Generates one kernel; installed as the ``ops`` handler while node bodies run."""

    def __init__(self, group: FusedGroup, name: str, persistent: bool | None = None,
                 keep_in_registers: set | None = None):
        self.group = group
        self.name = name
        self.is_reduction = group.is_reduction
        self.persistent = is_persistent(group) if persistent is None else persistent
        #: persistent over a symbolic row length: RBLOCK/XBLOCK chosen per call (launcher.run_rows)
        self.rows_per_call = self.persistent and not is_static(group.rnumel)
        self.cse = CSE("tmp")
        self.in_args: dict[str, str] = {}  # buffer -> pointer argument
        self.out_args: dict[str, str] = {}
        self.stored: set[str] = set()
        self.keep_in_registers: set[str] = set(group.internal if keep_in_registers is None else keep_in_registers)
        self.range_vars: dict[sympy.Expr, sympy.Symbol] = {}
        self.x_defs: list[str] = []  # "x0 = xindex // 16" lines, written out where a body uses them
        self.r_defs: list[str] = []
        self.body = IndentedBuffer()  # where ops go right now
        self.pre = IndentedBuffer()  # accumulator set-up before the current loop
        self.post = IndentedBuffer()  # reduction results after the current loop
        self.post_vars: set[str] = set()
        self.literals: set[str] = set()
        self.in_loop = False
        self.checks_indices = False  # a tl.device_assert bounds check: compile with debug=True
        self.load_masks: list[str] = []  # the masks of the ``ops.masked`` bodies being generated
        self.graph_symbols = set(getattr(V.graph, "size_sources", ()))  # dynamic shapes: size symbols
        self.size_args: set = set()  # the size symbols this kernel's expressions use (its int arguments)

    def _note_sizes(self, expr) -> None:
        """Record the size symbols in ``expr``: they become kernel arguments."""
        if self.graph_symbols:
            self.size_args |= sympy.sympify(expr).free_symbols & self.graph_symbols

    # ------------------------------------------------------------- index variables

    def _range_symbol(self, expr: sympy.Expr) -> sympy.Expr:
        """Name ``xindex // 16`` once as ``x1 = xindex // 16`` and return the symbol ``x1``. An
        expression of a loaded value (``tmp3 // 232``, an indirect index) stays inline: the names
        are defined at the kernel's top, before any value is loaded."""
        if expr.is_Integer or any(s.name.startswith(self.cse.prefix) for s in expr.free_symbols):
            return expr
        if expr not in self.range_vars:
            self._note_sizes(expr)
            is_r = any(s.name == "rindex" for s in expr.free_symbols)
            prefix = "r" if is_r else "x"
            count = sum(1 for s in self.range_vars.values() if s.name[0] == prefix)
            symbol = sympy.Symbol(f"{prefix}{count}", integer=True, nonnegative=True)
            self.range_vars[expr] = symbol
            line = f"{symbol} = {pexpr(expr)}"
            if is_r:
                self.r_defs.append(line)
            else:
                self.x_defs.append(line)
        return self.range_vars[expr]

    def _simplify_index(self, index) -> sympy.Expr:
        """``index`` with dimensions it walks contiguously joined back (indexing.join_dimensions):
        ``3072*x0 + x1`` over ``x0 = xindex // 3072``, ``x1 = xindex % 3072`` is ``xindex``."""
        index = sympy.expand(index)
        if not self.range_vars:
            return index
        inverse = {symbol: expr for expr, symbol in self.range_vars.items()}
        if not index.free_symbols & inverse.keys():
            return index
        raw = sympy.expand(index.xreplace(inverse))
        joined = join_dimensions(raw)
        if joined == raw:
            return index

        def rename(e):  # name each outermost dimension again (x0, x1, ...)
            if isinstance(e, (FloorDiv, ModularIndexing)):
                return self._range_symbol(e)
            return e.func(*[rename(a) for a in e.args]) if e.args else e

        return sympy.expand(rename(joined))

    def node_vars(self, node):
        index, rindex = iteration_vars(node, self.group.kind(node), self.group.numel, self.group.rnumel)
        return [self._range_symbol(e) for e in index], [self._range_symbol(e) for e in rindex]

    def _mask(self, index: sympy.Expr) -> str | None:
        """Mask by the loop variables the index uses: ``xmask``, ``rmask``, both, or none."""
        names = {s.name[0] for s in index.free_symbols}
        if "t" in names:  # an indirect index (a tmp variable): guard by the row mask too
            names.add("x")
        return " & ".join(m for m, p in (("xmask", "x"), ("rmask", "r")) if p in names) or None

    def _arg(self, name: str, output: bool) -> str:
        """The pointer argument for buffer ``name`` (``in_ptr0``..., ``out_ptr0``...)."""
        if name in self.out_args:
            return self.out_args[name]
        if output:
            self.out_args[name] = f"out_ptr{len(self.out_args)}"
            return self.out_args[name]
        if name not in self.in_args:
            self.in_args[name] = f"in_ptr{len(self.in_args)}"
        return self.in_args[name]

    # ------------------------------------------------------------- the ops handler

    def __getattr__(self, name):
        if name in TritonOverrides.ops:
            fmt = TritonOverrides.ops[name]
            return lambda *args: self.cse.generate(self.body, fmt.format(*args))
        raise AttributeError(f"the Triton backend has no op {name!r}")

    def constant(self, value, dtype):
        text = constant_repr(value, dtype)
        if dtype == torch.float64 or (dtype == torch.int64 and not -2**31 <= int(value) < 2**31):
            # a bare literal is a float32 (an int32) to Triton: libdevice's float64 overloads (pow,
            # fmod, ...) refuse the mix, and an int64 bound (a min's identity) does not fit
            return self.cse.generate(self.body, f"tl.full([], {text}, {triton_type(dtype)})")
        self.literals.add(text)
        return text

    def index_expr(self, expr, dtype):
        expr = self._simplify_index(sympy.sympify(expr))
        if expr.is_Integer:
            return self.constant(int(expr), dtype)
        self._note_sizes(expr)
        return self.cse.generate(self.body, f"({pexpr(expr)}).to({triton_type(dtype)})")

    def indirect_indexing(self, value, size, check: bool = True):
        """Bind a loaded index to a variable usable in index expressions (wrapping negatives).

        ``check``: assert ``0 <= index < size`` in the kernel (runtime/index_check.py); lanes
        outside the range are exempt (their loads read 0 anyway).
        """
        self._note_sizes(size)
        size = pexpr(sympy.sympify(size))
        var = self.cse.generate(self.body, f"tl.where({value} < 0, {value} + {size}, {value})")
        if check:
            self.checks_indices = True
            message = ASSERT_MESSAGE.format(var=var, size=size)
            self.body.writeline(f'tl.device_assert(((0 <= {var}) & ({var} < {size})) | ~xmask, "{message}")')
        return sympy.Symbol(var, integer=True)

    def to_dtype(self, x, dtype):
        if x in self.literals:
            return self.cse.generate(self.body, f"tl.full([1], {x}, {triton_type(dtype)})")
        return self.cse.generate(self.body, f"{x}.to({triton_type(dtype)})")

    def load(self, name: str, index):
        index = self._simplify_index(index)
        key = ("load", name, index)
        if key in self.cse.cache:
            return self.cse.cache[key]
        self._note_sizes(index)
        ptr = self._arg(name, output=False)
        mask = " & ".join(m for m in [self._mask(index), *self.load_masks] if m) or None
        if self.load_masks:  # a masked load holds 0 outside its mask: not the value for other uses
            key = (*key, tuple(self.load_masks))
        return self.cse.generate(self.body, masked_load(ptr, pexpr(index), mask), key=key)

    def masked(self, mask, body, other):
        """``body()`` in the lanes where ``mask`` holds, ``other`` elsewhere; the body's loads are
        masked too, so the other lanes read no memory (a ``cat``'s input is read only in its slice)."""
        self.load_masks.append(mask)
        try:
            value = body()
        finally:
            self.load_masks.pop()
        return self.cse.generate(self.body, f"tl.where({mask}, {value}, {other})")

    def store(self, name: str, index, value, mode=None):
        """Write ``value`` at ``index``; ``mode="atomic_add"`` adds it there atomically (a scatter-add:
        several lanes may hit one place)."""
        index = self._simplify_index(index)
        if mode not in (None, "atomic_add"):
            raise NotImplementedError(f"store mode {mode!r}")
        if mode is None:
            self.cse.cache[("load", name, index)] = value
        if name in self.keep_in_registers and mode is None:
            return None
        self._note_sizes(index)
        ptr = self._arg(name, output=True)
        self.stored.add(name)
        names = {s.name[0] for s in index.free_symbols}
        offset = pexpr(index)
        if "x" not in names:  # e.g. a full reduction's single element: make the pointer a block too
            offset += " + tl.zeros_like(xindex)"
        mask = "xmask & rmask" if "r" in names else "xmask"
        target = self.post if value in self.post_vars else self.body
        if mode == "atomic_add":
            target.writeline(f"tl.atomic_add({ptr} + ({offset}), {value}, {mask}, sem='relaxed')")
        else:
            target.writeline(masked_store(ptr, offset, value, mask))
        return None

    def reduction(self, dtype, src_dtype, reduction_type, value):
        init, combine, final = TritonOverrides.reductions[reduction_type]
        init = reduction_init(reduction_type, src_dtype)
        if self.persistent:
            masked = self.cse.generate(self.body, f"tl.where(xmask & rmask, {value}, {init})")
            return self.cse.generate(self.body, f"{final.format(masked)}[:, None]")
        acc = "_" + self.cse.newvar()
        self.pre.writeline(f"{acc} = tl.full([XBLOCK, RBLOCK], {init}, {triton_type(src_dtype)})")
        self.body.writeline(f"{acc} = tl.where(xmask & rmask, {combine.format(acc, value)}, {acc})")
        result = self.cse.newvar()
        self.post.writeline(f"{result} = {final.format(acc)}[:, None]")
        self.post_vars.add(result)
        return result

    # ------------------------------------------------------------- phases

    def phases(self):
        """Loops and outer steps of the kernel body (a persistent reduction is one loop)."""
        if not self.is_reduction or self.persistent:
            return [("loop", list(self.group.nodes))]
        return self.group.loop_phases()

    def _decide_storage(self, phases) -> set[int]:
        """Buffers read in a later loop than the one that wrote them go through memory.

        Returns the loop numbers that must start with a barrier (all threads' stores done).
        """
        where: dict[str, int] = {}
        barriers = set()
        for p, (kind, nodes) in enumerate(phases):
            for node in nodes:
                for name, _ in self.group.read_writes(node).reads:
                    src = where.get(name)
                    if src is not None and src != p:
                        writer = V.graph.get_buffer(name)
                        if kind == "loop" and not (writer.is_reduction() or self.group.kind(writer) == "xonly"):
                            self.keep_in_registers.discard(name)
                            barriers.add(p)
            for node in nodes:
                where[node.get_name()] = p
        return barriers

    # ------------------------------------------------------------- generation

    def codegen(self) -> GeneratedKernel:
        group = self.group
        phases = self.phases()
        barriers = self._decide_storage(phases)
        code = IndentedBuffer()
        with V.set_ops_handler(self):
            for p, (kind, nodes) in enumerate(phases):
                looped = kind == "loop" and self.is_reduction and not self.persistent
                self.pre, self.body, self.post = IndentedBuffer(), IndentedBuffer(), IndentedBuffer()
                saved_cache = dict(self.cse.cache)
                self.in_loop = looped
                for node in nodes:
                    self.body.writeline(f"# {node.get_name()}: {group.kind(node)} node from {', '.join(node.origins)}")
                    index, rindex = self.node_vars(node)
                    node.store_body(index, rindex)
                if looped:
                    code.splice(self.pre)
                    code.writeline("for roffset in range(0, rnumel, RBLOCK):")
                    with code.indent():
                        if p in barriers:
                            code.writeline("tl.debug_barrier()  # values stored by an earlier loop")
                        code.writeline("rindex = roffset + rbase")
                        code.writeline("rmask = rindex < rnumel")
                        code.writelines(_used(self.r_defs, self.body.getvalue()))
                        code.splice(self.body)
                    code.splice(self.post)
                    # values made inside the loop are out of scope; reduction results are not
                    self.cse.cache = {**saved_cache, **{k: v for k, v in self.cse.cache.items() if v in self.post_vars}}
                else:
                    code.splice(self.body)
                self.in_loop = False
        return self._assemble(code)

    def _index_prologue(self, xblock: int, rblock: int, body: str) -> list[str]:
        """The kernel's first lines: this program's block of rows (``xindex``) and, for a
        reduction, of columns (``rindex``), with their masks."""
        group = self.group
        lines = ["xoffset = tl.program_id(0) * XBLOCK"]
        if self.is_reduction:
            lines.append("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
        else:
            lines.append("xindex = xoffset + tl.arange(0, XBLOCK)")
        # where the blocks tile the range exactly no lane is out of range: an all-true mask
        # (folded away by Triton, so loads and stores need no compare), as TorchInductor does
        shape = "[XBLOCK, 1]" if self.is_reduction else "[XBLOCK]"
        if is_static(group.numel) and group.numel % xblock == 0 and not self.rows_per_call:
            lines.append(f"xmask = tl.full({shape}, True, tl.int1)")
        else:
            lines.append("xmask = xindex < xnumel")
        if self.persistent:
            lines.append("rindex = tl.arange(0, RBLOCK)[None, :]")
            if is_static(group.rnumel) and group.rnumel == rblock:
                lines.append("rmask = tl.full([1, RBLOCK], True, tl.int1)")
            else:
                lines.append("rmask = rindex < rnumel")
            lines += _used(self.r_defs, body)
        elif self.is_reduction:
            lines.append("rbase = tl.arange(0, RBLOCK)[None, :]")
        return lines

    def _assemble(self, body: IndentedBuffer) -> GeneratedKernel:
        """The kernel's source (its ``@triton.jit`` function, then the TritonLauncher that binds its launch
        configuration) and how the wrapper calls it."""
        ordered = list(self.in_args) + list(self.out_args)
        params, symbols = self._signature(body)
        origins = [o for n in self.group.nodes for o in n.origins]
        xblock, rblock, warps = self.block_sizes()
        code = IndentedBuffer()
        self._write_jit_function(code, body, params, origins, xblock, rblock)
        dynamic, grid, size_args, consts = self._launch_config(symbols, xblock, rblock)
        ahead = self._write_launcher(code, ordered, symbols, size_args, f"grid=({1 if dynamic else grid},), "
                             f"num_warps={warps}, num_stages={config.triton.num_stages}, {consts}",
                             xblock, rblock, warps)
        source = code.getvalue()
        module = "import torch\n" + TritonScheduling.header() + source  # the kernel as a module of its own
        return GeneratedKernel(self.name, source, ordered, set(self.stored),
                               self._launch_call(dynamic, grid, size_args), origins,
                               prebuild=(lambda: compile_early(module)) if ahead else None,
                               takes_known_alignment=True)

    def _signature(self, body: IndentedBuffer) -> tuple[list[str], list]:
        """The ``@triton.jit`` function's parameters, and the size symbols among them."""
        group = self.group
        params = list(self.in_args.values()) + list(self.out_args.values()) + ["xnumel"]
        numel, rnumel = group.numel, group.rnumel
        self._note_sizes(numel)
        self._note_sizes(rnumel)
        if self.is_reduction:
            # looped kernels over a known size take rnumel as a compile-time constant (the loop
            # bound is then a plain int, as older Triton interpreters need); a symbolic one is an argument
            params += ["rnumel" if self.persistent or not is_static(rnumel) else "rnumel: tl.constexpr"]
        # the size symbols the code still names (a joined index may have dropped some): its int arguments
        text = body.getvalue()
        text += "\n".join(_used(self.x_defs, text) + _used(self.r_defs, text))
        symbols = sorted((s for s in self.size_args if re.search(rf"\b{s}\b", text)), key=str)
        params += [str(s) for s in symbols]
        params += ["XBLOCK: tl.constexpr"] + (["RBLOCK: tl.constexpr"] if self.is_reduction else [])
        return params, symbols

    def _write_jit_function(self, code: IndentedBuffer, body: IndentedBuffer, params: list[str], origins: list,
                            xblock: int, rblock: int) -> None:
        group = self.group
        code.writeline("@triton.jit(debug=True)" if self.checks_indices else "@triton.jit")
        code.writeline(f"def {self.name}({', '.join(params)}):")
        with code.indent():
            code.writeline(f"# source nodes: {', '.join(origins)}")
            code.writeline(f"# kernel: {len(group.nodes)} node(s) over numel={group.numel}"
                           + (f", rnumel={group.rnumel}" if self.is_reduction else ""))
            code.writelines(self._index_prologue(xblock, rblock, body.getvalue()))
            code.writelines(_used(self.x_defs, body.getvalue()))
            code.splice(body)

    def _launch_config(self, symbols: list, xblock: int, rblock: int) -> tuple[bool, Any, list[str], str]:
        """(dynamic size, grid, size arguments, constexpr keywords) of a launch: the sizes and grid are
        computed by the wrapper (host Python)."""
        numel, rnumel = self.group.numel, self.group.rnumel
        rnumel_static = is_static(rnumel)
        dynamic = not is_static(numel)
        grid = f"({host_expr(numel)} + {xblock - 1}) // {xblock}" if dynamic else max(1, -(-numel // xblock))
        size_args = [host_expr(numel)] + ([host_expr(rnumel)] if self.persistent or not rnumel_static else [])
        size_args += [str(s) for s in symbols]
        consts = f"XBLOCK={xblock}" + (f", RBLOCK={rblock}" if self.is_reduction else "")
        if self.is_reduction and not self.persistent and rnumel_static:
            consts = f"rnumel={rnumel}, " + consts
        if self.rows_per_call:  # XBLOCK, RBLOCK, warps and grid follow the row length, per call
            consts += f", rows_block={config.triton.max_reduction_block}"
        return dynamic, grid, size_args, consts

    def _write_launcher(self, code: IndentedBuffer, ordered: list[str], symbols: list, size_args: list[str],
                        launch_config: str, xblock: int, rblock: int, warps: int) -> bool:
        """The launch configuration is fixed now (static shapes), so the wrapper binds it once: a
        TritonLauncher skips Triton's per-call argument binding (runtime/triton_launcher.py). True
        when the launcher compiles its kernel ahead of the first launch (example arguments, no
        autotuning)."""
        numel, name = self.group.numel, self.name
        dynamic = not is_static(numel)
        code.writeline("")
        code.writeline("")
        tune = ""
        if config.triton.max_autotune and not dynamic and not symbols:
            tune = f", numel={numel},\n    autotune={self.autotune_configs(xblock, rblock, warps)}"
        checks = ", checks_indices=True" if self.checks_indices else ""
        # what the runtime arguments look like (pointer dtypes, sizes): enough to compile the
        # kernel before its first launch, alongside the graph's other kernels (TritonLauncher)
        example = [str(V.graph.get_buffer(b).get_dtype()) for b in ordered] + size_args
        # sizes unknown until the call: no compile ahead of it (Triton specialises int arguments)
        static = not symbols and is_static(self.group.rnumel) and not dynamic
        example = f",\n    example_args=({', '.join(example)},)" if static else ""
        code.writeline(f"{name} = TritonLauncher({name}, {launch_config}{checks}{tune}{example})")
        return static and not tune

    def _launch_call(self, dynamic: bool, grid, size_args: list[str]) -> Callable[[list[str]], str]:
        """``launch(arg_refs)``: the wrapper's line that launches this kernel."""
        numel, rnumel, name = self.group.numel, self.group.rnumel, self.name

        def launch(arg_refs):
            if numel == 0:
                return f"pass  # {name}: nothing to compute (numel 0)"
            if self.rows_per_call:
                return f"{name}.run_rows({host_expr(numel)}, {host_expr(rnumel)}, {', '.join(arg_refs + size_args)})"
            if dynamic:  # the grid follows the size: computed per call, in plain Python arithmetic
                return f"{name}.run_grid({grid}, {', '.join(arg_refs + size_args)})"
            return f"{name}.run({', '.join(arg_refs + size_args)})"

        return launch

    def block_sizes(self) -> tuple[int, int, int]:
        numel, rnumel = self.group.numel, self.group.rnumel
        if not is_static(numel):  # unknown row count: the blocks as for a large one
            numel = config.triton.max_xblock * config.triton.min_programs
        if not self.is_reduction:
            xblock = min(next_power_of_2(max(numel, 1)), config.triton.max_xblock)
            return xblock, 1, max(1, min(8, xblock // 256))
        if self.persistent:
            if not is_static(rnumel):  # placeholders: the launcher picks both per call (run_rows)
                return 1, 1, 1
            rblock = next_power_of_2(max(rnumel, 1))
            xblock = min(next_power_of_2(max(numel, 1)), max(1, config.triton.max_reduction_block // rblock))
            return xblock, rblock, max(1, min(8, (xblock * rblock) // 256))
        if self.group.reduction_hint == "outer":
            # Columns: a tile of XBLOCK neighbouring columns, so each row's loads are contiguous;
            # narrower tiles where that is what it takes to give every SM a program.
            xblock = 64
            while xblock > 16 and -(-numel // xblock) < config.triton.min_programs:
                xblock //= 2
            xblock = min(xblock, next_power_of_2(max(numel, 1)))
            rblock = min(next_power_of_2(rnumel) if is_static(rnumel) else config.triton.looped_rblock,
                         config.triton.looped_rblock,
                         max(1, config.triton.max_reduction_block // xblock))
            return xblock, rblock, max(1, min(8, (xblock * rblock) // 256))
        # Rows: long, so give each program one row and enough warps to keep many bytes in
        # flight; the grid then has one program per row, which fills the GPU.
        rblock = min(next_power_of_2(rnumel), config.triton.looped_rblock) if is_static(rnumel) else \
            config.triton.looped_rblock
        if not is_static(rnumel):  # unknown row length: a chunk of 1024 (a short row is masked)
            rblock = min(rblock, 1024)
        return 1, rblock, max(1, min(8, rblock // 256))

    def autotune_configs(self, xblock: int, rblock: int, warps: int) -> list[dict]:
        """Candidate launch configs for mode="max-autotune", the heuristic's first.

        Pointwise and persistent kernels vary the rows per program (XBLOCK) and the warps;
        looped reductions vary the chunk (RBLOCK) and the warps. Where the heuristic's blocks
        tile the range exactly (so the kernel has no xmask), every candidate must too.
        """
        numel, rnumel = self.group.numel, self.group.rnumel
        exact = numel % xblock == 0
        first = {"XBLOCK": xblock, **({"RBLOCK": rblock} if self.is_reduction else {}), "num_warps": warps}
        found = [first]

        def add(x: int, r: int, w: int) -> None:
            if x > next_power_of_2(numel) or (exact and numel % x) or x * r > 4 * config.triton.max_reduction_block:
                return
            candidate = {"XBLOCK": x, **({"RBLOCK": r} if self.is_reduction else {}), "num_warps": w}
            if candidate not in found:
                found.append(candidate)

        if not self.is_reduction:
            for x, w in ((256, 2), (512, 4), (1024, 4), (1024, 8), (2048, 8), (4096, 8)):
                add(x, 1, w)
        elif self.persistent:
            for x in (1, 2, 4, 8, 16, 32):
                for w in (4, 8):
                    if 32 <= x * rblock // w and len(found) < 8:
                        add(x, rblock, w)
        else:
            for r in (512, 1024, 2048, 4096):
                if r <= next_power_of_2(rnumel):
                    for w in (4, 8):
                        add(xblock, r, w)
        return found


def is_persistent(group: FusedGroup) -> bool:
    """Keep whole reduced rows in registers (one pass, no loop)? Yes for short rows; no for long
    ones, and no for long columns (only a few would fit in registers side by side)."""
    if not group.is_reduction or not is_static(group.rnumel) or group.rnumel > config.triton.persistent_reduction_max:
        return False  # a symbolic row length may be any length: looped
    return not (group.rnumel > config.triton.outer_persistent_max and group.reduction_hint == "outer")


class TritonScheduling:
    """Backend entry point (see common.py): FusedGroup -> GeneratedKernel."""

    kind = "triton"
    #: ops.indirect_indexing (bounds-checked) and store(..., mode="atomic_add") work (common.py)
    supports_indirect_indexing = True
    splits_reductions = True  # few outputs over a long range: two stages (lowering.reduction_split_point)
    #: ops.masked loads nothing outside its mask, so a cat of many inputs stays one Pointwise
    #: (each element reads its own input: lowering.py's ``cat``)
    masked_loads = True
    #: op -> Triton format string (checked against the op table by register_backend)
    op_formats = TritonOverrides.ops

    def kernel_name(self, group: FusedGroup, index: int) -> str:
        if not group.is_reduction:
            prefix = "poi"
        else:
            prefix = "per" if is_persistent(group) else "red"
        ops_ = []
        for node in group.nodes:
            for op in V.graph.origin_ops(node.origins):
                if op not in ops_:
                    ops_.append(op)
        return f"triton_{prefix}_fused_{'_'.join(ops_[:5]) or 'kernel'}_{index}"

    def codegen_kernel(self, group: FusedGroup, index: int) -> GeneratedKernel:
        if group.is_reduction and not is_static(group.rnumel):
            return self._per_call_reduction(group, index)
        return TritonKernel(group, self.kernel_name(group, index)).codegen()

    def _per_call_reduction(self, group: FusedGroup, index: int) -> GeneratedKernel:
        """A symbolic row length: a persistent kernel (blocks picked per call) for rows up to
        ``persistent_reduction_max``, a looped one beyond, chosen by the wrapper at each call.
        Both store the same buffers (the looped kernel's choice), so they take the same arguments."""
        name = self.kernel_name(group, index).replace("triton_red_", "triton_per_", 1)
        looped = TritonKernel(group, name.replace("triton_per_", "triton_red_", 1), persistent=False)
        red = looped.codegen()
        if not config.triton.persistent_reduction_max or group.reduction_hint == "outer":
            return red
        per = TritonKernel(group, name, persistent=True, keep_in_registers=looped.keep_in_registers).codegen()
        if per.arg_names != red.arg_names or per.stored != red.stored:
            return red
        limit = config.triton.persistent_reduction_max
        rnumel = host_expr(group.rnumel)

        def launch(arg_refs):
            return f"({per.launch(arg_refs)} if {rnumel} <= {limit} else {red.launch(arg_refs)})"

        return GeneratedKernel(name, per.source + "\n\n" + red.source, per.arg_names, per.stored, launch,
                               per.origins)

    @staticmethod
    def header() -> str:
        return (
            "import triton\n"
            "import triton.language as tl\n"
            "from tininductor.codegen import triton_helpers\n"
            "from tininductor.runtime.triton_launcher import TritonLauncher\n"
        )


register_backend("cuda", TritonScheduling)
register_backend("cpu_triton", TritonScheduling)
