"""tinydynamo: capture Python functions and nn.Modules into torch.fx graphs, as TorchDynamo does.

Torch-free parts (the bytecode layer) import without torch, so they can be tested on any
Python; everything else is loaded on first use (PEP 562).
"""
from tinydynamo._lazy import lazy_attributes

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
