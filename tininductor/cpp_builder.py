"""Find a C++ compiler, choose flags that suit this machine, and build a shared library.

The code cache (``codecache.py``) decides *whether* to build; this module decides *how*.
Flags are probed once per process, and only when something actually has to be compiled:

* ``-O3 -shared -fPIC -std=c++17`` always;
* ``-march=native`` when the compiler accepts it (wider SIMD: AVX2/AVX-512 on x86);
* ``-fopenmp`` when a tiny OpenMP library compiles, links *and* loads; otherwise
  ``-fopenmp-simd`` keeps the ``#pragma omp simd`` hints and the loops run on one thread;
* ``-fno-math-errno -fno-trapping-math`` so ``sqrt``/``exp`` calls can vectorise. We do *not*
  use ``-ffast-math``: it breaks NaN/inf semantics that eager PyTorch keeps;
* ``-ffp-contract=off``: g++ otherwise fuses ``a * b - c`` into one FMA, which rounds once
  where eager rounds twice (``x*x - mean(x*x)`` over one element came out 1e-8, not 0, and a
  variance that eager reports as ``0/0 = nan`` became ``inf``);
* ``-DTINY_LIBMVEC`` + ``-lmvec`` where glibc's vector math library links and loads: the
  prelude then declares SIMD versions of exp/log/sin/cos/pow, so loops calling them vectorise.

Environment knobs: ``CXX`` picks the compiler, ``TINY_CPP_OPENMP=0`` turns OpenMP off (the
fallback path), ``TINY_CPP_LIBMVEC=0`` turns the vector math library off, ``TINY_CPP_FLAGS``
appends flags.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

BASE_FLAGS = ["-O3", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-fno-trapping-math",
              "-ffp-contract=off"]

_OPENMP_PROBE = r"""
extern "C" int tiny_probe(int n) {
    int total = 0;
    #pragma omp parallel for reduction(+:total)
    for (int i = 0; i < n; ++i) total += i;
    return total;
}
"""


class CppCompileError(RuntimeError):
    """The C++ compiler rejected generated code; the message carries the command and its output."""


def find_compiler() -> str:
    """Path of the C++ compiler: ``$CXX``, else the first of g++, c++, clang++ on ``PATH``."""
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            return path
    raise CppCompileError(
        f"no C++ compiler found (tried {', '.join(candidates)}); install g++ "
        "(e.g. `apt-get install g++`) or point the CXX environment variable at one"
    )


def compiler_identity(cxx: str) -> str:
    """A cheap fingerprint of the compiler binary (path, size, mtime): no subprocess needed."""
    real = os.path.realpath(cxx)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{int(st.st_mtime)}"


@functools.cache
def machine_signature() -> str:
    """Architecture plus a hash of the CPU feature flags: ``-march=native`` code is CPU-specific."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = line
                    break
    except OSError:
        pass
    libc = "-".join(platform.libc_ver())  # libmvec comes with glibc
    return f"{platform.machine()}:{libc}:{hashlib.sha256(flags.encode()).hexdigest()[:16]}"


_LIBMVEC_PROBE = r"""
#include <cmath>
#include <cstdint>
#define TINY_LIBMVEC
extern "C" {
float expf(float) noexcept __attribute__((simd("notinbranch")));
double exp(double) noexcept __attribute__((simd("notinbranch")));
}
extern "C" int tiny_probe(int n) {
    float x[64], y[64];
    for (int i = 0; i < 64; ++i) x[i] = 0.01f * i;
    #pragma omp simd
    for (int i = 0; i < 64; ++i) y[i] = std::exp(x[i]);
    return (y[63] > 1.87f && y[63] < 1.88f) ? 45 : 0;
}
"""


def libmvec_requested() -> bool:
    return os.environ.get("TINY_CPP_LIBMVEC", "1").strip().lower() not in ("0", "false", "no", "off")


def openmp_requested() -> bool:
    return os.environ.get("TINY_CPP_OPENMP", "1").strip().lower() not in ("0", "false", "no", "off")


def _try_compile(cxx: str, flags: list[str], source: str, load: bool = False, libs: list[str] = ()) -> bool:
    with tempfile.TemporaryDirectory(prefix="tiny_probe_") as tmp:
        src, out = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe.so")
        with open(src, "w") as f:
            f.write(source)
        proc = subprocess.run([cxx, *flags, src, "-o", out, *libs], capture_output=True)
        if proc.returncode != 0:
            return False
        if load:
            try:
                lib = ctypes.CDLL(out)
                return lib.tiny_probe(10) == 45
            except OSError:
                return False
        return True


@functools.cache
def _probed_flags(cxx: str, want_openmp: bool) -> tuple[str, ...]:
    flags = list(BASE_FLAGS)
    if _try_compile(cxx, [*flags, "-march=native"], "int tiny_probe;"):
        flags.append("-march=native")
    if want_openmp and _try_compile(cxx, [*flags, "-fopenmp"], _OPENMP_PROBE, load=True):
        flags.append("-fopenmp")
    elif _try_compile(cxx, [*flags, "-fopenmp-simd"], "int tiny_probe;"):
        flags.append("-fopenmp-simd")
    return tuple(flags)


@functools.cache
def _probed_link_flags(cxx: str, flags: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """((defines), (libraries)) for the vector math library, or two empty tuples."""
    if libmvec_requested() and _try_compile(cxx, [*flags], _LIBMVEC_PROBE, load=True, libs=["-lmvec"]):
        return ("-DTINY_LIBMVEC",), ("-lmvec",)
    return (), ()


def compile_flags(cxx: str | None = None) -> list[str]:
    """The flags this machine supports (probed once per process), plus ``$TINY_CPP_FLAGS``."""
    cxx = cxx or find_compiler()
    flags = _probed_flags(cxx, openmp_requested())
    defines, _ = _probed_link_flags(cxx, flags)
    return [*flags, *defines, *os.environ.get("TINY_CPP_FLAGS", "").split()]


def link_flags(cxx: str | None = None) -> list[str]:
    """Libraries to link after the source (``-lmvec`` where the probe found it)."""
    cxx = cxx or find_compiler()
    return list(_probed_link_flags(cxx, _probed_flags(cxx, openmp_requested()))[1])


def uses_openmp(cxx: str | None = None) -> bool:
    """True when kernels built now are linked with OpenMP (multi-threaded loops)."""
    return "-fopenmp" in compile_flags(cxx)


def precompile_header(header_path: str, output_path: str, cxx: str | None = None,
                      extra_flags: tuple[str, ...] = ()) -> bool:
    """Build a precompiled header (``.gch``) with the kernels' exact flags; False if that fails.

    g++ uses ``foo.h.gch`` instead of parsing ``foo.h`` (and <cmath>...) when the flags match,
    which makes each kernel build 2-3x faster. It is only an optimisation: without it (or with
    a stale one) g++ silently reads the header itself.
    """
    cxx = cxx or find_compiler()
    flags = [f for f in compile_flags(cxx) if f != "-shared"]
    cmd = [cxx, *flags, *extra_flags, "-x", "c++-header", header_path, "-o", output_path]
    return subprocess.run(cmd, capture_output=True).returncode == 0


def build_shared_library(source_path: str, output_path: str, cxx: str | None = None,
                         extra_flags: tuple[str, ...] = ()) -> list[str]:
    """Compile ``source_path`` into the shared library ``output_path``; return the command used."""
    cxx = cxx or find_compiler()
    cmd = [cxx, *compile_flags(cxx), *extra_flags, source_path, "-o", output_path, *link_flags(cxx)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CppCompileError(
            f"C++ compilation failed (exit {proc.returncode}) for {source_path}\n"
            f"command: {' '.join(cmd)}\n{proc.stderr.strip()}"
        )
    return cmd
