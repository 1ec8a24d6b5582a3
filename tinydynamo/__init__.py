"""tinydynamo: capture Python functions and nn.Modules into torch.fx graphs, as TorchDynamo does.

Torch-free parts (the bytecode layer) import without torch, so they can be tested on any
Python; everything else is loaded on first use (PEP 562).
"""
from tinydynamo._lazy import lazy_attributes

# public name -> "module:attribute" ("module:" for the module itself), loaded on first use
_LAZY = {
    "artifacts": "tinydynamo.artifacts:",
    "tracer": "tinydynamo.tracer:",
}

__getattr__, __dir__ = lazy_attributes(globals(), _LAZY)
