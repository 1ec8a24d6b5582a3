# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 9: C++ code generation and the code cache
#
# Chapter 7 turned a graph into loop IR and fused it into groups; chapter 8 printed each group
# as a Triton kernel. On a CPU, TorchInductor prints **C++** instead: one `extern "C"` function
# per fused group, with OpenMP pragmas so the loops run on every core and vectorise, compiled
# by `g++` and called through `ctypes`. Compiling costs about half a second per kernel, so
# every result goes into a **code cache** keyed by a hash of the source.
#
# **What you will learn**
#
# 1. The whole path by hand: C++ text -> `g++ -shared` -> `ctypes.CDLL` -> call with tensor
#    data pointers.
# 2. The C++ *ops handler*: the same `inner_fn(index)` bodies as chapter 8, printed through a
#    dict of op -> C++ format string (Exercise 9.1).
# 3. Loops: a parallel outer loop, vectorisable inner loops, and reductions with accumulators
#    that OpenMP can split (Exercises 9.2 and 9.3). Why `std::max` is wrong for `amax`.
# 4. dtypes: fp16/bf16 stored as 16 bits, computed in float.
# 5. The code cache: content hash -> files in a private directory, written atomically,
#    verified before loading, shared safely between processes (Exercises 9.4 and 9.5).

# %%
import ctypes
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

from course import load

ch = load("ch09", unfinished="package")  # your exercises (or the reference solutions when TINY_COURSE_MODE=solutions)
torch.manual_seed(0)

# A private code cache for this notebook, so what it prints does not depend on earlier runs.
os.environ["TINY_CACHE_DIR"] = tempfile.mkdtemp(prefix="tiny_ch09_")

import tininductor
from tinydynamo import artifacts
from tininductor import config
from tininductor.codecache import CppCodeCache, PyCodeCache
from tininductor.codegen import cpp

config.cpu_backend = "cpp"  # CPU graphs -> C++ kernels (the default is "auto", which picks C++ too)


def compile_cpp(fn, *args):
    """FX-trace ``fn`` and compile it with tininductor (no Dynamo: keeps the chapter fast).

    Returns the compiled callable, with ``.kernels`` ({name: C++ source}) taken from the
    compile's artefacts (chapter 0), where every layer records what it produced.
    """
    with artifacts.collecting("ch09") as arts:
        compiled = tininductor.compile_fx(torch.fx.symbolic_trace(fn), list(args))
    kernels = {name: text.split('r"""')[1].split('""")')[0] for name, text in arts.get("kernels")}
    return types.SimpleNamespace(fn=compiled, kernels=kernels)

# %% [markdown]
# ## 1. A kernel by hand
#
# Before generating anything, do every step ourselves. A kernel is a C function that takes raw
# pointers; `extern "C"` stops C++ from mangling its name, so `ctypes` can find it.

# %%
source = r"""
#include <cmath>
#include <cstdint>

extern "C" void add_sin(const float* x, const float* y, float* out, int64_t n)
{
    for (int64_t i = 0; i < n; ++i)
        out[i] = std::sin(x[i]) + y[i];
}
"""
workdir = Path(tempfile.mkdtemp(prefix="tiny_byhand_"))
(workdir / "add_sin.cpp").write_text(source)
cmd = ["g++", "-O3", "-shared", "-fPIC", str(workdir / "add_sin.cpp"), "-o", str(workdir / "add_sin.so")]
subprocess.run(cmd, check=True)
lib = ctypes.CDLL(str(workdir / "add_sin.so"))
lib.add_sin.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

x, y = torch.randn(10), torch.randn(10)
out = torch.empty(10)
lib.add_sin(x.data_ptr(), y.data_ptr(), out.data_ptr(), out.numel())
print(out[:4])
print("matches eager:", torch.allclose(out, torch.sin(x) + y))

# %% [markdown]
# `data_ptr()` is the address of the tensor's first element (storage offset included), so C++
# reads and writes the tensor's memory directly -- no copies. Three things are up to us:
# the pointer types must match the dtype, the output must be allocated before the call, and
# the index arithmetic must follow the tensor's strides.
#
# Which flags? `-O3` enables the auto-vectoriser, `-march=native` lets it use the widest SIMD
# unit this CPU has (AVX2/AVX-512 on x86), `-fopenmp` turns `#pragma omp` lines into threads.
# Not every compiler accepts all of them, so `tininductor.cpp_builder` *probes* once per
# process -- it compiles, links and loads a tiny OpenMP program -- and keeps what works:

# %% tags=["nbval-ignore-output"]
from tininductor import cpp_builder

print(cpp_builder.find_compiler())
print(" ".join(cpp_builder.compile_flags()))

# %% [markdown]
# We leave out `-ffast-math` on purpose: it lets the compiler assume there are no NaNs or
# infinities, and eager PyTorch promises exact NaN behaviour (`torch.maximum(nan, 1)` is nan).
# `-fno-math-errno` is the safe part of it: `sqrt` no longer sets `errno`, so it can be
# vectorised. `exp`, `log`, `sin`... are library calls; g++ vectorises a loop around them only
# if it knows a SIMD version exists. glibc ships one (*libmvec*, `_ZGVdN8v_expf` computes 8
# floats at once), so where a probe links it the flags gain `-DTINY_LIBMVEC` and the kernel
# prelude declares those versions -- worth about 5x on softmax here.

# %% [markdown]
# ## 2. An ops handler that prints C++
#
# The IR bodies from chapter 7 never say *what* `ops.add` does. Install a handler that
# returns strings and the same body prints code. Each result gets its own variable (`tmpN`),
# and an expression seen before reuses its variable -- common-subexpression elimination in
# three lines.

# %%
from tininductor.virtualized import V, ops


class TinyCppPrinter:
    """A 20-line C++ ops handler: one table of format strings, one list of lines."""

    table = {"add": "{0} + {1}", "mul": "{0} * {1}", "sin": "std::sin({0})", "exp": "std::exp({0})"}

    def __init__(self):
        self.lines, self.seen = [], {}

    def emit(self, expr):
        if expr not in self.seen:
            self.seen[expr] = f"tmp{len(self.seen)}"
            self.lines.append(f"auto {self.seen[expr]} = {expr};")
        return self.seen[expr]

    def load(self, name, index):
        return self.emit(f"{name}[{index}]")

    def store(self, name, index, value):
        self.lines.append(f"{name}[{index}] = {value};")

    def constant(self, value, dtype):
        return f"static_cast<float>({value})"

    def __getattr__(self, op):
        return lambda *args: self.emit(self.table[op].format(*args))


def body(i):  # what lowering would produce for  out = sin(x + y) * exp(x + y) * 2
    s = ops.add(ops.load("in_ptr0", i), ops.load("in_ptr1", i))
    return ops.store("out_ptr0", i, ops.mul(ops.mul(ops.sin(s), ops.exp(s)), ops.constant(2.0, torch.float32)))


printer = TinyCppPrinter()
with V.set_ops_handler(printer):
    body("i")
print("\n".join(printer.lines))

# %% [markdown]
# `x + y` is computed once although the body asks for it twice. The real handler,
# `tininductor.codegen.cpp.CppKernel`, is the same idea with more care: typed constants
# (`inf`, `nan`), casts, loads of fp16 data, and *scopes* (a value made inside an inner loop
# does not exist after it). Its table is `CPP_OPS` -- a dict, like tinygrad's renderers:

# %%
for op in ["add", "truediv", "sigmoid", "relu", "maximum", "where", "sign", "logical_not"]:
    print(f"{op:12s} {cpp.CPP_OPS[op]}")

# %% [markdown]
# ### Exercise 9.1: op strings
#
# Write `cpp_op_strings()` in `exercises/ch09_cpp_codegen.py`: C++ templates for `sigmoid`,
# `relu`, `maximum`, `where` and `rsqrt`. Match eager *exactly*, NaN included:
# `torch.relu(nan)` is nan and `torch.maximum(x, nan)` is nan, but `std::max(x, nan)` is `x`
# (every comparison with NaN is false). The graded test installs your strings into `CPP_OPS`
# and compiles a graph through the real backend. Here is that, with your answer:

# %%
mine = ch.cpp_op_strings()
saved = {op: cpp.CPP_OPS[op] for op in mine}
cpp.CPP_OPS.update(mine)
try:
    x, y = torch.randn(4, 6), torch.randn(6)
    x[0, 0], y[1] = float("nan"), float("nan")
    f = lambda x, y: (torch.relu(x), torch.maximum(x, y), torch.where(x > y, x, y))
    compiled = compile_cpp(f, x, y)
    for name, a, b in zip(["relu", "maximum", "where"], compiled.fn(x, y), f(x, y)):
        print(f"{name:8s} matches eager (NaN included):", torch.allclose(a, b, equal_nan=True))
finally:
    cpp.CPP_OPS.update(saved)

# %% [markdown]
# ## 3. Loops, threads and vectors
#
# The scheduler hands the backend a `FusedGroup` with two sizes: `numel` (outputs) and, for a
# reduction, `rnumel` (elements folded into each output). The C++ shape follows:
#
# * a **pointwise** group is one loop over `xindex`, marked `#pragma omp parallel for simd`
#   when there is enough work (threads, and SIMD lanes within each thread), or nested loops
#   when every node has the same multi-dimensional shape, so the innermost loop is contiguous;
# * a **reduction** group is an outer loop over `xindex` -- one output row per iteration, rows
#   shared among threads -- whose body holds one inner loop over `rindex` per *phase*.
#
# Here is a pointwise chain: one kernel, one loop, its FX nodes in the comment.

# %%
compiled = compile_cpp(lambda x, y: (x + y).sin() * 2, torch.randn(64, 8), torch.randn(8))
for name, code in compiled.kernels.items():
    print(name)
    print(code)

# %% [markdown]
# The index `x1 + 8 * x0` is the chapter-7 index arithmetic: the kernel iterates a flat
# `xindex`, splits it into `(x0, x1)` for the output's shape, and each input maps that to its
# own strides (the broadcast `y` ignores `x0`). With 512 elements there is too little work for
# threads, so only `#pragma omp simd` is left. `__restrict__` promises the compiler that the
# pointers do not overlap, which it needs before it may vectorise loads and stores.
#
# Now softmax, a reduction. The scheduler fused max, sum-of-exp and the normalisation into one
# group; the C++ backend gives it three inner loops inside one outer loop:

# %%
compiled = compile_cpp(lambda x: torch.softmax(x, -1), torch.randn(256, 200))
for name, code in compiled.kernels.items():
    print(name)
    print(code)

# %% [markdown]
# Read it top to bottom:
#
# * **`#pragma omp parallel for`** on the row loop: rows are independent, so threads take
#   rows. Each thread runs the three inner loops for its rows, back to back, while the row is
#   still in its cache.
# * **The accumulators** (`acc1`, `acc6`) live outside their inner loop; the max and the sum
#   after their loops are ordinary variables the later loops read -- the registers that
#   fusion saves us from writing to memory.
# * **`#pragma omp simd reduction(+:acc6)`** tells the compiler it may keep several partial
#   sums (one per SIMD lane) and add them at the end. Without it, `-O3` must not vectorise a
#   float sum, because reordering float additions changes the result.
# * **Sums accumulate in `double`.** A float32 running sum over a long row drifts; PyTorch
#   uses a cascade of partial sums, we simply accumulate in double and round once.
# * **`tiny_max`**, not `std::max`: it keeps NaN, as `torch.amax` does. The prelude every
#   kernel includes declares it as an OpenMP reduction too: `reduction(tiny_max:acc1)`.
#
# When there is a single output row (`x.sum()` of a big tensor) parallel rows are useless, so
# the backend splits the *inner* loop among threads instead:

# %%
compiled = compile_cpp(lambda x: x.sum(), torch.randn(100_000))
print([line.strip() for code in compiled.kernels.values() for line in code.splitlines() if "#pragma" in line])

# %% [markdown]
# ### Exercise 9.2: reduction code
#
# `reduction_code(reduction_type, acc_type)` returns three strings: the accumulator's initial
# value, the statement that folds one `{value}` into `{acc}`, and the OpenMP reduction
# identifier. The graded test swaps it into the backend and compiles sum, amax, amin, prod and
# softmax. What yours gives for each reduction:

# %%
for kind in ["sum", "prod", "max", "min"]:
    print(f"{kind:5s}", ch.reduction_code(kind, "float"))

# %% [markdown]
# ### Exercise 9.3: a reduction kernel by hand
#
# Now write a whole kernel: `row_sum_source(name)` returns C++ for a row sum over a
# `rows x cols` float matrix, with the row loop parallel, the inner loop vectorised with a
# `simd reduction`, and a `double` accumulator. The code cache builds it (it needs no prelude):

# %%
src = ch.row_sum_source("row_sum")
row_sum = CppCodeCache.load(src).row_sum
row_sum.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
x = torch.randn(300, 1001)
out = torch.empty(300)
row_sum(x.data_ptr(), out.data_ptr(), 300, 1001)
print("row sums match eager:", torch.allclose(out, x.sum(-1), atol=1e-4))

# %% [markdown]
# ## 4. Half precision
#
# C++ has no portable fp16 type, so the backend stores fp16/bf16 as `uint16_t` and converts at
# the edges: loads become `tiny_half_to_float(...)`, stores `tiny_float_to_half(...)` (round to
# nearest even, like PyTorch); everything in between is float. That is also what Triton does
# (chapter 8) and why fused fp16 kernels are often *more* accurate than eager, which rounds
# after every op.

# %%
a, b = torch.randn(5, 7, dtype=torch.float16), torch.randn(5, 7, dtype=torch.float16)
compiled = compile_cpp(lambda a, b: (a * b + 1).sin(), a, b)
(kernel,) = compiled.kernels.values()
print("\n".join(line for line in kernel.splitlines() if "half" in line or "extern" in line))
print("matches eager:", torch.allclose(compiled.fn(a, b), (a * b + 1).sin(), atol=1e-2))

# %% [markdown]
# ## 5. The code cache
#
# Compiling costs ~0.5 s per kernel, and a model has dozens, so nothing is compiled twice.
# `CppCodeCache.load(source)` hashes everything that determines the library -- the source, the
# headers it includes, the flags, the compiler binary, the CPU's features -- and looks for
# `<hash>.so` in a per-user directory. The counters tell us what happened:

# %%
cpp.wait_for_prebuilds()  # the kernels above were also built in the background: let that finish
CppCodeCache.clear()  # forget the libraries loaded in this process (the files stay)
src = 'extern "C" int answer() { return 42; }\n'
print(CppCodeCache.load(src).answer(), dict(CppCodeCache.stats))
print(CppCodeCache.load(src).answer(), dict(CppCodeCache.stats))
CppCodeCache.clear()  # as if this were a new run of the program
print(CppCodeCache.load(src).answer(), dict(CppCodeCache.stats))

# %% [markdown]
# A *miss* ran g++; a *memory hit* found the library already loaded in this process; a *disk
# hit* found the file from an earlier run. Here is one entry on disk -- the source, the
# library and its checksum -- and the directory's mode:

# %% tags=["nbval-ignore-output"]
paths = CppCodeCache.paths(src)
for kind, path in paths.items():
    print(f"{kind:7s} {path.name:50s} {path.stat().st_size if path.exists() else '-':>8} bytes")

# %%
root = Path(os.environ["TINY_CACHE_DIR"])
print("cache directory mode:", oct(stat.S_IMODE(root.stat().st_mode)))

# %% [markdown]
# Why each rule matters:
#
# * **A private directory (0700).** We `dlopen` whatever library sits in the cache: anyone who
#   can write there can run code as us. `codecache.cache_dir()` creates it 0700, repairs a
#   looser mode and refuses a directory that belongs to someone else.
# * **Atomic writes.** Another process may read while we write. Writing a temporary file in
#   the same directory and `os.replace`-ing it onto the final name means readers see the old
#   file or the new one, never half (Exercise 9.4).
# * **Verified entries.** A crash or a full disk can leave a truncated library; loading it
#   would crash the process. The checksum is written *after* the library, and an entry whose
#   library does not match it is rebuilt, never loaded (Exercise 9.5).
# * **A lock per entry.** Two processes compiling the same kernel take turns (a `filelock`):
#   the first builds, the second finds its result.
#
# Watch a truncated library get rebuilt:

# %%
so = paths["so"]
truncated = so.read_bytes()[:200]
so.unlink()               # (a new file: the old one is still mapped into this process)
so.write_bytes(truncated)  # what a crash in the middle of a non-atomic write would leave
CppCodeCache.clear()
print(CppCodeCache.load(src).answer(), dict(CppCodeCache.stats))

# %% [markdown]
# And a second process reusing our entries (it prints its own counters):

# %%
child = f"""
import sys; sys.path.insert(0, {str(Path.cwd().parent)!r})
from tininductor.codecache import CppCodeCache
print(CppCodeCache.load({src!r}).answer(), dict(CppCodeCache.stats))
"""
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout.strip())

# %% [markdown]
# ### Exercises 9.4 and 9.5
#
# `write_atomic(path, data)` and `entry_is_intact(library, checksum)` are the two functions
# the cache relies on. The graded tests swap yours into `tininductor.codecache` and repeat the
# experiments above. Yours, on a scratch directory:

# %%
scratch = Path(tempfile.mkdtemp(prefix="tiny_ch09_scratch_"))
ch.write_atomic(scratch / "lib.so", b"\x7fELF pretend library")
(scratch / "lib.sha256").write_text(__import__("hashlib").sha256(b"\x7fELF pretend library").hexdigest())
print("intact:", ch.entry_is_intact(scratch / "lib.so", scratch / "lib.sha256"))
ch.write_atomic(scratch / "lib.so", b"\x7fELF pre")
print("after truncation:", ch.entry_is_intact(scratch / "lib.so", scratch / "lib.sha256"))
print("files:", sorted(p.name for p in scratch.iterdir()))

# %% [markdown]
# One more trick keeps builds fast: every generated kernel starts with
# `#include "tiny_prelude.h"` (the helpers: `tiny_max`, the fp16 conversions, the OpenMP
# reductions). The cache writes that header once per content hash and *precompiles* it
# (`tiny_prelude.h.gch`), so g++ does not re-parse `<cmath>` for every kernel -- about 2-3x
# faster per build.
#
# ## 6. How fast?
#
# A fair comparison times eager and compiled code in the same run, after warm-up, with the
# outputs checked first. Timings depend on the machine (and on its other users), so read the
# ratios, not the numbers; `bench/softmax_layernorm.py` does this properly, with
# `torch.compile` alongside.

# %% tags=["nbval-ignore-output"]
def timeit(fn, *args, iters=20):
    fn(*args)
    start = time.perf_counter()
    for _ in range(iters):
        fn(*args)
    return (time.perf_counter() - start) / iters


x = torch.randn(512, 1024)
f = lambda x: (x.sin() * 2 + 1).relu()
compiled = compile_cpp(f, x).fn
torch.testing.assert_close(compiled(x), f(x))
eager_t, tiny_t = timeit(f, x), timeit(compiled, x)
print(f"pointwise chain: eager {eager_t * 1e3:.2f} ms, tininductor C++ {tiny_t * 1e3:.2f} ms, "
      f"speed-up {eager_t / tiny_t:.1f}x")

# %% [markdown]
# Eager runs four kernels and writes three temporaries of 2 MB each; the fused kernel reads
# `x` once and writes the result once.

# %% [markdown]
# ### How PyTorch really does it
#
# TorchInductor's C++ backend is `torch/_inductor/codegen/cpp.py`: `CppOverrides` holds the op
# strings (exercise 9.1), `CppKernel` the loops, and `CppVecKernel` with `CppVecOverrides` a
# second, vectorized version of each kernel written with ATen's `at::vec::Vectorized<float>`
# (SIMD registers, 8 or 16 floats at a time) and a scalar tail for the leftover elements;
# `CppScheduling` and `CppKernelProxy` decide which to use. Reductions run in parallel with
# OpenMP `declare reduction`s, including Welford for mean and variance. `cpp_builder.py`
# finds the compiler and flags, and `codecache.py` has `CppCodeCache` and `write_atomic`, the
# names you met in section 5. Ours has one scalar loop nest per kernel and leaves vectorizing to
# g++'s `-O3`. Here is TorchInductor's C++ for `(x.sin() + y) * 2` and its `call()`: the
# inner loop steps 8 floats at a time, a vectorized body (`at::vec::Vectorized<float>::loadu`,
# `.sin()`) and a tail for the ninth element (108 elements are too few for a `#pragma omp`
# parallel loop: it threads only larger kernels). Its first build compiles ATen's vector headers (tens of seconds); later runs load it from
# TorchInductor's own cache.

# %% tags=["nbval-ignore-output"]
import torch._dynamo
from torch._inductor.utils import run_and_get_code

torch._dynamo.reset()
_, (torch_module, *_) = run_and_get_code(torch.compile(lambda a, b: (a.sin() + b) * 2, backend="inductor"),
                                         torch.randn(4, 3, 9), torch.randn(9))
kernel = torch_module[torch_module.index('extern "C"'):]
print(kernel[:kernel.index("\'\'\')")])
print(torch_module[torch_module.index("    def call(self, args):"):torch_module.index("runner = Runner")])

# %% [markdown]
# ## 7. The layer in the package
#
# Everything above lives in `tininductor`:
#
# | piece | where |
# |---|---|
# | ops handler + loop emitter (`CppKernel`, `CPP_OPS`, `CPP_REDUCTIONS`) | `tininductor/codegen/cpp.py` |
# | the backend of the scheduling protocol (`CppScheduling`) | `tininductor/codegen/cpp.py` |
# | helpers every kernel includes | `tininductor/codegen/cpp_prelude.h` |
# | compiler discovery and flags | `tininductor/cpp_builder.py` |
# | `PyCodeCache`, `CppCodeCache` | `tininductor/codecache.py` |
#
# `config.cpu_backend` picks C++ or the Triton interpreter for CPU graphs, so the same graph
# can be checked through both code generators against eager. Next chapter: sizes that change
# from call to call, as symbols in the graph, the guards and these kernels; then the whole
# stack, from `tinydynamo.compile(model)` to these kernels.

# %%
from tininductor.codegen.cpp import CppScheduling

print(CppScheduling.kind, "backend; kernels are loaded by", cpp.load_cpp_kernel.__name__)
