# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Chapter 0 — Why compile?
#
# PyTorch runs your model *eagerly*: every line of Python executes the moment it is reached,
# one operator at a time. That is what makes PyTorch pleasant to debug, and it is also what
# `torch.compile` exists to fix. Before we build a compiler (the rest of this course), we
# measure what eager execution costs, and we watch PyTorch's own compiler at work.
#
# **What you will learn**
#
# 1. The three costs of eager mode, each *measured* here rather than asserted:
#    a fixed Python/dispatcher overhead per operator, one kernel per operator, and the
#    intermediate tensors written to memory and read back between kernels.
# 2. The pipeline behind `torch.compile`: TorchDynamo → FX graph → AOTAutograd → Inductor →
#    Triton / C++, and what each stage produces (we print each artefact for a tiny function).
# 3. A fair benchmark (first call apart, warmup, synchronisation, median), and what
#    `torch.compile` buys on this CPU.
# 4. The modes and backends you will meet, and when *not* to compile.
#
# The exercises of this chapter (`exercises/ch00_why_compile.py`) are the measuring instruments
# themselves: an ATen op counter (0.1), an intermediate-bytes meter (0.2), a benchmark helper
# (0.3) and a graph-recording `torch.compile` backend (0.4). Check them with
# `python -m course.grade ch00`.
#
# **Read it through first.** "Run All" works before you write a line: a cell that needs an
# exercise you have not done says so in one line (`Exercise 0.3 not done yet: using ...`) and
# carries on with a stand-in, never the solution file. Once your function no longer raises its
# `NotImplementedError`, re-run the next cell and the notebook uses your code.
#
# > Timings depend on the machine, so cells that print them are not compared when the notebook
# > is re-checked. The numbers stored with this notebook come from a small shared CPU.

# %%
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from course import load
from course.models import TinyBlock

ch = load("ch00", unfinished="package")  # your exercises; unfinished ones stand in with the package's code
torch.manual_seed(0)
# One thread: on a busy shared CPU, multi-threaded kernels make timings swing wildly.
torch.set_num_threads(1)

# %% tags=["nbval-ignore-output"]
print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), CUDA available: {torch.cuda.is_available()}")

# %% [markdown]
# ## 1. What happens when eager PyTorch runs `y = x * 2`
#
# One Python line sets off a fixed sequence of work before any arithmetic happens:
#
# 1. the Python interpreter executes bytecode that looks up `mul` and calls it;
# 2. PyTorch's Python binding parses the arguments (`Tensor`, `2`) and picks an overload;
# 3. the **dispatcher** routes the call through its keys (autograd, then the CPU or CUDA
#    backend, ...), each a function call;
# 4. an output tensor is **allocated**;
# 5. a **kernel** runs: a loop over all elements on the CPU, or a launch on the GPU;
# 6. the result is wrapped as a Python object and returned to the interpreter.
#
# Steps 1–4 and 6 cost about the same whether the tensor has one element or a million. Only
# step 5 grows with the data. Let's measure both parts.
#
# ## 2. Cost 1: a fixed overhead per operator
#
# We time one `add` on tensors from 1 to a million elements, using the benchmark helper of
# **Exercise 0.3** (`ch.benchmark`): it reports the first call apart, warms up, synchronises
# the device before every clock read and returns the median of the timed calls. To time
# something much longer than the clock's resolution, each call runs the op 20 times.

# %% tags=["nbval-ignore-output"]
OPS_PER_CALL = 20


def twenty_adds(x):
    for _ in range(OPS_PER_CALL):
        x.add(1.0)


sizes = [1, 64, 1024, 16_384, 262_144, 1_048_576]
per_op_us = []
for n in sizes:
    x = torch.randn(n)
    timing = ch.benchmark(twenty_adds, x, warmup=3, repeat=15)
    per_op_us.append(timing.median_s / OPS_PER_CALL * 1e6)
    print(f"{n:>9} elements: {per_op_us[-1]:8.2f} us per add")
overhead_us = per_op_us[0]
print(f"\nfixed cost of one eager op (1 element): about {overhead_us:.1f} us")
print(f"share of that cost spent on arithmetic at 1 element: ~{1e-3 / overhead_us:.0e} (a nanosecond of work)")

# %% [markdown]
# The curve is flat until the data gets large: for small tensors nearly all the time is
# overhead, spent in the interpreter, the binding, the dispatcher and the allocator. A model
# made of many small operations (small batches, short sequences, decoding one token at a
# time) is dominated by this constant.

# %%
fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
ax.loglog(sizes, per_op_us, "o-", label="measured: one eager add")
ax.axhline(overhead_us, color="gray", ls="--", label="fixed overhead (1 element)")
ax.set_xlabel("elements in the tensor")
ax.set_ylabel("microseconds per op")
ax.set_title("Eager: a fixed price per op, then time grows with data")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 3. Cost 2: one kernel per operator
#
# Eager PyTorch cannot look ahead: it runs each operator as soon as Python reaches it, so every
# operator is its own trip through the dispatcher and its own kernel. Which operators actually
# reach the kernels? Autograd and *composite* operators (those defined in terms of others,
# like `linear` or `softmax`) are unfolded first; what is left are **ATen** operators, the
# names you will see again in every compiler layer.
#
# A `TorchDispatchMode` sees exactly those calls. Here is the smallest one: it prints every
# ATen op, then runs it.

# %%
from torch.utils._python_dispatch import TorchDispatchMode


class PrintOps(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        print("  dispatched:", func)
        return func(*args, **(kwargs or {}))


def pointwise(x):
    return (x.sin() * 2 + 1).relu()


x = torch.randn(4)
with PrintOps():
    pointwise(x)

# %% [markdown]
# One line of Python, four ATen ops, four kernels. **Exercise 0.1** turns this mode into a
# counter, `ch.count_aten_ops(fn, *args)`, that returns a `Counter` of op names. Let's count the
# seeds' `TinyBlock` (LayerNorm → Linear → GELU → scale/shift → Linear, plus a residual), and
# the same block during a training step, where autograd adds the backward operators.

# %%
block = TinyBlock(hidden=64).eval()
x = torch.randn(4, 16, 64)

with torch.no_grad():
    inference_ops = ch.count_aten_ops(block, x)
print(f"TinyBlock forward: {sum(inference_ops.values())} ATen ops")
for name, count in sorted(inference_ops.items()):
    print(f"  {count} x {name}")


def training_step(x):
    block.zero_grad()
    block(x).sum().backward()


training_ops = ch.count_aten_ops(training_step, x)
print(f"TinyBlock forward + backward: {sum(training_ops.values())} ATen ops")

# %% [markdown]
# Every one of those ops pays the overhead we measured in section 2. The `view` and `t` ops
# only make new tensor metadata (shape and strides) over the same memory; each of the others
# runs a kernel, and each pointwise one (the `gelu`, the `mul`, the `add`s) makes its own pass
# over the data. Training more than triples the count.
#
# ## 4. Cost 3: intermediate tensors
#
# In `(x.sin() * 2 + 1).relu()`, the result of `sin` is written to a fresh tensor in memory,
# then read back by `mul`, whose result is written and read back by `add`, and so on. Only the
# last result is wanted. A compiler that **fuses** the four ops into one loop keeps each
# element's intermediate values in registers: it reads `x` once and writes the result once.
#
# **Exercise 0.2**, `ch.intermediate_bytes(fn, *args)`, adds up the bytes of the tensors a
# function allocates and throws away (views and in-place ops allocate nothing; returned tensors
# are not thrown away).

# %%
x = torch.randn(1024, 1024)
print(f"input x: {x.numel() * x.element_size() / 2**20:.0f} MiB")
print(f"pointwise chain allocates {ch.intermediate_bytes(pointwise, x) / 2**20:.0f} MiB of intermediates")
with torch.no_grad():
    xb = torch.randn(4, 16, 64)
    print(f"TinyBlock allocates {ch.intermediate_bytes(block, xb) / 2**10:.0f} KiB of intermediates "
          f"for a {xb.numel() * 4 / 2**10:.0f} KiB input")

# %% [markdown]
# Memory traffic costs time. On a large tensor, each extra pointwise op
# in a chain costs one more full read and write of the tensor, and out-of-place ops also
# allocate a fresh tensor each (on many systems that means fresh pages from the OS, which
# costs more than the arithmetic). We time chains of 1 to 6 cheap ops on a million floats, in
# two flavours:
#
# * `y = y * 1.01`: a new intermediate tensor per op, as ordinary code does;
# * `y.mul_(1.01)` on one preallocated buffer: the same passes over memory, no allocation.
#
# A fused kernel would do all of the ops in a single pass: about the time of one op.
# (On a busy shared machine the points are noisy; the trend is what matters.)

# %% tags=["nbval-ignore-output"]
big = torch.randn(1_000_000)
buffer = big.clone()


def chain_of(k):
    def chain(x):
        for _ in range(k):
            x = x * 1.01
        return x
    return chain


def inplace_chain_of(k):
    def chain(x):
        for _ in range(k):
            x.mul_(1.01)
        return x
    return chain


ks = list(range(1, 7))
chain_ms = [ch.benchmark(chain_of(k), big, warmup=2, repeat=10).median_s * 1e3 for k in ks]
inplace_ms = [ch.benchmark(inplace_chain_of(k), buffer, warmup=2, repeat=10).median_s * 1e3 for k in ks]
for k, ms, ms_inplace in zip(ks, chain_ms, inplace_ms):
    gbytes = k * 2 * big.numel() * 4 / 1e9  # each op reads and writes the whole tensor
    print(f"{k} ops: new tensors {ms:7.2f} ms | in place {ms_inplace:6.2f} ms "
          f"({gbytes / (ms_inplace / 1e3):5.1f} GB/s of memory traffic)")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
ax.plot(ks, chain_ms, "o-", label="eager, a new tensor per op")
ax.plot(ks, inplace_ms, "s-", label="eager, in place (traffic only)")
ax.plot(ks, [inplace_ms[0]] * len(ks), "--", color="gray", label="ideal fused kernel: one pass")
ax.set_xlabel("pointwise ops in the chain")
ax.set_yscale("log")
ax.set_ylabel("milliseconds per call (log)")
ax.set_title("Every eager op re-reads and re-writes memory")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# Both eager curves climb with every op: each op is another pass over the data. The gap
# between them is what allocating the intermediate tensors costs on this machine. A fused
# kernel pays for neither: one read of the input, one write of the output.
#
# ## 5. The pipeline behind `torch.compile`
#
# `torch.compile(fn)` returns a wrapper. On the first call it compiles; later calls with
# similar inputs reuse the result. Compiling goes through these stages:
#
# | stage | what it does | what it produces |
# | --- | --- | --- |
# | **TorchDynamo** | intercepts the Python frame (PEP 523), interprets its bytecode symbolically, records tensor ops; stops at what it cannot trace (a *graph break*) | an FX graph per captured region + guards (when the graph may be reused) |
# | **FX** | a small, readable graph IR: `placeholder`, `call_function`, `call_method`, `output` nodes | `torch.fx.GraphModule` (the backend's input) |
# | **AOTAutograd** | traces the graph down to ATen ops, derives the backward graph ahead of time, splits forward and backward | ATen forward and backward graphs |
# | **Inductor** | decomposes to a small op set, lowers to a loop IR, fuses, schedules | a Python wrapper calling generated kernels |
# | **Triton / C++** | the code generators: Triton kernels on GPUs, C++/OpenMP loops on CPUs | compiled kernels, cached on disk |

# %%
STAGES = [
    ("your Python\nfunction", "#eeeeee"),
    ("TorchDynamo\n(bytecode → graph)", "#e1f5fe"),
    ("FX graph\n(torch ops)", "#e8f5e9"),
    ("AOTAutograd\n(fwd + bwd ATen)", "#fff3e0"),
    ("Inductor\n(loop IR, fusion)", "#fce4ec"),
    ("Triton (GPU)\nC++ (CPU)", "#ede7f6"),
]
STEP = 2.3  # distance between box centres
fig, ax = plt.subplots(figsize=(9, 1.4), dpi=80)
for i, (label, colour) in enumerate(STAGES):
    ax.text(i * STEP, 0, label, ha="center", va="center", fontsize=9,
            bbox=dict(boxstyle="round,pad=0.4", facecolor=colour, edgecolor="#555555"))
    if i:
        ax.annotate("", xy=(i * STEP - 1.0, 0), xytext=((i - 1) * STEP + 1.0, 0),
                    arrowprops=dict(arrowstyle="->", color="#333333"))
ax.set_xlim(-1.0, (len(STAGES) - 1) * STEP + 1.0)
ax.set_ylim(-0.5, 0.5)
ax.axis("off")
ax.set_title("The torch.compile pipeline", fontsize=10)
fig.subplots_adjust(left=0.0, right=1.0, bottom=0.0, top=0.85)
plt.show()
print("  ->  ".join(label.replace("\n", " ") for label, _ in STAGES))

# %% [markdown]
# ## 6. A peek at each artefact, from PyTorch's own stack
#
# We follow one tiny function through the real `torch.compile`.
#
# ### 6.1 TorchDynamo hands a backend an FX graph
#
# A **backend** is any callable `backend(gm, example_inputs) -> callable`: TorchDynamo calls it
# once per captured graph with the `torch.fx.GraphModule` and example inputs, and runs whatever
# it returns in place of that part of your function. **Exercise 0.4** is such a backend,
# `ch.GraphRecorder`, which keeps every graph it is given and runs it unchanged.

# %%
def tiny(x, y):
    a = torch.sin(x) * y
    return F.relu(a + 2)


recorder = ch.GraphRecorder()
compiled_tiny = torch.compile(tiny, backend=recorder)
x, y = torch.randn(8), torch.randn(8)
torch.testing.assert_close(compiled_tiny(x, y), tiny(x, y))
print(f"graphs received: {len(recorder.graphs)}")
print(recorder.graphs[0].code.strip())
print("example inputs:", [tuple(t.shape) for t in recorder.example_inputs[0]])

# %% [markdown]
# Dynamo recorded the tensor operations (`sin`, `mul`, `add`, `relu`) as `call_function`
# nodes; the Python around them (the call, the local variables) is gone. This graph is what
# the rest of the stack compiles — and what `tinydynamo` will produce in chapters 1–4.
#
# ### 6.2 Graph breaks: `torch._dynamo.explain`
#
# When Dynamo meets something it cannot put in a graph (a `print`, a branch on a tensor's
# value, `.item()`), it compiles the graph so far, runs the offending code in plain Python,
# and starts a new graph after it. `explain` reports the graphs, the breaks and why.

# %%
def with_print(x):
    y = torch.sin(x) * 2
    print("side effect: Dynamo cannot put this in a graph")
    return torch.cos(y) + 1


torch._dynamo.reset()
explanation = torch._dynamo.explain(with_print)(torch.randn(8))
print(f"graph_count={explanation.graph_count}, graph_break_count={explanation.graph_break_count}, "
      f"op_count={explanation.op_count}")
print("break reason:", explanation.break_reasons[0].reason.strip().splitlines()[0])

torch._dynamo.reset()
recorder = ch.GraphRecorder()
torch.compile(with_print, backend=recorder)(torch.randn(8))
print(f"GraphRecorder received {len(recorder.graphs)} graphs:",
      [[getattr(t, "__name__", str(t)) for t in ops] for ops in recorder.ops_per_graph])

# %% [markdown]
# ### 6.3 AOTAutograd: forward and backward graphs in ATen ops
#
# For training, the backward pass must be compiled too. AOTAutograd traces the FX graph down
# to ATen ops together with its derivative and splits the result into a forward graph (which
# also returns what the backward needs to keep) and a backward graph. PyTorch's `aot_autograd`
# helper turns two graph compilers into a backend; ours just print the graphs.

# %%
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd


def printing_compiler(title):
    def compiler(gm, example_inputs):
        print(f"--- {title} ---")
        print(gm.code.strip())
        return make_boxed_func(gm.forward)  # AOTAutograd calls compiled graphs with one list argument
    return compiler


torch._dynamo.reset()
aot_backend = aot_autograd(fw_compiler=printing_compiler("forward graph"),
                           bw_compiler=printing_compiler("backward graph"))
x = torch.randn(8, requires_grad=True)
torch.compile(pointwise, backend=aot_backend)(x).sum().backward()
torch.testing.assert_close(x.grad, torch.autograd.grad(pointwise(x).sum(), x)[0])
print("gradient matches eager")

# %% [markdown]
# The backward graph recomputes nothing by hand: it uses saved tensors (`primals_1`, the relu
# output) and ATen's derivative ops (`threshold_backward` is relu's derivative).
#
# ### 6.4 Inductor: one generated kernel instead of four
#
# Now the full default pipeline. `run_and_get_code` runs a compiled function and returns the
# Python module Inductor generated for it: a C++ kernel (on a CPU) and a `call` function that
# allocates the output and runs the kernel. This is also the moment to feel the first call's
# price: Dynamo, AOTAutograd, Inductor and a C++ compiler all run now. (On a fresh machine the
# first Inductor compile also probes the CPU's vector instructions by compiling test programs,
# which takes tens of seconds once; later compiles reuse an on-disk cache.)

# %% tags=["nbval-ignore-output"]
from torch._inductor.utils import run_and_get_code

torch._dynamo.reset()
compiled_pointwise = torch.compile(pointwise)
small = torch.randn(256)
start = time.perf_counter()
result, (code,) = run_and_get_code(compiled_pointwise, small)
first_call_s = time.perf_counter() - start
torch.testing.assert_close(result, pointwise(small))
print(f"first call (compile + run): {first_call_s:.1f} s")


def kernel_source(code: str) -> str:
    """The generated kernel inside Inductor's output module: C++ on a CPU, Triton on a GPU."""
    for start in ('extern "C"', "@triton.jit"):
        if start in code:
            begin = code.index(start)
            return code[begin:code.index("'''", begin)].rstrip()
    return code


print(kernel_source(code))
call_fn = code[code.index("def call("):]
print(call_fn[:call_fn.index("return (")] + "return ...")
modules = getattr(torch._inductor.codecache.PyCodeCache, "modules", [])
modules = list(modules.values()) if isinstance(modules, dict) else list(modules)
if modules:
    print("the generated module lives in", getattr(modules[-1], "__file__", "?"))

# %% [markdown]
# One loop reads the input once, does `sin`, `* 2`, `+ 1` and `max(., 0)` on a vector of
# floats in registers, and stores once: the four kernels and three intermediate tensors of
# eager mode are gone. (With `TORCH_LOGS="output_code"` PyTorch prints this code for any
# compiled function; on a GPU the kernel is Triton instead of C++.)
#
# ## 7. Measured: eager vs `torch.compile` on this CPU
#
# Two workloads, each checked against eager before it is timed:
#
# * a chain of six cheap pointwise ops, on a small tensor (overhead-bound) and on a large one
#   (memory-bound);
# * the seeds' `TinyBlock` at a small size (inference).
#
# The first call, which compiles, is reported apart from the steady-state median.

# %%
def cheap_chain(x):
    return ((x * 1.5 + 0.5).relu() - 0.1) * x + 1.0


workloads = {
    "chain, 256 floats": (cheap_chain, torch.randn(256)),
    "chain, 1M floats": (cheap_chain, torch.randn(1_000_000)),
    "TinyBlock 4x16x64": (TinyBlock(hidden=64).eval(), torch.randn(4, 16, 64)),
}
with torch.no_grad():
    print("eager ATen ops per call:", {name: sum(ch.count_aten_ops(fn, x).values()) for name, (fn, x) in workloads.items()})

# %% tags=["nbval-ignore-output"]
rows = []
with torch.no_grad():
    for name, (fn, x) in workloads.items():
        torch._dynamo.reset()
        compiled = torch.compile(fn, dynamic=False)
        eager = ch.benchmark(fn, x, warmup=3, repeat=20)
        comp = ch.benchmark(compiled, x, warmup=3, repeat=20)
        torch.testing.assert_close(compiled(x), fn(x))
        rows.append((name, eager, comp))


def spread(t) -> str:
    """min / median / max of the timed calls, in ms: how much one number can be trusted."""
    return f"{min(t.times_s) * 1e3:.3f} / {t.median_s * 1e3:.3f} / {max(t.times_s) * 1e3:.3f}"


print(f"{torch.get_num_threads()} thread(s); ms per call as min / median / max of 20 timed calls")
for name, eager, comp in rows:
    print(f"{name:<20} eager {spread(eager):>26} | compiled {spread(comp):>26} "
          f"| speedup {eager.median_s / comp.median_s:5.2f}x | first compiled call {comp.first_call_s:5.1f} s")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
names = [r[0] for r in rows]
speedups = [r[1].median_s / r[2].median_s for r in rows]
bars = ax.bar(names, speedups, color=["#4caf50" if s >= 1 else "#f44336" for s in speedups])
ax.axhline(1.0, color="gray", ls="--")
ax.set_yscale("log")
ax.set_ylabel("eager time / compiled time (log)")
ax.set_title("torch.compile speedup on this CPU (> 1: faster)")
for bar, s in zip(bars, speedups):
    ax.text(bar.get_x() + bar.get_width() / 2, s, f"{s:.2f}", ha="center", va="bottom")
fig.tight_layout()
plt.show()

# %% tags=["nbval-ignore-output"]
for name, eager, comp in rows:
    ratio = eager.median_s / comp.median_s
    fast, slow = (comp, eager) if ratio > 1 else (eager, comp)
    clear = fast.median_s < min(slow.times_s)  # the faster one's median beats every call of the other
    print(f"{name}: compiled is {ratio:.2f}x eager, {'faster' if ratio > 1 else 'slower'} at the median; "
          + ("clear: every call of the other side was slower than that median." if clear
             else "not clear: some calls of the other side were faster, so this is within the noise."))


# %% [markdown]
# What to read in these numbers (they were measured when the notebook ran):
#
# * On the **large chain**, the compiled kernel makes one pass over memory instead of six and
#   allocates one tensor instead of six: that is fusion paying off, the saving that Exercise 0.2
#   measured in bytes.
# * On the **small chain**, the data is tiny, so only overhead matters. The compiled function
#   replaces six dispatcher trips by one call into generated code, but every call still pays for
#   Dynamo's guard check and the Python wrapper around the kernel. On a CPU that can cost as much
#   as the six tiny eager ops it replaces, or more: look at the bar before believing any claim.
#   On a GPU, where each eager op is also a kernel launch, the saving is larger, and
#   `mode="reduce-overhead"` (CUDA graphs) removes most of the launch cost that is left.
# * **TinyBlock** is dominated by its two matrix multiplications, which Inductor hands to the
#   same library eager uses, so fusion can only save on the rest: LayerNorm, GELU and the
#   pointwise tail. At this small size that saving is about as large as the compiled call's
#   fixed costs (guard check, wrapper), so the bar can land on either side of 1 from one run to
#   the next: above 1, fusion won; below 1, the overhead did. The cell above the list says
#   which, and whether the difference stands clear of this machine's noise.
# * The **first call** pays for compiling: seconds on a fresh machine (section 6.4), less when
#   Inductor's on-disk cache already holds the kernels (as when this notebook is re-run), against
#   microseconds to milliseconds saved per call. Compiling only pays when the function is called
#   many times.
#
# `bench/eager_vs_compile.py` runs the same comparison from the command line at any size, with
# every backend and mode as a column.
#
# ## 8. Modes and backends you will meet
#
# `torch.compile(model, backend=..., mode=..., fullgraph=..., dynamic=...)`
#
# | option | what it is for |
# | --- | --- |
# | `backend="inductor"` (default) | the full pipeline: fusion and generated kernels |
# | `backend="aot_eager"` | Dynamo + AOTAutograd, graphs run by eager PyTorch: is the bug in Inductor or earlier? |
# | `backend="eager"` | Dynamo only, the captured graphs run eagerly: is the bug in capture? counts graph breaks cheaply |
# | a callable | your own backend `(gm, example_inputs) -> callable`, like Exercise 0.4 |
# | `mode="default"` | balanced compile time and speed |
# | `mode="reduce-overhead"` | CUDA graphs: replays a whole recorded graph of launches; for small batches on GPU; uses more memory |
# | `mode="max-autotune"` | benchmarks several kernel configurations (matmul templates, tile sizes) and picks the fastest; long compiles; with CUDA graphs |
# | `mode="max-autotune-no-cudagraphs"` | the same autotuning without CUDA graphs |
# | `fullgraph=True` | any graph break is an error: checks that the hot path is captured whole |
# | `dynamic=True / False / None` | shapes as symbols / always specialise / specialise first, go dynamic on the first shape change (default) |
#
# The debugging ladder when something is wrong: `backend="eager"` → `"aot_eager"` →
# `"inductor"`; the first one that misbehaves names the guilty layer. Each mode is just a set of
# Inductor options:


# %% tags=["nbval-ignore-output"]
import torch._inductor

for mode_name, options in torch._inductor.list_mode_options().items():
    print(f"{mode_name:<28} {options}")
print("\nregistered backends:", torch._dynamo.list_backends())

# %% [markdown]
# On a GPU, `mode="reduce-overhead"` records the compiled function's kernel launches once as a
# CUDA graph and replays the whole graph with a single launch afterwards. It matters most where
# section 2's overhead dominates: small tensors, many ops. This cell only runs on a GPU.

# %% tags=["nbval-ignore-output"]
if torch.cuda.is_available():
    x_gpu = torch.randn(256, device="cuda")
    with torch.no_grad():
        for label, fn in [("eager", cheap_chain),
                          ("default", torch.compile(cheap_chain, dynamic=False)),
                          ("reduce-overhead", torch.compile(cheap_chain, mode="reduce-overhead", dynamic=False))]:
            timing = ch.benchmark(fn, x_gpu, warmup=5, repeat=50)  # synchronises: the input is on CUDA
            torch.testing.assert_close(fn(x_gpu), cheap_chain(x_gpu))
            print(f"GPU chain, 256 floats, {label:<16} {timing.median_s * 1e6:8.1f} us per call")
    torch._dynamo.reset()
else:
    print("No CUDA device here: skipping the GPU comparison of modes (run this notebook on a GPU machine to see it).")

# %% [markdown]
# The three built-in levels on the same block, each checked against eager:

# %%
block = TinyBlock(hidden=64).eval()
x = torch.randn(4, 16, 64)
with torch.no_grad():
    expected = block(x)
    for backend in ["eager", "aot_eager"]:
        torch._dynamo.reset()
        out = torch.compile(block, backend=backend)(x)
        torch.testing.assert_close(out, expected)
        print(f"backend={backend!r:<12} matches eager")
print("backend='inductor'   matched eager in section 7")

# %% [markdown]
# ## 9. When not to compile
#
# * **Few calls.** The first call costs seconds (section 6.4); a script that runs a function a
#   handful of times only loses.
# * **Changing inputs.** The compiled code is guarded by assumptions about its inputs (shapes,
#   dtypes, Python constants). Break one and it recompiles. Watch it with our recorder:

# %%
def scale(x, factor):
    return x * factor + 1


for dynamic in [False, None]:
    torch._dynamo.reset()
    recorder = ch.GraphRecorder()
    compiled_scale = torch.compile(scale, backend=recorder, dynamic=dynamic)
    for n in [4, 5, 6, 7]:
        compiled_scale(torch.randn(n), 2.0)
    compiled_scale(torch.randn(7), 3.0)  # a different Python float: a constant baked into the graph
    inputs_seen = [[tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__ for v in inputs]
                   for inputs in recorder.example_inputs]
    print(f"dynamic={dynamic!s:<5}: 5 calls -> {len(recorder.graphs)} compiled graphs; inputs of each: {inputs_seen}")
torch._dynamo.reset()

# %% [markdown]
# With `dynamic=False` each new length is a new compile (Dynamo gives up after
# `torch._dynamo.config.recompile_limit` of them and runs eagerly). With the default, the
# second length makes Dynamo compile one graph whose size is a symbol (the extra `SymInt`
# input), reused for every later length. The changed Python float forces one more compile
# either way: Dynamo first bakes a float argument into the graph as a constant.
#
# * **Code Dynamo cannot capture.** Frequent graph breaks (prints, `.item()`, data-dependent
#   branches, unsupported libraries) chop the function into small graphs with eager code in
#   between; little is left to fuse. Check with `explain` or `fullgraph=True` first.
# * **Time spent elsewhere.** If the time goes to data loading, a tokenizer, I/O, or a few
#   huge matrix multiplications that already run at the library's speed, there is nothing for
#   the compiler to win. Profile first.
# * **Quick experiments.** While the model changes every minute, eager's instant start and
#   plain Python debugging are worth more.
#
# Compile the stable, tensor-heavy hot path (a model's `forward`, a training step), check its
# output against eager, and measure with warmup and the first call excluded.
#
# ## 10. The course from here
#
# We now rebuild this pipeline in pure Python, one layer per chapter, checked against eager
# PyTorch at every step and measured against `torch.compile`:
#
# | chapter | topic | package |
# | --- | --- | --- |
# | 0 | why compile (this chapter) | — |
# | 1 | bytecode and frames: code objects, `dis`, `sys.settrace`, PEP 523 | `tinydynamo.bytecode` |
# | 2 | a symbolic bytecode interpreter that turns Python into FX graphs | `tinydynamo` |
# | 3 | guards and the compiled-code cache, recompiles | `tinydynamo` |
# | 4 | graph breaks: transformed code, resume functions, `explain`, `fullgraph` | `tinydynamo` |
# | 5 | FX graphs, decompositions to a small op set, a graph pass | `tininductor` |
# | 6 | AOT autograd: joint forward/backward graphs, partitioners | `tininductor` |
# | 7 | the loop IR, the ops handler, fusion decisions | `tininductor` |
# | 8 | Triton code generation, run in the interpreter or on a GPU | `tininductor` |
# | 9 | C++ code generation and the code cache | `tininductor` |
# | 10 | dynamic shapes: sizes as symbols, guards on them, kernels that take sizes as arguments | both |
# | 11 | end to end: the benchmarks of this chapter, with our compiler as a column | both |
#
# The two packages mirror PyTorch's halves: **`tinydynamo`** is the front end (TorchDynamo:
# capture, guards, cache, graph breaks), **`tininductor`** the back end (AOTAutograd,
# decompositions, Inductor's IR, fusion and code generation). They meet at the same backend
# contract you implemented in Exercise 0.4, so each half can be swapped for PyTorch's own:
# `torch.compile(f, backend=tininductor.compile_fx)` and
# `tinydynamo.compile(f, backend="inductor")`.
#
# ## From the package
#
# This chapter built measuring instruments rather than a compiler layer, so there is nothing to
# import yet but the shared vocabulary: every layer of `tinydynamo` and `tininductor` records
# what it produces while compiling, under these kinds, in pipeline order — the artefacts we just
# looked at in PyTorch's stack.

# %%
from tinydynamo import artifacts

print(" -> ".join(artifacts.KINDS))
