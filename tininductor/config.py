"""tininductor knobs. Change them at runtime (``tininductor.config.cpu_backend = "triton"``)."""
import os

#: CPU kernels: "cpp" (C++/OpenMP, codegen/cpp.py), "triton" (the Triton interpreter,
#: TRITON_INTERPRET=1; slow, for tests), or "auto" (cpp when available, else triton).
cpu_backend: str = os.environ.get("TINY_CPU_BACKEND", "auto")

#: On a compiler error, warn and run the graph eagerly instead of raising.
fallback_to_eager: bool = os.environ.get("TINY_INDUCTOR_RAISE", "0") != "1"

#: Directory the debug dump writes wrapper modules to (TINY_LOGS=output_code also prints them).
debug_dir: str = os.environ.get("TINY_DEBUG_DIR", "tiny_debug")


class triton:
    """Triton block-size choices."""

    #: reductions with rnumel up to this keep the whole row in registers (persistent)
    persistent_reduction_max: int = 1024
    #: RBLOCK of looped reductions
    looped_rblock: int = 128
    #: XBLOCK cap of pointwise kernels
    max_xblock: int = 1024
    #: cap on XBLOCK * RBLOCK for reductions
    max_reduction_block: int = 4096
