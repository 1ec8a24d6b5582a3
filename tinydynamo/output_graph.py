"""OutputGraph: the FX graph being built for one frame, its inputs, guards, and the compiled result.

The translator asks it to lift tensors into placeholders (each with a source, so the compiled
frame knows where to fetch it on every call), to add op nodes (running each op on fake tensors
to learn the result's shape/dtype/device without computing anything), and to install guards.
At RETURN_VALUE, :meth:`OutputGraph.compile` hands the graph to the backend and generates the
small Python function that a cache hit runs (after the graph call, it replays the side effects
recorded by :class:`~tinydynamo.side_effects.SideEffects`; the lines after the graph call are written
by :mod:`tinydynamo.codegen`):

    def ___compiled_frame(L, G):
        ___o = ___compiled_fn(L['x'], L['self'].fc1.weight, ...)
        return (___o[0], 3)
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import operator
import re
from typing import Any, Callable

import torch
import torch.fx
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import TracingContext, tracing
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.amp.autocast_mode import _exit_autocast
from torch.fx.experimental.symbolic_shapes import has_free_symbols
from torch.utils._python_dispatch import TorchDispatchMode

from tinydynamo import artifacts, distributed, logs, symbolic_shapes
from tinydynamo.codegen import GraphBreakCodegen, PyCodegen
from tinydynamo.decompile import DecompiledCode
from tinydynamo.exc import BackendCompilerFailed, Unsupported, unimplemented
from tinydynamo.guards import CheckFunction, GuardBuilder, TensorMeta, storage_groups
from tinydynamo.side_effects import SideEffects
from tinydynamo.source import ModuleMemberSource, Source, SourceScope
from tinydynamo.utils import dynamo_timed, mutated_any, tensor_versions
from tinydynamo.variables import torch_function
from tinydynamo.variables.base import VariableTracker
from tinydynamo.variables.builder import wrap_fx_result
from tinydynamo.variables.builtin import INPLACE_TO_OUT_OF_PLACE
from tinydynamo.variables.ctx_manager import is_grad_mode_node
from tinydynamo.variables.lists import specialized
from tinydynamo.variables.sym_node import SymNodeVariable
from tinydynamo.variables.tensor import TensorVariable, element_range
from tinydynamo.variables.torch import RUNTIME_CHECKS

CALL_OPS = ("call_function", "call_method", "call_module")
#: operator functions that change their first argument (``z += y`` on a tensor, ``z[i] = v``)
INPLACE_OPERATORS = frozenset({operator.setitem, *INPLACE_TO_OUT_OF_PLACE})


@dataclasses.dataclass
class CompiledFrame:
    """One cache entry: guards + the generated function that runs the compiled graph (PyTorch:
    ``CacheEntry``, with the transformed code object in place of ``code``)."""

    check_fn: CheckFunction
    run: Callable[[dict, dict], Any]
    graph_module: torch.fx.GraphModule
    code: str  # source of the generated ``___compiled_frame``
    backend: Any
    op_count: int
    break_reason: str | None = None  # set when the frame was split by a graph break


@contextlib.contextmanager
def preserve_rng_state():
    """Compiling must not move the global generators (a backend may run kernels on random
    inputs to check or tune them): ``manual_seed(s)`` before a first, compiling call then gives
    the same draws as before a later, cached one (as ``torch._dynamo`` does)."""
    cpu = torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _writes_in_place(node: torch.fx.Node) -> bool:
    """``x.add_(1)``, ``torch.add(a, b, out=x)``, ``x[i] = v``: a node that writes to a tensor."""
    if node.op not in CALL_OPS:
        return False
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or "out" in node.kwargs or \
        node.target is operator.setitem


class _RandomOpRecorder(TorchDispatchMode):
    """Notes whether any ATen op that ran under it draws from a random generator."""

    def __init__(self):
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen = self.seen or torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def _has_numpy_array(values) -> bool:
    """Is a NumPy array (variables/numpy.py) among ``values``, or in lists, tuples and dicts among them?"""
    for v in values:
        if getattr(v, "is_numpy_array", False):
            return True
        items = getattr(v, "items", None)
        if isinstance(items, dict):
            items = list(items.values())
        if isinstance(items, list) and _has_numpy_array(items):
            return True
    return False


def _node_name(source: Source) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", source.name()).strip("_").lower()
    return name or "input"


class OutputGraph:
    """The graph of one frame (TorchDynamo's OutputGraph). The frame's caller (convert_frame) passes down
    what compiled code calls at a graph break, so this layer never imports it back: ``wrap_for_resume``
    (the compiled version of a resume function or callee) and ``call_resume_with_closure``."""

    def __init__(self, f_globals: dict, frame_name: str, frame_state: dict | None = None, *,
                 wrap_for_resume: Callable | None = None, call_resume_with_closure: Callable | None = None):
        self.frame_name = frame_name
        self.wrap_for_resume = wrap_for_resume
        self.call_resume_with_closure = call_resume_with_closure
        self.graph = torch.fx.Graph()
        self.root = torch.nn.Module()
        with dynamo_timed("fake_tensor_mode"):  # the first one imports torch._dynamo (its config)
            # sizes may be symbols of this ShapeEnv (dynamic shapes: tinydynamo.symbolic_shapes)
            self.fake_mode = FakeTensorMode(shape_env=symbolic_shapes.new_shape_env())
        self.frame_state = frame_state  # per code object: input sizes seen so far (automatic dynamic)
        self.symbol_nodes: dict = {}  # sympy symbol -> (its SymInt placeholder, source)
        #: symbolic inputs (fake, source, real value, symbolic context), for the shape guards
        self.tracked_fakes: list[tuple[torch.Tensor, Source, torch.Tensor, Any]] = []
        self.scope = SourceScope(f_globals)
        self.guard_builder = GuardBuilder(self.scope)
        self.frame_values: tuple[dict, dict] | None = None  # (L, G) of the traced frame, set by its translator
        self.input_sources: list[Source] = []
        self.example_inputs: list[torch.Tensor] = []
        self._inputs: dict[str, TensorVariable] = {}
        #: id of each tensor lifted as an input -> its variable (the tensor is kept alive by
        #: example_inputs): a second source reaching the same tensor shares its placeholder
        self._inputs_by_id: dict[int, TensorVariable] = {}
        self.instruction_count = 0
        self.generators: list = []  # generator objects made in the frame (LocalGeneratorObjectVariable)
        self.exc_stack: list = []  # exceptions being handled by traced except blocks, innermost last
        self.side_effects = SideEffects(self)
        self.current_tx = None  # the translator running an instruction (a __torch_function__ override is inlined there)
        self.autocast_modes: list = []  # real torch.autocast modes entered while tracing (left when it ends)
        self.last_op_mutated = False  # whether the op last run on fake values changed an argument
        self.torch_function_disabled = 0  # depth of `with torch._C.DisableTorchFunctionSubclass()` blocks
        self.add_guard("GRAD_MODE", None, torch.is_grad_enabled())
        self.add_guard("DEFAULT_DTYPE", None, torch.get_default_dtype())  # torch.ones(3) bakes it in

    # ---- guards and inputs -----------------------------------------------------------------------
    def add_guard(self, kind: str, source: Source | None, expected: Any = None) -> None:
        self.guard_builder.add(kind, source, expected)

    def lift_tensor(self, value: torch.Tensor, source: Source | None) -> TensorVariable:
        """A real tensor met while tracing: a graph input (with a source), or a constant attribute."""
        if source is None:  # e.g. a tensor default argument: keep it as a constant of the graph
            name = f"_tensor_constant{len(self.root._buffers)}"
            self.root.register_buffer(name, value)
            node = self.graph.get_attr(name)
            var = TensorVariable(node, self.fake_mode.from_tensor(value, static_shapes=True))
            node.meta["example_value"] = var.example
            return var
        key = source.name()
        if key in self._inputs:
            return self._inputs[key]
        other = self._inputs_by_id.get(id(value))
        if other is not None:  # the same tensor reached by two sources: one placeholder
            self.add_guard("ALIAS_MATCH", source, (other.source, True))
            self._inputs[key] = other
            return other
        placeholders = self._placeholders()
        anchor = placeholders[-1].next if placeholders else next(iter(self.graph.nodes), None)
        if anchor is not None and anchor.op != "root":
            with self.graph.inserting_before(anchor):
                node = self.graph.placeholder(_node_name(source))
        else:
            node = self.graph.placeholder(_node_name(source))
        fake = self._fake_input(value, source, node)
        node.meta["example_value"] = fake
        node.meta["source"] = key
        # a parameter/buffer: backends may assume it does not share memory with the other inputs
        node.meta["module_state"] = isinstance(source, ModuleMemberSource)
        self.add_guard("TENSOR_MATCH", source, TensorMeta.of(value, fake))
        var = TensorVariable(node, fake, source)
        var.py_type = type(value)
        self._inputs[key] = var
        self._inputs_by_id[id(value)] = var
        self.input_sources.append(source)
        self.example_inputs.append(value)
        return var

    def _placeholders(self) -> list[torch.fx.Node]:
        """The graph's placeholders: they come first, so the scan stops at the first other node
        (a model with hundreds of parameters lifts each one past the ones before, not the graph)."""
        return list(itertools.takewhile(lambda n: n.op == "placeholder", self.graph.nodes))

    def _fake_input(self, value: torch.Tensor, source: Source, node: torch.fx.Node) -> torch.Tensor:
        """The input's fake value: static, or with symbols for its dynamic dims (the policy is
        tinydynamo.symbolic_shapes.dynamic_dims). Each new symbol becomes a SymInt placeholder just
        before the tensor's (TorchDynamo's convention: ``s0, s1, L_x_``), read at run time from
        ``L['x'].size()[i]`` by the generated frame."""
        sizes, constraints, reasons = symbolic_shapes.dynamic_dims(value, source, self.frame_state)
        if not reasons:
            return self.fake_mode.from_tensor(value, static_shapes=True)
        context = symbolic_shapes.symbolic_context(sizes, constraints)
        fake = self.fake_mode.from_tensor(value, source=symbolic_shapes.TorchSource(source), symbolic_context=context)
        if not has_free_symbols(fake):  # only sizes 0/1 were asked for: they stay static
            return fake
        symbolic_shapes.log.info("%s: dynamic %s -> fake %s", source.name(), ", ".join(reasons),
                                 tuple(fake.shape))
        self.tracked_fakes.append((fake, source, value, context))
        for sym in (*fake.shape, *fake.stride(), fake.storage_offset()):
            expr = sym.node.expr if isinstance(sym, torch.SymInt) else None
            if expr is None or not expr.is_Symbol or expr in self.symbol_nodes:
                continue
            with self.graph.inserting_before(node):
                sym_node = self.graph.placeholder(str(expr))
            sym_source = symbolic_shapes.symbol_source(self.fake_mode.shape_env, expr)
            sym_node.meta["example_value"] = sym
            sym_node.meta["source"] = sym_source.name()
            self.symbol_nodes[expr] = (sym_node, sym_source)
            self.input_sources.append(sym_source)
            self.example_inputs.append(sym)
        return fake

    def lift_int(self, value: int, source: Source) -> VariableTracker | None:
        """An int argument compiled as a symbol (automatic dynamic / ``dynamic=True``): a SymInt
        placeholder read from ``L['n']`` at run time; None where the int stays a guarded constant."""
        why = symbolic_shapes.int_is_dynamic(value, source, self.frame_state)
        if why is None:
            return None
        key = source.name()
        if key in self._inputs:
            return self._inputs[key]
        env = self.fake_mode.shape_env
        sym = env.create_unspecified_symint_and_symbol(value, symbolic_shapes.TorchSource(source),
                                                       symbolic_shapes.DimDynamic.DYNAMIC)
        symbolic_shapes.log.info("%s: dynamic int %s: %s -> %s", key, value, why, sym)
        placeholders = self._placeholders()
        anchor = placeholders[-1].next if placeholders else next(iter(self.graph.nodes), None)
        if anchor is not None and anchor.op != "root":
            with self.graph.inserting_before(anchor):
                node = self.graph.placeholder(str(sym.node.expr))
        else:
            node = self.graph.placeholder(str(sym.node.expr))
        node.meta["example_value"] = sym
        node.meta["source"] = key
        self.add_guard("TYPE_MATCH", source, int)
        var = SymNodeVariable(node, sym, source)
        self._inputs[key] = var
        self.symbol_nodes[sym.node.expr] = (node, source)
        self.tracked_fakes.append((sym, source, value, None))
        self.input_sources.append(source)
        self.example_inputs.append(sym)
        return var

    # ---- ops ---------------------------------------------------------------------------------------
    def create_node(self, op: str, target: Any, args: list[VariableTracker], kwargs: dict[str, VariableTracker],
                    keep: bool = False) -> VariableTracker:
        """Add ``target(*args, **kwargs)`` to the graph; its fake result says what it produces."""
        if op == "call_method" and target == "as_subclass" and not (
                torch_function.has_overloaded_args(args, kwargs) and not self.torch_function_disabled):
            return torch_function.as_subclass_variable(args, kwargs)  # the same node, seen as another type
        if not self.torch_function_disabled and torch_function.has_overloaded_args(args, kwargs):
            # a tensor subclass's __torch_function__ decides what the op does (it is inlined)
            return torch_function.dispatch(self.current_tx, "call_function_keep" if keep else op, target, args, kwargs)
        name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
        if not getattr(target, "takes_numpy_arrays", False) and _has_numpy_array([*args, *kwargs.values()]):
            # eager torch raises, or NumPy converts the tensor: whichever happens, it happens natively
            unimplemented(f"a NumPy array passed to {name}", hint="convert it with torch.from_numpy(a) first")
        try:
            example = self._run_fake(op, target, args, kwargs)
        except Unsupported:
            raise
        except Exception as e:  # data-dependent output shapes, or the user's own error (eager will show it)
            fixed = specialized(args), {k: specialized(v) for k, v in kwargs.items()}
            try:
                if fixed == (args, kwargs):
                    raise
                # an op without a symbolic-shape rule for a size argument (F.pad(x, (n, n))): its sizes
                # are specialised (guarded), as torch does where it cannot stay symbolic
                example = self._run_fake(op, target, *fixed)
                args, kwargs = fixed
            except Unsupported:
                raise
            except Exception:
                unimplemented(f"{name}(...) could not be traced with fake tensors: {type(e).__name__}: {e}")
        node_args = tuple(a.as_node_arg() for a in args)
        node_kwargs = {k: v.as_node_arg() for k, v in kwargs.items()}
        node = self.graph.create_node(op, target, node_args, node_kwargs)
        if self.last_op_mutated:  # an in-place op, whatever its name: it stays, even with its result unused
            node.meta["mutates_args"] = True
        if keep:
            node.meta["example_value"] = example
            return None
        result = wrap_fx_result(self, node, example)
        if isinstance(result, TensorVariable):
            result.element_range = element_range(op, target, args, kwargs)
            if result.element_range is not None:
                result.range_versions = tensor_versions(example)
        return result

    def _run_fake(self, op: str, target: Any, args: list, kwargs: dict) -> Any:
        """``target(*args, **kwargs)`` on the example values (fake tensors, SymInts): what it produces.
        With symbolic sizes, under the Python dispatcher, whose meta functions and decompositions
        handle SymInts (as TorchDynamo runs them)."""
        ex_args = [a.as_example() for a in args]
        ex_kwargs = {k: v.as_example() for k, v in kwargs.items()}
        versions = tensor_versions((ex_args, ex_kwargs))
        symbolic = self.tracked_fakes and contextlib.ExitStack() or contextlib.nullcontext()
        with self.fake_mode, symbolic as stack:
            if stack is not None:
                stack.enter_context(enable_python_dispatcher())
            if op == "call_method":
                example = getattr(ex_args[0], target)(*ex_args[1:], **ex_kwargs)
            else:
                example = target(*ex_args, **ex_kwargs)
        self.last_op_mutated = mutated_any(versions)
        return example

    def op_count(self) -> int:
        return sum(1 for n in self.graph.nodes if n.op in CALL_OPS and not is_grad_mode_node(n))

    def _dead_code_elimination(self) -> None:
        """Drop ops whose results are unused, except those with effects: in-place ops (their result
        is often unused: ``alias = z; z += y`` reads the mutation through another name), setitem,
        grad mode and autocast switches, run-time checks (``torch._check``), random draws."""
        for node in reversed(list(self.graph.nodes)):
            if node.op not in CALL_OPS or node.users:
                continue
            name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
            if node.meta.get("mutates_args") or name.endswith("_") and not name.endswith("__") \
                    or node.target in INPLACE_OPERATORS or node.target in RUNTIME_CHECKS or is_grad_mode_node(node) \
                    or node.target is _exit_autocast or "out" in node.kwargs or name.startswith("__i") \
                    or self._draws_random_numbers(node):
                continue
            self.graph.erase_node(node)

    def _draws_random_numbers(self, node: torch.fx.Node) -> bool:
        """Does the op advance a random generator (``torch.rand(3)``, its result unused)? Eager draws those
        numbers, so the graph must too, or every later draw differs. Asked of the op itself, rerun on
        its fake arguments with a recorder of the ATen ops it reaches (their ``nondeterministic_seeded``
        tag); an op that cannot be rerun is kept."""
        if node.op == "call_module":
            return True
        try:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["example_value"])
            with self.fake_mode, _RandomOpRecorder() as recorder:
                if node.op == "call_method":
                    getattr(args[0], node.target)(*args[1:], **kwargs)
                else:
                    node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - not rerunnable: keep it
            return True
        return recorder.seen

    # ---- compile -----------------------------------------------------------------------------------
    def compile(self, return_value: VariableTracker | None, backend: Callable, graph_break=None,
                code=None) -> CompiledFrame:
        """Compile the graph and generate the function a cache hit runs.

        Normally it returns the rebuilt return value. After a graph break (``graph_break`` from
        the translator) it runs the unsupported instruction natively and calls resume
        function(s) with the rebuilt stack and locals (see tinydynamo.resume).
        """
        codegen = PyCodegen(self)
        codegen.hoist_sources = not self.side_effects.is_empty()
        replay = self.side_effects.codegen_update_mutated(codegen)  # before the instruction/return
        if graph_break is None:
            body = [f"return {return_value.reconstruct(codegen)}"]
        else:
            body = GraphBreakCodegen(self, graph_break, codegen, backend, code).lines()
        self.graph.output(tuple(codegen.nodes))
        traced_ops = self.op_count()  # TorchDynamo compiles a frame that traced ops, even if all are dead
        self._dead_code_elimination()
        self.graph.lint()
        gm = torch.fx.GraphModule(self.root, self.graph, class_name=f"GraphModule_{self.frame_name}")
        n_ops = self.op_count()
        artifacts.record("graph", self.frame_name, gm.print_readable(print_output=False))
        if logs.enabled("graph_code"):
            logs.get_logger("graph_code").info("TRACED GRAPH %s\n%s", self.frame_name, gm.print_readable(print_output=False))
        compiled_fn = self._call_backend(gm, backend, n_ops or traced_ops)
        check_fn = self._build_guards()
        text = codegen.compiled_frame_source(replay + body, n_ops)
        namespace = {**self.scope.names, "___compiled_fn": compiled_fn}
        exec(compile(text, f"<tinydynamo {self.frame_name}>", "exec"), namespace)
        artifacts.record("transformed_code", self.frame_name, text)
        if codegen.resume_codes:
            for resume_code in codegen.resume_codes:  # the rest of the frame, as readable Python (lazily)
                artifacts.record("transformed_code", f"{resume_code.co_name} (decompiled)", DecompiledCode(resume_code))
        return CompiledFrame(check_fn, namespace["___compiled_frame"], gm, text, backend, n_ops,
                             graph_break.reason if graph_break is not None else None)

    def _call_backend(self, gm: torch.fx.GraphModule, backend: Callable, n_ops: int) -> Callable:
        """``backend(gm, example_inputs)``; an error in it is a BackendCompilerFailed naming the backend."""
        if not n_ops:  # nothing traced: TorchDynamo skips the backend for op-free graphs too
            return gm.forward
        try:
            with dynamo_timed("backend_compile"), preserve_rng_state(), self._tracing_context():
                # inside a DDP forward: split at DDP's gradient buckets (tinydynamo.distributed)
                compiled_fn = distributed.backend_for_graph(backend)(gm, list(self.example_inputs))
        except Unsupported:
            raise
        except Exception as e:
            name = getattr(backend, "__name__", type(backend).__name__)
            raise BackendCompilerFailed(name, e) from e
        if not callable(compiled_fn):
            raise TypeError(f"backend {backend!r} returned {type(compiled_fn).__name__}, not a callable")
        return compiled_fn

    def _build_guards(self) -> CheckFunction:
        """Guards last, as TorchDynamo builds them: a backend may specialise a size (a decomposition
        that needs its value), and what it assumed must be checked too."""
        self._guard_input_overlap()
        for fake, source, value, _ in self.tracked_fakes:  # dims the trace specialised are static again
            if isinstance(fake, torch.Tensor):
                self.guard_builder.replace("TENSOR_MATCH", source, TensorMeta.of(value, fake))
        for relation in symbolic_shapes.produce_guards(self.fake_mode.shape_env, self.tracked_fakes, self.scope):
            self.add_guard("SHAPE_ENV", None, relation)
        check_fn = self.guard_builder.build(self.frame_values)
        artifacts.record("guards", self.frame_name, check_fn.code)
        logs.get_logger("guards").info("GUARDS %s\n%s", self.frame_name,
                                       "\n".join(str(g) for g in check_fn.guards))
        return check_fn

    def _tracing_context(self):
        """For a graph with symbolic sizes, the backend runs in a ``torch._guards.TracingContext`` holding
        this frame's fake mode, as under torch.compile: backends written for it (PyTorch's aot_autograd)
        find the ShapeEnv there (``detect_fake_mode``) and fake the inputs with the same symbols,
        instead of baking in the example sizes."""
        if not self.tracked_fakes:
            return contextlib.nullcontext()

        return tracing(TracingContext(self.fake_mode))

    def _guard_input_overlap(self) -> None:
        """A graph that writes in place gets a STORAGE_OVERLAP guard over its tensor inputs: the
        same tensor passed twice, or two views of one base, where the first call had distinct
        tensors, is a miss (the new entry takes the duplicate as one input). Parameters and
        buffers are left out (as TorchDynamo does): checking every one of them on every call
        would cost more than the rest of the guards."""
        pairs = [(src, t) for src, t in zip(self.input_sources, self.example_inputs)
                 if not isinstance(src, ModuleMemberSource) and isinstance(t, torch.Tensor)]  # parameters and buffers: not checked per call
        if len(pairs) < 2 or not any(_writes_in_place(n) for n in self.graph.nodes):
            return
        self.add_guard("STORAGE_OVERLAP", None, (tuple(s for s, _ in pairs), storage_groups(*[t for _, t in pairs])))
