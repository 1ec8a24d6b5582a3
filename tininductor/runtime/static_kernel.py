"""StaticKernel: a compiled Triton kernel loaded for torch's prebuilt CUDA launcher.

Triton launches a kernel through a small C module it generates for the kernel's signature and
builds with gcc (plus, once, its ``cuda_utils`` driver module): in an empty cache that is ~0.2 s
per new signature, on the critical path of a cold compile. torch ships one launcher, built with
torch, that takes the argument types as a string (``"OOi"``: two pointers, an int32) and the
loaded cubin; TorchInductor uses it by default (``StaticallyLaunchedCudaKernel``,
torch/_inductor/runtime/static_triton_launcher.py).

Loading a kernel this way needs a few facts and the cubin file, nothing of Triton's: a
:class:`KernelBinary`. A compile worker process (runtime/compile_worker.py) sends one back with
each kernel it compiled, and the main process loads the cubin straight away. Going through
Triton's JIT instead (``fn.warmup``: bind the arguments, specialise, hash, read the cache's
metadata and every intermediate file) is Python that holds the GIL while the main process
compiles the next graph: BART's training step made 84 such loads, 15-53 s of thread time in all
on an H200 host.
"""
from __future__ import annotations

import dataclasses
import os

import torch


def static_launcher():
    """``torch._C._StaticCudaLauncher`` (torch >= 2.8 on CUDA), or None.
    ``TINY_STATIC_LAUNCHER=0`` keeps Triton's own launchers."""
    if os.environ.get("TINY_STATIC_LAUNCHER", "1") == "0" or torch.version.hip is not None:
        return None
    return getattr(torch._C, "_StaticCudaLauncher", None)


# Triton's signature types -> the argument codes of torch's launcher (its StaticallyLaunchedCudaKernel)
_ARG_CODES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H",
              "u32": "I", "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "fp64": "d"}

#: what KernelBinary.of raises for a kernel torch's launcher cannot take (Triton's own launches it)
UNSUPPORTED = (NotImplementedError, KeyError, AttributeError, TypeError, ValueError)


@dataclasses.dataclass(frozen=True)
class KernelBinary:
    """A compiled kernel as torch's launcher takes it: picklable, with nothing of Triton in it.

    ``types``: one code per argument the cubin takes (``"O"`` a pointer); ``keep``: positions of
    the runtime arguments the cubin takes (Triton folds an int equal to 1 into the kernel as a
    constant; None when all are kept); ``extra``: how many trailing scratch-pointer arguments newer
    Tritons add (passed as null, as TorchInductor does).
    """

    cubin: str
    name: str
    types: str
    keep: tuple[int, ...] | None
    extra: int
    num_warps: int
    shared: int

    @classmethod
    def of(cls, compiled) -> "KernelBinary":
        """The binary of Triton's ``CompiledKernel``; raises one of :data:`UNSUPPORTED` where
        torch's launcher cannot take it (no single cubin, clusters, scratch memory, an argument
        type it cannot pass, another Triton)."""
        meta = compiled.metadata
        cubins = [p for p in compiled.metadata_group.values() if str(p).endswith(".cubin")]
        if len(cubins) != 1 or getattr(meta, "num_ctas", 1) != 1:
            raise NotImplementedError("no single cubin, or clusters")
        src = compiled.src
        names = src.fn.arg_names
        folded = {k[0] if isinstance(k, tuple) else names.index(k) for k in getattr(src, "constants", {})}
        keep, types = [], ""
        for i, name in enumerate(names):
            ty = src.signature.get(name, "constexpr")
            if ty == "constexpr" or i in folded:
                continue
            keep.append(i)
            types += "O" if ty.startswith("*") else _ARG_CODES[ty]  # KeyError: a type it cannot pass
        extra = 0
        for scratch in ("global_scratch_size", "profile_scratch_size"):
            if hasattr(meta, scratch):
                if getattr(meta, scratch):
                    raise NotImplementedError(f"{scratch} > 0")
                types += "O"
                extra += 1
        runtime = [i for i in range(len(names)) if i not in src.fn.constexprs]  # what a launch passes
        return cls(str(cubins[0]), compiled.name, types, None if keep == runtime else tuple(keep), extra,
                   meta.num_warps, meta.shared)

    @classmethod
    def describe(cls, compiled) -> "KernelBinary | None":
        """:meth:`of`, or None where torch's launcher does not apply (none here, or not its kind of kernel)."""
        if static_launcher() is None or not hasattr(compiled, "metadata_group"):
            return None
        try:
            return cls.of(compiled)
        except UNSUPPORTED:
            return None


class StaticKernel:
    """A :class:`KernelBinary` loaded on a device (its cubin, through torch's launcher): what a
    launch calls (``launch(function, grid_x, grid_y, grid_z, num_warps, shared, types, args, stream)``)."""

    def __init__(self, binary: KernelBinary, launcher, device: int):
        self.types, self.num_warps, self.shared = binary.types, binary.num_warps, binary.shared
        self.keep, self.extra = binary.keep, (None,) * binary.extra
        self.launch = launcher._launch_kernel
        self.function, self.n_regs, self.n_spills = launcher._load_kernel(binary.cubin, binary.name,
                                                                          binary.shared, device)

    @classmethod
    def from_binary(cls, binary: KernelBinary, device: int) -> "StaticKernel | None":
        """Load a binary a worker compiled; None where torch's launcher is not there (or fails)."""
        launcher = static_launcher()
        if launcher is None:
            return None
        try:
            return cls(binary, launcher, device)
        except (RuntimeError, OSError):  # the cubin went missing; Triton's warmup compiles it again
            return None

    @classmethod
    def load(cls, compiled) -> "StaticKernel | None":
        """Triton's compiled kernel loaded for torch's launcher (once per compiled kernel), or None
        where that does not apply."""
        cached = getattr(compiled, "_tiny_static", False)
        if cached is False:
            binary = KernelBinary.describe(compiled)
            cached = None
            if binary is not None:
                try:
                    cached = cls(binary, static_launcher(), torch.cuda.current_device())
                except UNSUPPORTED:
                    pass
            compiled._tiny_static = cached
        return cached
