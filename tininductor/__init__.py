"""tininductor: AOT autograd, decompositions, a loop IR with fusion, and Triton/C++ code generation.

Public names are loaded on first use (PEP 562), so importing the package stays cheap.
"""
from tinydynamo._lazy import lazy_attributes

#: The layers, top (the backend) to bottom (leaves). A module imports modules of its own layer or
#: below, never above, and no two modules import each other (tests/test_layering.py reads this).
#: Kernel backends register themselves with codegen/common.py; lowering.py tells virtualized.py how
#: to compute a symbolic constant: the lower layer is told, it never imports up.
LAYERS = (
    ("compile_fx", "testing"),                # the backend: FX graph in, compiled callable out
    ("aot_autograd",),                        # lift parameters, decompose, joint graph, partition
    ("partitioners", "joint_graph"),          # forward/backward split; the joint graph and its VJPs
    ("decompositions", "vjp_rules", "prims", "fx_passes"),  # aten -> prims; a VJP rule per prim; graph passes
    ("graph",),                               # GraphLowering: FX nodes -> IR buffers
    ("codegen.wrapper",),                     # the call(args) module around the kernels
    ("codegen.triton", "codegen.cpp", "codegen.triton_helpers"),  # kernel backends
    ("scheduler",),                           # buffers -> fused groups (kernels)
    ("lowering",),                            # one function per prim, returning IR
    ("ir",),                                  # Pointwise / Reduction / views / StorageBox
    ("virtualized",),                         # V and ops: the swappable ops handler
    ("codegen.common", "codegen", "runtime", "codecache", "graph_cache", "cpp_builder", "aliasing", "indexing",
     "op_recorder", "ops_table", "registry", "config"),  # leaves: kernel protocol, runtime, caches, index
                                                         # maths, a lean op tracer, op table
)

# public name -> "module:attribute" ("module:" for the module itself), loaded on first use
_LAZY = {
    "prims": "tininductor.prims:",
    "decompose": "tininductor.decompositions:decompose",
    "compile_fx": "tininductor.compile_fx:compile_fx",
    "compile_fx_inner": "tininductor.compile_fx:compile_fx_inner",
    "config": "tininductor.config:",
    "PyCodeCache": "tininductor.codecache:PyCodeCache",
    "CppCodeCache": "tininductor.codecache:CppCodeCache",
    "ir": "tininductor.ir:",
    "lowering": "tininductor.lowering:",
    "V": "tininductor.virtualized:V",
    "ops": "tininductor.virtualized:ops",
    "GraphLowering": "tininductor.graph:GraphLowering",
    "Scheduler": "tininductor.scheduler:Scheduler",
    "decompositions": "tininductor.decompositions:",
    "vjp_rules": "tininductor.vjp_rules:",
    "aot_autograd": "tininductor.aot_autograd:aot_autograd",
    "aot_eager": "tininductor.aot_autograd:aot_eager",
    "aot_eager_min_cut": "tininductor.aot_autograd:aot_eager_min_cut",
    "default_partition": "tininductor.partitioners:default_partition",
    "min_cut_partition": "tininductor.partitioners:min_cut_partition",
}

__getattr__, __dir__ = lazy_attributes(globals(), _LAZY)
