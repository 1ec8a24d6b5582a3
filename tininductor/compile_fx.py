"""compile_fx: the tininductor backend, FX graph in, compiled callable out.

    compile_fx(gm, example_inputs)            # the backend (training goes through AOT autograd)
      -> decompose(gm) to the prim set        # decompositions.py
      -> compile_fx_inner(prim_gm, inputs)
           GraphLowering   FX -> IR buffers    # graph.py, lowering.py, ir.py
           Scheduler       buffers -> kernels  # scheduler.py
           WrapperCodeGen  kernels -> module   # codegen/wrapper.py, codegen/triton.py
           PyCodeCache     module source -> loaded module; return its call()

Use it as ``torch.compile(f, backend=tininductor.compile_fx)``.
"""
from __future__ import annotations

import collections
import functools
import logging
import os
import re
import sys
import types
import warnings

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.utils._pytree import tree_unflatten

from tinydynamo import artifacts
from tinydynamo.backends import errors_must_raise
from tinydynamo.exc import EagerFallbackWarning
from tinydynamo.logs import get_logger
from tinydynamo.utils import dynamo_timed

from . import config, partitioners
from .aot_autograd import aot_autograd, is_flat_sequence
from .codecache import PyCodeCache
from .codegen.common import get_scheduling
from .codegen.wrapper import WrapperCodeGen
from .fx_passes.constant_folding import fold_input_independent
from .fx_passes.mm_bias import mm_bias_epilogue
from .fx_passes.pad_mm import pad_mm
from .graph import GraphLowering
from .joint_graph import AutogradCompileError
from .lowering import LoweringDeclined
from .runtime.compile_worker import start_workers
from .runtime.cudagraphs import cudagraphify
from .runtime.triton_launcher import TritonLauncher, compile_priority, warm_up_driver
from .scheduler import Scheduler
from .virtualized import V

log = logging.getLogger("tininductor.compile_fx")


def warm_up() -> None:
    """Start Triton's driver (runtime/triton_launcher.warm_up_driver) and the compile worker processes
    (runtime/compile_worker.py) in the background, once. tinydynamo calls it when it looks the backend
    up (``backends.lookup_backend``), so they warm up while the frame is still being captured;
    :func:`compile_fx` calls it too (a backend passed to torch.compile). Importing starts nothing."""
    warm_up_driver()
    if torch.cuda.is_available() and os.environ.get("TINY_TRITON_PARALLEL_COMPILE", "1") != "0" \
            and os.environ.get("TRITON_INTERPRET") != "1":
        start_workers()


def _artifacts():
    return artifacts


def compile_fx(gm: torch.fx.GraphModule, example_inputs):
    """The "tininductor" backend: ``backend(gm, example_inputs) -> callable``.

    AOT autograd lifts parameters to inputs, decomposes to prims and (when an input needs a
    gradient) splits the joint graph into forward and backward; both are compiled by
    :func:`compile_fx_inner`.
    """
    warm_up()
    try:
        cudagraphs = config.triton.cudagraphs
        fn = aot_autograd(
            partition_fn=_partitioner(),
            fw_compiler=functools.partial(compile_fx_inner, cudagraphs=cudagraphs),
            bw_compiler=functools.partial(compile_fx_inner, cudagraphs=cudagraphs, is_backward=True),
            inference_compiler=functools.partial(compile_fx_inner, cudagraphs=cudagraphs, is_inference=True),
        )(gm, example_inputs)
        # compiled now or found in the graph cache (graph_cache.py): the callable names its graphs
        # (none where the graph runs eagerly, or compiles per shape at its first call)
        graphs = list(getattr(fn, "compiled_graphs", ()))
        with dynamo_timed("triton_wait_precompile"):  # a backward's kernels: at its first call
            _wait_for_kernels([g for g in graphs if not getattr(g, "waits_at_first_call", False)])
        _expose_compiled(fn, graphs)
        return fn
    except Exception as e:
        if isinstance(e, AutogradCompileError):  # the frame's caller decides: warn + eager, or raise
            raise                            # (tinydynamo: fullgraph=True / suppress_errors=False)
        return _eager_fallback(gm, e)


def _wait_for_kernels(graphs) -> None:
    """Wait for the Triton kernels of ``graphs``, compiled in the background since their modules
    loaded: a kernel that does not compile fails the compile here."""
    for g in graphs:
        module = getattr(g, "module", None)
        if module is not None:
            _wait_for_module(module)


def _wait_for_module(module) -> None:
    for value in vars(module).values():
        if isinstance(value, TritonLauncher):
            value.wait_compiled()


def _wait_at_first_call(compiled, module, gm: torch.fx.GraphModule):
    """A backward graph: its kernels compile while the forward runs, and its first call waits for
    them (as TorchInductor compiles a backward at its first call). One that does not compile makes
    the graph run in torch from then on, with a warning (or raises, with fallback off)."""
    call = None

    def backward(*args):
        nonlocal call
        if call is None:
            try:
                with dynamo_timed("triton_wait_precompile"):
                    _wait_for_module(module)
                call = compiled
            except Exception as e:
                call = _eager_fallback(gm, e)
        return call(*args)

    backward.waits_at_first_call = True
    return backward


def _partitioner():
    # read from the module at each compile, so that a swapped partitioner (a course exercise, a test's
    # injected fault) is the one used
    choices = {"min_cut": partitioners.min_cut_partition, "default": partitioners.default_partition}
    if config.partitioner not in choices:
        raise ValueError(f"unknown tininductor partitioner {config.partitioner!r}: use one of {sorted(choices)}")
    return choices[config.partitioner]


_configured: dict = {}


def compile_fx_with_options(mode: str | None = None, options: dict | None = None):
    """The backend under ``mode=`` / ``options=`` (``tinydynamo.compile(f, mode="reduce-overhead")``).

    Modes are named sets of options (``config.MODES``); options are config names, dotted for
    sub-configs (``{"triton.cudagraphs": True}``). One backend object per setting, so compiled
    frames cached for one mode are never reused for another.
    """
    if mode is not None and mode not in config.MODES:
        raise ValueError(f"unknown mode {mode!r}: use one of {sorted(config.MODES)}")
    changes = {**config.MODES.get(mode or "default", {}), **(options or {})}
    key = tuple(sorted(changes.items()))
    if key not in _configured:
        with config.patch(changes):  # unknown option names fail here, at compile(), not at the first call
            pass

        def configured_compile_fx(gm, example_inputs):
            with config.patch(changes):
                return compile_fx(gm, example_inputs)

        configured_compile_fx.__name__ = f"compile_fx({mode or 'default'}, {dict(key)})"
        _configured[key] = configured_compile_fx
    return _configured[key]


compile_fx.with_options = compile_fx_with_options


def _eager_fallback(gm: torch.fx.GraphModule, error: Exception) -> torch.fx.GraphModule:
    """Run ``gm`` eagerly after a compiler error, with a warning (or re-raise when fallback is off)."""
    if not config.fallback_to_eager or _frame_wants_errors():
        raise error
    warnings.warn(f"tininductor failed to compile the graph ({type(error).__name__}: {error}); running it eagerly",
                  EagerFallbackWarning)
    log.debug("compile failure", exc_info=error)
    return gm


def _frame_wants_errors() -> bool:
    """tinydynamo compiles this graph for ``fullgraph=True`` or ``suppress_errors=False``: the user
    asked to see compiler errors, not a fallback (torch.compile raises BackendCompilerFailed)."""
    return errors_must_raise()


#: the graphs compile_fx_inner compiled most recently, oldest first (forward, then backward)
compiled_graphs: collections.deque = collections.deque(maxlen=32)
_compile_count = [0]


def _expose_compiled(fn, graphs) -> None:
    """Let callers (tests, notebooks) read the generated code off the backend's result.

    ``fn.compiled_graphs`` lists the compiled forward (and backward) graphs; ``fn.kernels``,
    ``fn.source`` and ``fn.fallback_reasons`` are the forward graph's.
    """
    graphs = [g for g in graphs if hasattr(g, "kernels")]
    try:
        fn.compiled_graphs = graphs
        if graphs:
            fn.kernels, fn.source = graphs[0].kernels, graphs[0].source
            fn.fallback_reasons = graphs[0].fallback_reasons
    except AttributeError:  # not a plain function
        pass


def _ensure_example_values(gm: torch.fx.GraphModule, example_inputs) -> None:
    """Lowering reads ``node.meta['val']`` in places; fill it in with fake tensors if missing."""
    if all("val" in n.meta for n in gm.graph.nodes if n.op == "call_function"):
        return

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs])


def compile_fx_inner(gm: torch.fx.GraphModule, example_inputs, cudagraphs: bool = False,
                     is_backward: bool = False, is_inference: bool = False, **_ignored):
    """Compile a prim-set graph: lower, schedule, generate, load. Returns ``f(*args) -> outputs``.

    ``cudagraphs=True`` (mode="reduce-overhead") replays the graph's kernels as one CUDA graph
    (runtime/cudagraphs.py); ``is_backward`` / ``is_inference`` say which kind of graph it is
    (a training forward otherwise), as AOT autograd's compilers are told in PyTorch.

    On an internal error it warns and returns ``gm`` itself (the graph run by torch), unless
    ``config.fallback_to_eager`` is False.
    """
    try:
        return _compile_fx_inner(gm, example_inputs, cudagraphs and _graph_kind(is_backward, is_inference),
                                 is_inference=is_inference, is_backward=is_backward)
    except Exception as e:
        return _eager_fallback(gm, e)


def _graph_kind(is_backward: bool, is_inference: bool) -> str:
    return "backward" if is_backward else "inference" if is_inference else "forward"


def _compile_fx_inner(gm: torch.fx.GraphModule, example_inputs, cudagraphs: str | bool = False,
                      is_inference: bool = False, is_backward: bool = False):
    """``cudagraphs``: False, or the graph's kind for the CUDA graph runner ("inference", ...)."""
    example_inputs = list(example_inputs)
    _ensure_example_values(gm, example_inputs)
    if config.constant_folding:
        fold_input_independent(gm)  # what reads no input: computed once, here (fx_passes/constant_folding.py)
    if config.shape_padding or config.force_shape_padding:
        pad_mm(gm)  # matmul operands to aligned sizes (fx_passes/pad_mm.py)
    if config.mm_bias_epilogue:
        mm_bias_epilogue(gm)  # a bias no generated kernel would read goes back into addmm (fx_passes/mm_bias.py)
    graph = GraphLowering(gm, example_inputs, is_inference=is_inference)
    with V.set_graph_handler(graph):
        with dynamo_timed("lowering"):
            graph.run(*example_inputs)
        _use_interpreter_if_needed(graph)
        artifacts = _artifacts()
        artifacts.record("ir", "tininductor IR (realized buffers)", artifacts.LazyText(graph.ir_text()))
        output_names = {o.get_name() for o in graph.graph_outputs if hasattr(o, "get_name")}
        with dynamo_timed("scheduling"):
            scheduler = Scheduler(graph.buffers, output_names)
        artifacts.record("ir", "fusion decisions (one FusedGroup per generated kernel)", str(scheduler))
        # Triton kernels start compiling as they are generated (compile_early), a backward's after
        # every forward kernel (the forward runs first)
        with dynamo_timed("codegen"), compile_priority(1 if is_backward else 0):
            wrapper = WrapperCodeGen(graph, scheduler)
            source = wrapper.generate()
    _check_sizes_bound(source, graph)
    for k in wrapper.kernels:
        artifacts.record("kernels", k.name, k.source)
    artifacts.record("output_code", "wrapper", source)
    _log_output_code(source)
    # C++ kernels are built here; Triton kernels start compiling in the background, a backward's
    # after every forward kernel (the forward runs first)
    with dynamo_timed("load_module"), compile_priority(1 if is_backward else 0):
        module = PyCodeCache.load(source)
    constants = list(graph.constants.values())
    spec = graph.output_spec
    call = module.call

    if is_flat_sequence(spec):
        container = spec.type  # the usual case: a flat tuple/list of outputs, no pytree walk per call

        def compiled(*args):
            return container(call([*args, *constants]))
    else:
        def compiled(*args):
            return tree_unflatten(list(call([*args, *constants])), spec)

    if cudagraphs:
        dynamic = bool(graph.size_sources) or any(isinstance(v, torch.SymInt) for v in graph.example_inputs)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        static = [i for i, n in enumerate(placeholders) if n.meta.get("static_address")]
        compiled = cudagraphify(compiled, set(graph.device_types), kind=cudagraphs, dynamic=dynamic,
                                static_input_idxs=static)
    if is_backward and not cudagraphs:  # (a CUDA graph's recording waits for its kernels at compile)
        compiled = _wait_at_first_call(compiled, module, gm)
    compiled.kind = _graph_kind(is_backward, is_inference)
    compiled.source = source
    _compile_count[0] += 1
    compiled.seq = _compile_count[0]
    compiled_graphs.append(compiled)
    compiled.kernels = [k.name for k in wrapper.kernels]
    compiled.fallback_reasons = list(graph.fallback_reasons)
    compiled.module = module
    compiled.output_strides = graph.output_strides()  # a training forward's saved layouts: for its backward
    return compiled


def _check_sizes_bound(source: str, graph) -> None:
    """Dynamic shapes: every size symbol the module uses (``s0``) must be computable from the
    call's arguments (a SymInt argument, or a dimension of an input tensor). One that is not (a
    size that only appears inside an expression, ``2*s0``) cannot be evaluated: refuse the graph
    (it then runs eagerly, with a warning) rather than compute with a wrong value."""

    if not graph.size_sources and not any(isinstance(v, torch.SymInt) for v in graph.example_inputs):
        return
    body = source[source.index("def call(args):"):]
    bound = {str(s) for s in graph.size_sources} | set(graph.graph_input_names)
    unbound = sorted(set(re.findall(r"\b[su]\d+\b", body)) - bound)
    if unbound:
        raise LoweringDeclined(f"size symbols {unbound} cannot be read from the graph's inputs")
    if re.search(r"\b(Max|Min|Piecewise|ToFloat|FloatTrueDiv)\(", source):  # sympy left unprinted
        raise LoweringDeclined("a size expression has no Python/Triton form here (Max/Min of sizes the ShapeEnv "
                          "cannot order)")


def _use_interpreter_if_needed(graph) -> None:
    """CPU graphs on the Triton path need TRITON_INTERPRET=1 before any kernel is jitted.

    The variable is process-wide and read when ``@triton.jit`` decorates, so it is only set
    where no real GPU kernel can exist: a graph with CUDA tensors never switches it, and in a
    process that can use CUDA a CPU-only graph on the Triton path is refused (compile_fx then
    falls back to eager with a warning) rather than turning every later kernel into an
    interpreted one.
    """
    if "cpu" not in graph.device_types or "cuda" in graph.device_types:
        return
    if os.environ.get("TRITON_INTERPRET") == "1":
        return

    if getattr(get_scheduling(torch.device("cpu")), "kind", None) != "triton":
        return
    if torch.cuda.is_available():
        raise RuntimeError(
            "CPU tensors on the Triton path need the Triton interpreter, which cannot share a process "
            "with real CUDA kernels; use tininductor.config.cpu_backend = 'cpp', or CUDA tensors, or set "
            "TRITON_INTERPRET=1 before triton is imported"
        )
    os.environ["TRITON_INTERPRET"] = "1"


def _log_output_code(source: str) -> None:
    """``TINY_LOGS=output_code`` (or ``tinydynamo.logs.set_logs(output_code=True)``) prints the wrapper."""
    get_logger("output_code").info("Output code (tininductor wrapper module):\n%s", source)


class _CallableModule(types.ModuleType):
    """``tininductor.compile_fx`` names both this module and the backend function.

    Importing the submodule rebinds the package attribute to the module, so the module
    itself is made callable: ``torch.compile(f, backend=tininductor.compile_fx)`` always works.
    """

    def __call__(self, gm, example_inputs):
        return compile_fx(gm, example_inputs)

    def with_options(self, mode=None, options=None):
        return compile_fx_with_options(mode, options)


compile_fx.warm_up = warm_up  # what tinydynamo's lookup_backend calls for backend="tininductor"
sys.modules[__name__].__class__ = _CallableModule
