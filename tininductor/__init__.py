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
}

__getattr__, __dir__ = lazy_attributes(globals(), _LAZY)
