"""tinydynamo: capture Python functions and nn.Modules into torch.fx graphs, as TorchDynamo does.

Torch-free parts (the bytecode layer) import without torch, so they can be tested on any
Python; everything else is loaded on first use (PEP 562).
"""
from tinydynamo._lazy import lazy_attributes

#: The layers, top (entry points) to bottom (leaves). A module imports modules of its own layer or
#: below, never above, and no two modules import each other (tests/test_layering.py reads this).
#: What a lower layer must call above it is passed down: convert_frame hands eval_frame's
#: ``wrap_for_resume`` to the OutputGraph; variables/ reach the interpreter through ``tx``.
LAYERS = (
    ("api", "compiler", "explanation", "instructor_view", "testing", "tracer", "viz"),  # user-facing tools
    ("eval_frame",),        # optimize/compile/disable/reset, the per-code cache, OptimizedModule
    ("convert_frame",),     # a cache miss: compile the frame into a new cache entry
    ("symbolic_convert",),  # the symbolic bytecode interpreter (InstructionTranslator)
    ("output_graph",),      # the frame's FX graph, its guards, the backend call, the code that runs it
    ("codegen", "side_effects"),  # Python source for the transformed frame; mutations replayed after it
    # what the interpreter's values are (VariableTracker), from wrapping a real value down to the base class;
    # a tracker that must make one of a higher layer asks for it by name (variables/base.py: constructor)
    ("variables", "variables.builder", "variables.dataclasses"),  # a real value -> its tracker, with guards
    ("variables.objects", "variables.generator"),  # calling a class: new objects, super(), named tuples,
    # polyfilled classes; generator objects made in the frame (their bodies run lazily)
    ("variables.polyfilled",),   # library functions and classes traced another way (tinydynamo.polyfills)
    ("variables.iter",),         # lazy iterators, functools.partial, sets, collections containers
    ("variables.builtin",),      # builtins, operator and math functions over every kind below
    ("variables.nn_module", "variables.module_hooks"),  # nn.Modules, their forward inlined between hooks
    ("variables.numpy",),        # NumPy arrays as tensor nodes, NumPy calls as torch._numpy ops
    ("variables.autograd_function", "variables.torch_function"),  # autograd.Function, __torch_function__
    ("variables.tensor", "variables.torch", "variables.user_defined", "variables.list_subclass", "variables.dicts",
     "variables.exceptions",
     "trace_rules"),
    ("variables.lists", "variables.ctx_manager"),  # sequences and iterators; grad-mode context managers
    ("variables.functions", "variables.sym_node", "variables.autocast", "variables.misc_ctx"),
    ("variables.constant",),     # a Python value known at trace time
    ("variables.misc", "variables.base"),  # VariableTracker and its construction registry; bound attributes
    ("guards", "symbolic_shapes", "backends", "distributed", "skip_frame", "resume", "decompile", "artifacts",
     "polyfills", "source", "bytecode", "registry", "utils", "logs", "exc", "config", "_lazy"),  # leaves
)

# public name -> "module:attribute" ("module:" for the module itself), loaded on first use
_LAZY = {
    "artifacts": "tinydynamo.artifacts:",
    "tracer": "tinydynamo.tracer:",
    "bytecode": "tinydynamo.bytecode:",
    "optimize": "tinydynamo.eval_frame:optimize",
    "compile": "tinydynamo.eval_frame:compile",
    "disable": "tinydynamo.eval_frame:disable",
    "reset": "tinydynamo.eval_frame:reset",
    "cache_info": "tinydynamo.eval_frame:cache_info",
    "counters": "tinydynamo.convert_frame:counters",
    "OptimizedModule": "tinydynamo.eval_frame:OptimizedModule",
    "config": "tinydynamo.config:",
    "Unsupported": "tinydynamo.exc:Unsupported",
    "register_backend": "tinydynamo.backends:register_backend",
    "list_backends": "tinydynamo.backends:list_backends",
    "lookup_backend": "tinydynamo.backends:lookup_backend",
    "logs": "tinydynamo.logs:",
    "set_logs": "tinydynamo.logs:set_logs",
    "testing": "tinydynamo.testing:",
    "explain": "tinydynamo.explanation:explain",
    "show": "tinydynamo.instructor_view:show",
    "ExplainOutput": "tinydynamo.explanation:ExplainOutput",
    "allow_in_graph": "tinydynamo.api:allow_in_graph",
    "disallow_in_graph": "tinydynamo.api:disallow_in_graph",
    "graph_break": "tinydynamo.api:graph_break",
    "run": "tinydynamo.api:run",
    "export": "tinydynamo.api:export",
    "is_compiling": "tinydynamo.api:is_compiling",
    "compiler": "tinydynamo.compiler:",
    "mark_dynamic": "tinydynamo.symbolic_shapes:mark_dynamic",
    "maybe_mark_dynamic": "tinydynamo.symbolic_shapes:maybe_mark_dynamic",
    "mark_static": "tinydynamo.symbolic_shapes:mark_static",
}

__getattr__, __dir__ = lazy_attributes(globals(), _LAZY)
