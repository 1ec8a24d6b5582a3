"""What a notebook runs in place of an unfinished exercise: the package's own implementation.

:func:`course.loader.load` with ``unfinished="package"`` wraps each stub; when the learner's
function still raises its ``NotImplementedError("Exercise N.M: ...")``, the wrapper prints one
line and calls the counterpart registered here. Most exercises rebuild a piece of tinydynamo or
tininductor, so the counterpart *is* that piece (``tinydynamo.symbolic_convert.BINARY_OP``,
``tininductor.codecache.write_atomic``...), adapted to the exercise's signature where the two
differ. A few exercises are course tools with no package twin (chapter 0's op counter and
timer, chapter 1's stack machine, chapter 11's bucketing); for those a short stand-in written
on PyTorch and the package is given here. Nothing here imports ``solutions/``.

Each entry maps ``"chNN.qualname"`` to ``(factory, where)``: ``factory(module)`` returns the
callable (``module`` is the learner's chapter module, for its own classes such as ``Timing``),
``where`` is what the one-line note names.
"""
from __future__ import annotations

import collections
import dis
import importlib
import math
import statistics
import sys
import time
import types
from typing import Callable

import torch

REGISTRY: dict[str, tuple[Callable[[types.ModuleType], Callable], str]] = {}
_PACKAGE_HANDLERS: dict[str, Callable] = {}


def register(key: str, where: str):
    """Decorator: ``factory(module) -> implementation`` is the counterpart of exercise ``key``."""
    def deco(factory):
        REGISTRY[key] = (factory, where)
        return factory
    return deco


def simple(key: str, where: str, fn: Callable) -> None:
    """Register ``fn`` itself (it needs nothing from the learner's module)."""
    REGISTRY[key] = (lambda module: fn, where)


def own(key: str, target: str, what: str = "own") -> None:
    """Register the package's own ``target`` ("package.module:attribute", dots for nested
    attributes) as the counterpart of ``key``: imported when first needed (Triton is heavy)."""
    module_name, _, path = target.partition(":")

    def factory(module):
        value = importlib.import_module(module_name)
        for name in path.split("."):
            value = getattr(value, name)
        return value

    REGISTRY[key] = (factory, f"{module_name.split('.')[0]}'s {what} ({module_name}.{path})")


def resolve(chapter: str, qualname: str, error: BaseException | None = None, module=None):
    """``(callable, where)`` for the exercise ``chapter.qualname``; re-raise ``error`` if none is known."""
    key = f"{chapter}.{qualname}"
    if key not in REGISTRY:
        raise NotImplementedError(
            f"{error.args[0] if error else key} (no package counterpart registered for {key} in "
            "course/fallbacks.py: finish the exercise, or add one there)") from error
    factory, where = REGISTRY[key]
    return factory(module if module is not None else sys.modules.get(_module_name(chapter))), where


def _module_name(chapter: str) -> str:
    return next((name for name in sys.modules if name.startswith(f"course_exercises_{chapter}_")), "")


def package_handler(opname: str) -> Callable:
    """tinydynamo's own opcode handler, as registered before any ``use_handlers`` swapped it."""
    return _PACKAGE_HANDLERS[opname]


def _snapshot_handlers() -> None:
    """Keep tinydynamo's handlers as this module is first imported (:func:`course.loader.load` does
    it before a notebook plugs in the learner's ones with ``use_handlers``)."""
    from tinydynamo import symbolic_convert

    _PACKAGE_HANDLERS.update({name: fn for name, fn in symbolic_convert.OPCODE_HANDLERS.items()
                              if not hasattr(fn, "__course_task__")})


_snapshot_handlers()


# ---- chapter 0: course tools (PyTorch stand-ins) ------------------------------------------------

def _count_and_run(self, func, types, args=(), kwargs=None):
    self.counts[str(func)] += 1
    return func(*args, **(kwargs or {}))


simple("ch00.OpCounter.__torch_dispatch__", "a stand-in from course/fallbacks.py", _count_and_run)


def _intermediate_bytes(fn, *args, **kwargs) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    made: list = []

    class Keep(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            made.extend(t for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            return out

    with Keep():
        result = fn(*args, **kwargs)

    def key(t):
        return str(t.device), t.untyped_storage().data_ptr()

    skip = {key(t) for t in tree_leaves((args, kwargs, result)) if isinstance(t, torch.Tensor)}
    sizes = {}
    for t in made:
        sizes.setdefault(key(t), t.untyped_storage().nbytes())
    return sum(n for k, n in sizes.items() if k not in skip)


simple("ch00.intermediate_bytes", "a stand-in from course/fallbacks.py", _intermediate_bytes)


@register("ch00.benchmark", "a stand-in from course/fallbacks.py")
def _benchmark(module):
    def benchmark(fn, *args, warmup=3, repeat=10, clock=time.perf_counter, synchronize=None):
        sync = synchronize if synchronize is not None else module.default_synchronize(*args)

        def timed() -> float:
            sync()
            start = clock()
            fn(*args)
            sync()
            return clock() - start

        first = timed()
        for _ in range(warmup):
            fn(*args)
        times = [timed() for _ in range(repeat)]
        return module.Timing(first, statistics.median(times), times)

    return benchmark


def _record_graph(self, gm, example_inputs):
    self.graphs.append(gm)
    self.example_inputs.append(example_inputs)
    return gm.forward


simple("ch00.GraphRecorder.__call__", "a stand-in from course/fallbacks.py", _record_graph)

# ---- chapter 1: bytecode ------------------------------------------------------------------------


def _global_names(fn_or_code) -> set[str]:
    code = fn_or_code if isinstance(fn_or_code, types.CodeType) else fn_or_code.__code__
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


simple("ch01.global_names", "a stand-in from course/fallbacks.py (dis)", _global_names)


def _stack_op(self, frame, inst) -> bool:
    from tinydynamo import bytecode

    s = frame.stack
    if inst.opname == "LOAD_FAST":
        s.append(frame.locals[inst.argval])
    elif inst.opname == "STORE_FAST":
        frame.locals[inst.argval] = s.pop()
    elif inst.opname == "LOAD_CONST":
        s.append(inst.argval)
    elif inst.opname == "BINARY_OP":
        right, left = s.pop(), s.pop()
        s.append(bytecode.BINARY_OPS[inst.argval](left, right))
    elif inst.opname == "RETURN_VALUE":
        frame.return_value, frame.returned = s.pop(), True
    else:
        return False
    return True


simple("ch01.StackMachine.stack_op", "a stand-in from course/fallbacks.py", _stack_op)


@register("ch01.StackMachine.CALL", "a stand-in from course/fallbacks.py (tinydynamo.bytecode.resolve_call_slots)")
def _call(module):
    from tinydynamo import bytecode

    def CALL(self, frame, inst) -> None:
        s = frame.stack
        n = inst.argval
        args = s[len(s) - n:] if n else []
        del s[len(s) - n:]
        slot1, slot0 = s.pop(), s.pop()
        fn, leading = bytecode.resolve_call_slots(slot0, slot1, lambda v: v is module.NULL)
        kw_names = tuple(inst.kw_names or ())
        positional = args[:len(args) - len(kw_names)]
        keywords = dict(zip(kw_names, args[len(args) - len(kw_names):]))
        s.append(fn(*leading, *positional, **keywords))

    return CALL


def _opcode_histogram(fn, *args):
    from tinydynamo import tracer

    trace = tracer.trace(fn, *args, include=lambda code: False, torch_ops=False)
    return trace.result, trace.opcode_histogram()


def _torch_op_lines(fn, *args):
    from tinydynamo import tracer

    trace = tracer.trace(fn, *args, include=lambda code: False, opcodes=False)
    return trace.result, trace.lines_with_ops()


simple("ch01.opcode_histogram", "tinydynamo's own tracer (tinydynamo.tracer.trace)", _opcode_histogram)
simple("ch01.torch_op_lines", "tinydynamo's own tracer (tinydynamo.tracer.trace)", _torch_op_lines)

# ---- chapter 2: symbolic handlers ---------------------------------------------------------------

for _op in ("BINARY_OP", "CALL", "FOR_ITER"):
    REGISTRY[f"ch02.{_op}"] = ((lambda op: lambda module: package_handler(op))(_op),
                               f"tinydynamo's own handler (tinydynamo.symbolic_convert.{_op})")


def _pop_jump_if(tx, inst, jump_when: bool) -> None:
    package_handler("POP_JUMP_IF_TRUE" if jump_when else "POP_JUMP_IF_FALSE")(tx, inst)


simple("ch02.pop_jump_if", "tinydynamo's own handler (tinydynamo.symbolic_convert.POP_JUMP_IF_*)", _pop_jump_if)

# ---- chapter 3: guards ----------------------------------------------------------------------------


own("ch03.constant_match_code", "tinydynamo.guards:_const_code", "own guard")
own("ch03.tensor_match_failure", "tinydynamo.guards:_tensor_failure", "own guard")
own("ch03.generate_check_code", "tinydynamo.guards:generate_check_code")
own("ch03.lookup_entry", "tinydynamo.eval_frame:lookup_entry")

# ---- chapter 4: graph breaks -----------------------------------------------------------------------


simple("ch04.branch_on", "tinydynamo's own handler (tinydynamo.symbolic_convert.POP_JUMP_IF_*)", _pop_jump_if)


def _resume_locals(instructions, offset: int, names: list[str]) -> list[str]:
    """tinydynamo.resume.live_locals's rule, on normalised instructions: every name when a backward
    jump from ``offset`` on re-enters earlier code, else the names the rest reads."""
    from tinydynamo import resume

    tail = [inst for inst in instructions if inst.offset >= offset]
    if any(inst.target is not None and instructions[inst.target].offset < offset for inst in tail):
        return list(names)
    return resume.locals_read(tail, names)


simple("ch04.resume_locals", "tinydynamo's rule (tinydynamo.resume.live_locals)", _resume_locals)


def _where_rewrite(x):
    y = torch.relu(x)  # branchy's two sides, chosen by a tensor condition
    return torch.where(x.sum() > 0, y * 2, y - 1)


simple("ch04.where_rewrite", "a stand-in from course/fallbacks.py", _where_rewrite)


def _break_sites(out) -> list[tuple[str, int]]:
    import re

    sites = []
    for reason in out.break_reasons:  # user_stack: 'File "f.py", line 12, in fn\n  source', innermost first
        frame = re.search(r'line (\d+), in (\S+)', reason.user_stack[0]) if reason.user_stack else None
        sites.append((frame[2], int(frame[1])) if frame else ("<unknown>", 0))
    return sites


simple("ch04.break_sites", "tinydynamo's explain() records (a stand-in reader)", _break_sites)

# ---- chapter 5: FX graphs and decompositions ------------------------------------------------


def _count_ops(gm) -> dict[str, int]:
    return dict(collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function"))


def _interpret(gm, *args):
    import torch.fx

    return torch.fx.Interpreter(gm).run(*args)


simple("ch05.count_ops", "a stand-in from course/fallbacks.py", _count_ops)
simple("ch05.interpret", "PyTorch's own torch.fx.Interpreter", _interpret)


own("ch05.gelu", "tininductor.decompositions:gelu", "own decomposition")
own("ch05.native_layer_norm", "tininductor.decompositions:native_layer_norm", "own decomposition")
own("ch05.softmax", "tininductor.decompositions:_softmax", "own decomposition")

# ---- chapter 6: AOT autograd ----------------------------------------------------------------------


def _sum_to_size(grad, shape):
    from tininductor import vjp_rules

    return vjp_rules.sum_to_size(grad, torch.empty(list(shape), device="meta"))


def _default_saved(joint_gm, num_primals: int, num_outputs: int):
    from tininductor import partitioners

    return partitioners.default_saved(types.SimpleNamespace(gm=joint_gm, num_primals=num_primals,
                                                            num_outputs=num_outputs))


simple("ch06.sum_to_size", "tininductor's own (tininductor.vjp_rules.sum_to_size)", _sum_to_size)
own("ch06.mul_vjp", "tininductor.vjp_rules:mul_vjp", "own rule")
own("ch06.backward_pass", "tininductor.joint_graph:backward_pass")
simple("ch06.default_saved", "tininductor's own (tininductor.partitioners.default_saved)", _default_saved)

# ---- chapter 7: loop IR and fusion --------------------------------------------------------------


def _lower_silu(x):
    from tininductor.decompositions import decomposition_lowering

    return decomposition_lowering(torch.ops.aten.silu.default)(x)


simple("ch07.lower_silu", "tininductor's decomposition of silu, lowered op by op (tininductor.decompositions.decomposition_lowering)", _lower_silu)
own("ch07.permute_reindex", "tininductor.lowering:permute_reindex")
own("ch07.expand_reindex", "tininductor.lowering:expand_reindex")
own("ch07.fusion_is_legal", "tininductor.scheduler:fusion_is_legal", "own rule")  # the package's, never a swapped-in one
own("ch07.ReadWritesHandler.load", "tininductor.scheduler:ReadWrites.load")
own("ch07.ReadWritesHandler.store", "tininductor.scheduler:ReadWrites.store")

# ---- chapter 8: Triton codegen --------------------------------------------------------------------


def _triton_op_strings() -> dict[str, str]:
    from tininductor.codegen.triton import TritonOverrides

    return dict(TritonOverrides.ops)


def _mask_for(index):
    import sympy

    from tininductor.codegen.triton import TritonKernel

    return TritonKernel._mask(None, sympy.sympify(index))


def _launch_config(numel: int, rnumel: int, is_reduction: bool):
    from tininductor.codegen.triton import TritonKernel

    group = types.SimpleNamespace(numel=numel, rnumel=rnumel, reduction_hint=None)
    kernel = types.SimpleNamespace(group=group, is_reduction=is_reduction, persistent=True)
    xblock, rblock, warps = TritonKernel.block_sizes(kernel)
    return xblock, rblock, warps, max(1, math.ceil(numel / xblock))


def _reduction(self, dtype, src_dtype, reduction_type, value):
    from tininductor.codegen.triton import TritonOverrides, reduction_init

    final = TritonOverrides.reductions[reduction_type][2]
    masked = self.generate(f"tl.where(xmask & rmask, {value}, {reduction_init(reduction_type, src_dtype)})")
    return self.generate(f"{final.format(masked)}[:, None]")


simple("ch08.triton_op_strings", "tininductor's own table (tininductor.codegen.triton.TritonOverrides.ops)", _triton_op_strings)
simple("ch08.mask_for", "tininductor's own (tininductor.codegen.triton.TritonKernel._mask)", _mask_for)
own("ch08.masked_load", "tininductor.codegen.triton:masked_load")
own("ch08.masked_store", "tininductor.codegen.triton:masked_store")
simple("ch08.launch_config", "tininductor's own (tininductor.codegen.triton.TritonKernel.block_sizes)", _launch_config)
simple("ch08.MiniTritonKernel.reduction", "tininductor's persistent reduction (tininductor.codegen.triton)", _reduction)

# ---- chapter 9: C++ codegen ------------------------------------------------------------------------


def _cpp_op_strings() -> dict[str, str]:
    from tininductor.codegen.cpp import CPP_OPS

    return {op: CPP_OPS[op] for op in ("sigmoid", "relu", "maximum", "where", "rsqrt")}


def _row_sum_source(name: str) -> str:
    return (
        "#include <cstdint>\n"
        f'extern "C" void {name}(const float* x, float* out, int64_t rows, int64_t cols) {{\n'
        "    #pragma omp parallel for\n"
        "    for (int64_t i = 0; i < rows; ++i) {\n"
        "        double acc = 0;\n"
        "        #pragma omp simd reduction(+:acc)\n"
        "        for (int64_t j = 0; j < cols; ++j) acc += x[i * cols + j];\n"
        "        out[i] = static_cast<float>(acc);\n"
        "    }\n"
        "}\n")


simple("ch09.cpp_op_strings", "tininductor's own table (tininductor.codegen.cpp.CPP_OPS)", _cpp_op_strings)
own("ch09.reduction_code", "tininductor.codegen.cpp:reduction_code")
simple("ch09.row_sum_source", "a stand-in from course/fallbacks.py", _row_sum_source)
own("ch09.write_atomic", "tininductor.codecache:write_atomic")
own("ch09.entry_is_intact", "tininductor.codecache:entry_is_intact")

# ---- chapter 10: dynamic shapes --------------------------------------------------------------------
# tinydynamo builds on torch's own ShapeEnv and sympy indexing, which have no small counterparts of these
# exercises: most are stand-ins; the automatic-dynamic rule and the strides are the package's own.


def _evaluate_expr(env, expr) -> bool:
    import sympy

    relation = sympy.sympify(expr)
    answer = bool(relation.subs(env.var_to_val))
    holds = relation if answer else sympy.Not(relation)
    if relation.free_symbols and holds not in env.guards:
        env.guards.append(holds)
    return answer


@register("ch10.ShapeEnv.produce_guards", "a stand-in from course/fallbacks.py")
def _produce_guards(module):
    def produce_guards(env) -> list[str]:
        import sympy

        first = {sym: srcs[0] for sym, srcs in env.var_to_sources.items()}
        equal = [f"{src} == {first[sym]}" for sym, srcs in env.var_to_sources.items() for src in srcs[1:]]
        ranges = [f"2 <= {src}" for src in first.values()]
        rename = {sym: sympy.Symbol(src) for sym, src in first.items()}
        return equal + ranges + [module.pexpr(g.subs(rename)) for g in env.guards]
    return produce_guards


def _broadcast_shapes(a, b, guards) -> tuple:
    import sympy

    rank = max(len(a), len(b))
    pad_a = [sympy.Integer(1)] * (rank - len(a)) + [sympy.sympify(v) for v in a]
    pad_b = [sympy.Integer(1)] * (rank - len(b)) + [sympy.sympify(v) for v in b]
    result = []
    for x, y in zip(pad_a, pad_b):
        if x == y or y == 1:
            result.append(x)
        elif x == 1:
            result.append(y)
        elif x.is_number and y.is_number:
            raise ValueError(f"shapes {tuple(a)} and {tuple(b)} do not broadcast: {x} vs {y}")
        else:
            guards.append(sympy.Eq(x, y))
            result.append(x if x.is_number else y)
    return tuple(result)


def _view_shape(numel, shape) -> tuple:
    import sympy

    sizes = [sympy.sympify(v) for v in shape]
    if sizes.count(-1) > 1:
        raise ValueError("only one dimension can be -1")
    rest = math.prod([v for v in sizes if v != -1], start=sympy.Integer(1))
    if -1 not in sizes:
        if sympy.simplify(rest - sympy.sympify(numel)) != 0:
            raise ValueError(f"view{tuple(sizes)} does not hold {numel} elements")
        return tuple(sizes)
    q = sympy.cancel(sympy.sympify(numel) / rest)
    if sympy.denom(q) != 1:
        raise ValueError(f"{numel} elements do not split into rows of {rest}")
    return tuple(q if v == -1 else v for v in sizes)


def _update_frame_state(state, sizes) -> list:
    from tinydynamo.symbolic_shapes import update_frame_state

    return list(update_frame_state(None if state is None else tuple(state), tuple(sizes)))


def _symbolic_dims(state, sizes, dynamic, marked=()) -> list[int]:
    wanted = {i for i in range(len(sizes)) if dynamic is True or i in set(marked)
              or (dynamic is None and state[i] is None)}
    return [i for i in sorted(wanted) if sizes[i] not in (0, 1)]


def _contiguous_strides(sizes) -> tuple:
    from tininductor.indexing import contiguous_strides

    return tuple(contiguous_strides(sizes))


def _broadcast_index(out_sizes, in_sizes, xindex=None):
    import sympy

    xindex = sympy.Symbol("xindex", integer=True, nonnegative=True) if xindex is None else xindex
    if [sympy.sympify(v) for v in in_sizes] == [sympy.sympify(v) for v in out_sizes]:
        return xindex
    out_strides, in_strides = _contiguous_strides(out_sizes), _contiguous_strides(in_sizes)
    terms = []
    for j in range(len(in_sizes)):
        d = len(out_sizes) - len(in_sizes) + j
        if in_sizes[j] == 1:
            continue
        coordinate = sympy.floor(xindex / out_strides[d])
        terms.append((sympy.Mod(coordinate, out_sizes[d]) if d else coordinate) * in_strides[j])
    return sympy.Add(*terms)


simple("ch10.ShapeEnv.evaluate_expr", "a stand-in from course/fallbacks.py", _evaluate_expr)
simple("ch10.broadcast_shapes", "a stand-in from course/fallbacks.py", _broadcast_shapes)
simple("ch10.view_shape", "a stand-in from course/fallbacks.py", _view_shape)
simple("ch10.update_frame_state", "tinydynamo's rule (tinydynamo.symbolic_shapes.update_frame_state)",
       _update_frame_state)
simple("ch10.symbolic_dims", "a stand-in from course/fallbacks.py", _symbolic_dims)
simple("ch10.contiguous_strides", "tininductor's own (tininductor.indexing.contiguous_strides)", _contiguous_strides)
simple("ch10.broadcast_index", "a stand-in from course/fallbacks.py", _broadcast_index)

# ---- chapter 11: end to end -----------------------------------------------------------------------


def _ideal_bytes(gm, example_inputs) -> int:
    def size(t):
        return t.numel() * t.element_size()

    outputs = gm(*example_inputs)
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    inputs = {id(t): t for t in example_inputs if isinstance(t, torch.Tensor)}
    fresh = {id(t): t for t in outputs if isinstance(t, torch.Tensor) and id(t) not in inputs}
    return sum(map(size, inputs.values())) + sum(map(size, fresh.values()))


def _positive_branch(x):
    y = x.sin() + x.cos()
    return torch.where(y.sum() > 0, y * 2, y - 2)


def _bucket_length(n: int, buckets: list[int]) -> int:
    fits = [b for b in sorted(buckets) if b >= n]
    return fits[0] if fits else -(-n // max(buckets)) * max(buckets)


def _bucketed(fn, buckets, dim: int = 1):
    def wrapper(x):
        n = x.shape[dim]
        pad = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [0, _bucket_length(n, buckets) - n]
        return fn(torch.nn.functional.pad(x, pad)).narrow(dim, 0, n)
    return wrapper


simple("ch11.ideal_bytes", "a stand-in from course/fallbacks.py", _ideal_bytes)
simple("ch11.positive_branch", "a stand-in from course/fallbacks.py", _positive_branch)
simple("ch11.bucket_length", "a stand-in from course/fallbacks.py", _bucket_length)
simple("ch11.bucketed", "a stand-in from course/fallbacks.py", _bucketed)

# ---- chapter 12: distributed training ------------------------------------------------------------


def _ddp_buckets(params, bucket_cap, first_bucket_cap):
    from tinydynamo.distributed import assign_buckets

    ready = list(reversed(params))
    return [[ready[i][0] for i in b] for b in assign_buckets([n for _, n in ready], bucket_cap, first_bucket_cap)]


def _split_points(gm, param_bytes, bucket_cap, first_bucket_cap):
    from tinydynamo.distributed import split_buckets

    pieces = split_buckets(gm, param_bytes, bucket_cap, first_bucket_cap)
    return {n.name: i for i, piece in enumerate(pieces) for n in piece.nodes}


def _step_time(backward_ms, allreduce_ms, split):
    ready = [sum(backward_ms[i:]) for i in range(len(backward_ms))] if split else [sum(backward_ms)] * len(backward_ms)
    comm_end = 0.0
    for i in reversed(range(len(backward_ms))):
        comm_end = max(comm_end, ready[i]) + allreduce_ms[i]
    return max(sum(backward_ms), comm_end)


simple("ch12.ddp_buckets", "a stand-in from course/fallbacks.py (tinydynamo.distributed.assign_buckets)", _ddp_buckets)
simple("ch12.split_points", "tinydynamo.distributed.split_buckets", _split_points)
simple("ch12.step_time", "a stand-in from course/fallbacks.py", _step_time)
