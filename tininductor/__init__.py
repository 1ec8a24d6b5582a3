"""tininductor: AOT autograd, decompositions, a loop IR with fusion, and Triton/C++ code generation.

Public names are loaded on first use (PEP 562), so importing the package stays cheap.
"""
from tinydynamo._lazy import lazy_attributes

# public name -> "module:attribute" ("module:" for the module itself), loaded on first use
_LAZY = {
    "prims": "tininductor.prims:",
    "decompose": "tininductor.decompositions:decompose",
    "compile_fx": "tininductor.compile_fx:compile_fx",
    "compile_fx_inner": "tininductor.compile_fx:compile_fx_inner",
    "config": "tininductor.config:",
    "decompositions": "tininductor.decompositions:",
    "vjp_rules": "tininductor.vjp_rules:",
    "aot_autograd": "tininductor.aot_autograd:aot_autograd",
    "aot_eager": "tininductor.aot_autograd:aot_eager",
    "aot_eager_min_cut": "tininductor.aot_autograd:aot_eager_min_cut",
    "default_partition": "tininductor.partitioners:default_partition",
    "min_cut_partition": "tininductor.partitioners:min_cut_partition",
}

__getattr__, __dir__ = lazy_attributes(globals(), _LAZY)
