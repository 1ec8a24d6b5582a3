"""Chapter 9: C++ code generation and the code cache.

Each function below is a real piece of tininductor's C++ backend. The graded tests plug your
version into the pipeline -- ``compile_fx`` with ``config.cpu_backend = "cpp"``, g++, ctypes --
and compare what comes out with eager PyTorch.

* 9.1 ``cpp_op_strings``: op -> C++ format string entries of the ops handler (``CPP_OPS``).
* 9.2 ``reduction_code``: how a reduction starts, folds one value in, and tells OpenMP about it.
* 9.3 ``row_sum_source``: a whole C++ reduction kernel by hand, OpenMP-parallel and vectorisable.
* 9.4 ``write_atomic``: how the code cache writes a file so no reader ever sees half of it.
* 9.5 ``entry_is_intact``: how the code cache refuses a truncated or corrupt library.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def cpp_op_strings() -> dict[str, str]:
    """C++ expression templates for five ops; ``{0}``, ``{1}``, ``{2}`` are the operands.

    Operands are variable names (``tmp3``) or parenthesised expressions, so a template may use
    one several times. Match eager PyTorch exactly, NaN included: ``torch.relu(nan)`` is nan and
    ``torch.maximum(x, nan)`` is nan -- ``std::max`` gets both wrong.
    """
    # BEGIN SOLUTION (Exercise 9.1: C++ expressions that match eager exactly, NaN included; checked in the C++ backend (notebook 09, Exercise 9.1))
    return {
        "sigmoid": "1 / (1 + std::exp(-{0}))",
        "relu": "({0} < 0 ? 0 : {0})",                                  # a NaN is not < 0: passes through
        "maximum": "(({0} != {0} || {0} > {1}) ? {0} : {1})",          # NaN in either operand wins
        "where": "({0} ? {1} : {2})",
        "rsqrt": "1 / std::sqrt({0})",
    }
    # END SOLUTION


def reduction_code(reduction_type: str, acc_type: str) -> tuple[str, str, str]:
    """``(init, update, omp)`` for a reduction whose accumulator has C++ type ``acc_type``.

    * ``init``: the C++ initial value (e.g. ``static_cast<double>(0)``; for max, minus infinity
      for float/double and ``std::numeric_limits<T>::lowest()`` for integers);
    * ``update``: one statement folding ``{value}`` into ``{acc}`` (placeholders kept verbatim);
    * ``omp``: the OpenMP reduction identifier for ``#pragma omp simd reduction(<omp>:acc)``.
      ``+`` and ``*`` are built in; max/min must propagate NaN, so use the prelude's
      ``tiny_max`` / ``tiny_min`` functions and their declared reductions of the same names.

    Handle ``"sum"``, ``"prod"``, ``"max"`` and ``"min"``; raise NotImplementedError otherwise.
    """
    # BEGIN SOLUTION (Exercise 9.2: the pieces of four reductions for any accumulator type; checked in the C++ backend on floats, ints and NaN (notebook 09, Exercise 9.2))
    floating = acc_type in ("float", "double")
    if reduction_type == "sum":
        return f"static_cast<{acc_type}>(0)", "{acc} += {value}", "+"
    if reduction_type == "prod":
        return f"static_cast<{acc_type}>(1)", "{acc} *= {value}", "*"
    if reduction_type == "max":
        init = f"-std::numeric_limits<{acc_type}>::infinity()" if floating else f"std::numeric_limits<{acc_type}>::lowest()"
        return init, "{acc} = tiny_max({acc}, {value})", "tiny_max"
    if reduction_type == "min":
        init = f"std::numeric_limits<{acc_type}>::infinity()" if floating else f"std::numeric_limits<{acc_type}>::max()"
        return init, "{acc} = tiny_min({acc}, {value})", "tiny_min"
    raise NotImplementedError(f"reduction {reduction_type!r}")
    # END SOLUTION


def row_sum_source(name: str) -> str:
    """C++ source of ``extern "C" void <name>(const float* x, float* out, int64_t rows, int64_t cols)``
    setting ``out[i] = sum(x[i * cols + j] for j in range(cols))``.

    Make it fast the way the backend does: rows in parallel (``#pragma omp parallel for``), the
    contiguous inner loop vectorised (``#pragma omp simd reduction(+:acc)``), and accumulate in
    ``double`` so long rows stay accurate. Include what you use (``<cstdint>``).
    """
    # BEGIN SOLUTION (Exercise 9.3: an OpenMP row-sum kernel with the documented signature; checked by compiling and running it on many shapes (notebook 09, Exercise 9.3))
    return f"""
#include <cstdint>

extern "C" void {name}(const float* __restrict__ x, float* __restrict__ out, int64_t rows, int64_t cols)
{{
    #pragma omp parallel for
    for (int64_t i = 0; i < rows; ++i)
    {{
        double acc = 0;
        #pragma omp simd reduction(+:acc)
        for (int64_t j = 0; j < cols; ++j)
            acc += x[i * cols + j];
        out[i] = static_cast<float>(acc);
    }}
}}
"""
    # END SOLUTION


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a reader sees either the old file or the whole new one.

    Write a temporary file *in the same directory* (``tempfile.mkstemp(dir=...)``), flush it,
    then ``os.replace`` it onto ``path`` (an atomic rename on POSIX). Leave no temporary file
    behind, even when writing fails.
    """
    # BEGIN SOLUTION (Exercise 9.4: an atomic file write; checked on success, on failure and inside the code cache (notebook 09, Exercises 9.4 and 9.5))
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    # END SOLUTION


def entry_is_intact(library: Path, checksum: Path) -> bool:
    """True when the cached ``library`` exists and its SHA-256 hex digest equals the text stored
    in ``checksum`` (surrounding whitespace ignored). A missing file of either kind means False.
    """
    # BEGIN SOLUTION (Exercise 9.5: tell an intact cache entry from a damaged or missing one; checked on files and inside the code cache (notebook 09, Exercises 9.4 and 9.5))
    try:
        expected = Path(checksum).read_text().strip()
        actual = hashlib.sha256(Path(library).read_bytes()).hexdigest()
    except OSError:
        return False
    return bool(expected) and actual == expected
    # END SOLUTION
