"""StaticKernel: a compiled Triton kernel loaded for torch's prebuilt CUDA launcher.

Triton launches a kernel through a small C module it generates for the kernel's signature and
builds with gcc (plus, once, its ``cuda_utils`` driver module): in an empty cache that is ~0.2 s
per new signature, on the critical path of a cold compile. torch ships one launcher, built with
torch, that takes the argument types as a string (``"OOi"``: two pointers, an int32) and the
loaded cubin; TorchInductor uses it by default (``StaticallyLaunchedCudaKernel``,
torch/_inductor/runtime/static_triton_launcher.py).

Loading a kernel this way needs a few facts and the cubin file, nothing of Triton's: a
:class:`KernelBinary` (defined in runtime/compile_server.py, the workers' side, which does not
import torch). A compile worker process sends one back with each kernel it compiled, and the main
process loads the cubin straight away. Going through
Triton's JIT instead (``fn.warmup``: bind the arguments, specialise, hash, read the cache's
metadata and every intermediate file) is Python that holds the GIL while the main process
compiles the next graph: BART's training step made 84 such loads, 15-53 s of thread time in all
on an H200 host.
"""
from __future__ import annotations

import os

import torch

from .compile_server import UNSUPPORTED, KernelBinary


def static_launcher():
    """``torch._C._StaticCudaLauncher`` (torch >= 2.8 on CUDA), or None.
    ``TINY_STATIC_LAUNCHER=0`` keeps Triton's own launchers."""
    if os.environ.get("TINY_STATIC_LAUNCHER", "1") == "0" or torch.version.hip is not None:
        return None
    return getattr(torch._C, "_StaticCudaLauncher", None)


def describe(compiled) -> KernelBinary | None:
    """The binary of Triton's compiled kernel (``KernelBinary.of``), or None where torch's launcher
    does not apply (none here, or not its kind of kernel)."""
    if static_launcher() is None or not hasattr(compiled, "metadata_group"):
        return None
    try:
        return KernelBinary.of(compiled)
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
            binary = describe(compiled)
            cached = None
            if binary is not None:
                try:
                    cached = cls(binary, static_launcher(), torch.cuda.current_device())
                except UNSUPPORTED:
                    pass
            compiled._tiny_static = cached
        return cached
