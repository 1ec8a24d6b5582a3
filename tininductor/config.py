

"""tininductor knobs. Change them at runtime (``tininductor.config.cpu_backend = "triton"``)."""
import contextlib
import os
import sys

#: CPU kernels: "cpp" (C++/OpenMP, codegen/cpp.py), "triton" (the Triton interpreter,
#: TRITON_INTERPRET=1; slow, for tests), or "auto" (cpp when available, else triton).
cpu_backend: str = os.environ.get("TINY_CPU_BACKEND", "auto")

#: On a compiler error, warn and run the graph eagerly instead of raising.
fallback_to_eager: bool = os.environ.get("TINY_INDUCTOR_RAISE", "0") != "1"

#: Lower embedding/gather/index/index_put/scatter_add to indirect loads and stores
#: (``ops.indirect_indexing``) on backends that declare ``supports_indirect_indexing``; False runs
#: them in torch.
indirect_indexing: bool = True

#: Split a reduction that leaves few outputs over a long range (batch norm's per-channel
#: statistics: 64 outputs, each over 400k elements) into two: the inner reduced dims per outer
#: index, then the outer ones, as TorchInductor's split reductions do. Only on backends that declare
#: ``splits_reductions`` (Triton: one program per output row would leave most of a GPU idle).
split_reductions: bool = os.environ.get("TINY_SPLIT_REDUCTIONS", "1") != "0"

#: Which partitioner splits training graphs: "min_cut" (save the fewest bytes, recompute cheap
#: pointwise ops in the backward, where they fuse into kernels the backward runs anyway; what
#: TorchInductor does) or "default" (save every forward value the backward reads, as eager does).
partitioner: str = os.environ.get("TINY_PARTITIONER", "min_cut")

#: Decompose batch norm (eval and training, running-statistic updates included) into a reduction and
#: pointwise ops (decompositions.py), so it fuses with its neighbours; False keeps the ATen op as a
#: fallback kernel (its VJP rule calls ``native_batch_norm_backward``).
decompose_batch_norm: bool = os.environ.get("TINY_DECOMPOSE_BATCH_NORM", "1") != "0"
#: The same for training-mode batch norm (batch statistics, running-statistic updates), off by
#: default. When on it decomposes after AD, as TorchInductor does: AD takes the op's VJP rule and
#: ``native_batch_norm_backward`` becomes ATen's formula (decompositions.py). On an H200 (bf16
#: training step, tiny vs torch.compile, on against off in one process) it saves 20-35% of GPU time
#: but adds 200-250 launches to steps bound by the host: ResNeXt-50 0.93x against 1.14x, ResNet-50
#: 0.78x against 1.12x, DenseNet-121 0.82x against 1.01x; EfficientNet-B0's squeeze-excitation
#: gradients come out 3.5x eager's distance from float64. See tininductor/README.md.
decompose_batch_norm_training: bool = os.environ.get("TINY_DECOMPOSE_BATCH_NORM_TRAINING", "0") != "0"

#: Inference graphs take their parameters and buffers as constants: what depends only on them is
#: computed once at compile time, and batch norm is folded into the convolution before it
#: (fx_passes/freezing.py). Off by default, as in torch.compile: the compiled function then ignores
#: later changes to the weights.
freezing: bool = os.environ.get("TINY_FREEZING", "0") == "1"

#: Parts of a graph that read no graph input (Swin's shifted-window attention mask, built by stores
#: into ``new_zeros``) are computed once at compile time and passed in as constants
#: (fx_passes/constant_folding.py); a folded value larger than ``constant_folding_max_bytes`` stays
#: in the graph.
constant_folding: bool = os.environ.get("TINY_CONSTANT_FOLDING", "1") != "0"
constant_folding_max_bytes: int = 16 * 2 ** 20

#: ``cat`` of up to this many inputs is one Pointwise that picks its input per element (it fuses with
#: the producers and the consumers); more inputs store into their slices of the output, one kernel
#: each (lowering.py's ``cat``; TorchInductor's option of the same name). A backend with masked
#: loads (Triton) reads only the input an element comes from, so there the limit is
#: ``max_pointwise_cat_inputs_masked``: DenseNet's concatenations of up to 25 feature maps stay
#: fused with the batch norm that reads them instead of one copy kernel per input.
max_pointwise_cat_inputs: int = 8
max_pointwise_cat_inputs_masked: int = 32

#: The most nodes the scheduler puts in one kernel (TorchInductor's option of the same name). A
#: bigger kernel saves no more memory traffic than its parts, and Triton's compile time grows
#: faster than its size: a kernel of 67 nodes, 126 loads and 64 stores took 13 s.
max_fusion_size: int = 64

#: Generate a kernel once per structure (scheduler.FusedGroup.structure): the repeated layers of a
#: model give the same kernels, and the wrapper calls the first with each layer's buffers.
#: ``check_kernel_reuse`` (``TINY_CHECK_KERNEL_REUSE=1``, on in the test suite) generates every
#: reused kernel anyway and raises unless its code is the reused one's.
reuse_kernels_by_structure: bool = os.environ.get("TINY_REUSE_KERNELS", "1") != "0"
check_kernel_reuse: bool = os.environ.get("TINY_CHECK_KERNEL_REUSE", "0") == "1"

#: Memory planning in the wrapper (TorchInductor's ``memory_planning`` reuse): a buffer whose last
#: reader has run is handed to the next allocation of the same size, strides, dtype and device
#: (``buf7 = buf3; del buf3  # reuse``) instead of being freed and allocated again: one allocator
#: call fewer per reuse on the cached call's host path, unless holding the dead buffer until then
#: would raise the graph's peak memory (``WrapperCodeGen._hold``). ``TINY_REUSE_BUFFERS=0``: off.
reuse_buffers: bool = os.environ.get("TINY_REUSE_BUFFERS", "1") != "0"

#: Pad matmul operands to sizes that are multiples of 16 bytes where it pays: CUDA, half precision,
#: big matmuls (fx_passes/pad_mm.py; TorchInductor's ``shape_padding``). ``force_shape_padding``
#: pads every unaligned matmul, on any device and dtype (tests).
shape_padding: bool = os.environ.get("TINY_SHAPE_PADDING", "1") != "0"
force_shape_padding: bool = False
#: the most a padded dim may grow (0.1: 10%) for the padding to be taken without ``force_shape_padding``
pad_mm_max_growth: float = 0.1

#: ``mm`` + ``add`` of a bias that only library kernels and graph outputs read (through views) runs as
#: ``addmm``, the bias added in the matmul's epilogue, instead of a kernel of its own (fx_passes/mm_bias.py).
mm_bias_epilogue: bool = os.environ.get("TINY_MM_BIAS_EPILOGUE", "1") != "0"

#: Inference graphs with convolutions on CUDA (cuDNN) or on the CPU with oneDNN
#: (``torch.backends.mkldnn``) give their convolutions channels-last inputs, and each
#: 4-D pointwise buffer the memory order of what it reads (graph.py's ``preferred_order``;
#: TorchInductor's options of the same names). ``force_layout_optimization``:
#: every convolution graph, on any device (tests).
layout_optimization: bool = os.environ.get("TINY_LAYOUT_OPT", "1") != "0"
force_layout_optimization: bool = False
#: training graphs too, on CUDA: the forward's saved activations keep the layout it chose and the
#: backward is compiled for it (aot_autograd), as TorchInductor lays out training graphs. Off by
#: default: on an H200 it speeds up the training step of some convolution nets and slows others
#: (README, the model dashboard)
layout_optimization_training: bool = os.environ.get("TINY_LAYOUT_OPT_TRAINING", "0") == "1"
#: Under layout optimization a convolution weight that is a graph input (a parameter) but not
#: channels-last is converted by a generated copy kernel in every call (as TorchInductor does).
#: With this on, it is converted once and the copy reused across calls while the weight's version
#: counter and data pointer are unchanged (runtime/conv_weights.py): cheaper, but a write through
#: ``p.data`` (an old-style EMA update) bypasses the version counter and would be missed, so it is
#: opt-in, for code that updates weights only through the parameters themselves.
cache_conv_weights: bool = os.environ.get("TINY_CACHE_CONV_WEIGHTS", "0") == "1"

#: On GPUs a convolution's bias is added by the kernel that reads the convolution's output (a pointwise
#: add fused into it) instead of by cuDNN in a kernel of its own (graph.py's ``convolution``;
#: TorchInductor does the same). ``force_split_conv_bias``: on any device (tests).
split_conv_bias: bool = os.environ.get("TINY_SPLIT_CONV_BIAS", "1") != "0"
force_split_conv_bias: bool = False

#: What a generated kernel is named after (``triton_per_fused_<names>_0``; TorchInductor's
#: ``triton.descriptive_names``): "inductor_node", the ops of the FX nodes it fuses (``amax_sub_exp``),
#: or "original_aten", the op each node was decomposed from (``softmax``), which ``decompose``
#: records in ``node.meta["original_aten"]``; a node with none is named after its own op.
descriptive_names: str = "inductor_node"

#: Directory the debug dump writes wrapper modules to (TINY_LOGS=output_code also prints them).
debug_dir: str = os.environ.get("TINY_DEBUG_DIR", "tiny_debug")

#: a graph of the same form as one compiled before (another block of a model's repeated layers,
#: after a graph break in the loop over them) reuses that compile (graph_cache.py)
graph_cache: bool = os.environ.get("TINY_GRAPH_CACHE", "1") != "0"


class triton:
    """Triton choices: block sizes, and CUDA graphs."""

    #: record inference graphs on CUDA as CUDA graphs and replay them (mode="reduce-overhead";
    #: runtime/cudagraphs.py): one replay instead of one launch per kernel
    cudagraphs: bool = False

    #: time a few block-size/warp candidates per kernel at its first launch on a GPU and keep the
    #: fastest (mode="max-autotune"; runtime/autotune.py); the choice is kept in the code cache
    max_autotune: bool = False

    #: software-pipelining stages of the generated kernels' loops (Triton's default: 3). Pointwise and
    #: reduction kernels have no matmul loop to pipeline: 1, TorchInductor's choice for them, gives
    #: them less to compile (on an H200, densenet121 and regnet training: the same GPU time as 3)
    num_stages: int = int(os.environ.get("TINY_TRITON_NUM_STAGES", "1"))

    #: reductions with rnumel up to this keep the whole row in registers (persistent)
    persistent_reduction_max: int = 4096
    #: column-wise ("outer") reductions longer than this loop over a tile of XBLOCK columns
    #: (16-64 of them, read side by side) instead of keeping a few whole columns in registers
    outer_persistent_max: int = 256
    #: RBLOCK of looped reductions
    looped_rblock: int = 2048
    #: programs an outer reduction's grid should have (about the SM count of a big GPU): its
    #: XBLOCK shrinks from 64 towards 16 until the grid is this large
    min_programs: int = 128
    #: XBLOCK cap of pointwise kernels
    max_xblock: int = 1024
    #: cap on XBLOCK * RBLOCK for reductions
    max_reduction_block: int = 4096
    #: kernels compiled for dynamic shapes (sizes as int arguments) launch through the direct
    #: launcher, like static ones, with the sizes' specialisation (``== 1``, ``% 16 == 0``) in the
    #: variant key (checked on an H100: tests/test_inductor_dynamic.py, bench/dynamic_shapes.py);
    #: ``TINY_DIRECT_LAUNCH_DYNAMIC=0``: through Triton's own ``kernel[grid](...)`` instead
    #: (runtime/triton_launcher.py, ``run_grid``)
    direct_launch_dynamic: bool = os.environ.get("TINY_DIRECT_LAUNCH_DYNAMIC", "1") != "0"


#: ``torch.compile``-style modes -> the config they set (``tinydynamo.compile(f, mode=...)``)
MODES: dict[str, dict] = {
    "default": {},
    "reduce-overhead": {"triton.cudagraphs": True},
    "max-autotune": {"triton.max_autotune": True, "triton.cudagraphs": True},
    "max-autotune-no-cudagraphs": {"triton.max_autotune": True},
}


def snapshot() -> tuple:
    """Every option's current value, as ``(("name", value), ("triton.name", value), ...)``: part of a
    compile's cache key (graph_cache.py)."""
    module = sys.modules[__name__]

    def options(owner, prefix):
        return [(prefix + name, value) for name, value in sorted(vars(owner).items())
                if not name.startswith("_") and isinstance(value, (bool, int, float, str, type(None)))]

    return tuple(options(module, "") + options(triton, "triton."))


@contextlib.contextmanager
def patch(changes: dict):
    """Set ``{"name": value, "triton.name": value}`` for the duration of a ``with`` block."""
    module = sys.modules[__name__]
    saved = []
    try:
        for dotted, value in changes.items():
            *path, name = dotted.split(".")
            owner = module
            for part in path:
                owner = getattr(owner, part)
            if not hasattr(owner, name):
                raise ValueError(f"unknown tininductor option {dotted!r}")
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
