# %% [markdown]
# # Chapter 11 — End to end: tiny against eager and `torch.compile`
#
# Ten chapters built a compiler one layer at a time. This one runs the whole stack on the
# seeds' LayerNorm-MLP block and measures it the way the seeds' benchmark does: the same
# inputs through eager, PyTorch's `torch.compile` and our `tinydynamo` + `tininductor`,
# first-call cost kept apart, every output checked against eager before it is timed.
#
# **What you will learn**
#
# * how to read a benchmark of a compiler: time per call, GB/s, and percent of the memory
#   bandwidth the machine can actually deliver (Exercise 11.1 computes the yardstick);
# * where the speed comes from (fewer kernels, fewer bytes) and where it is lost;
# * when compiling is *slower* — tiny inputs, graph breaks, recompiles — each shown by a
#   measurement, with the fixes: a tensor-only rewrite (Exercise 11.2) and shape bucketing
#   (Exercise 11.3).
#
# CPU numbers below are measured when the notebook runs, on whatever machine runs it (CI has
# 2 cores, so keep your expectations modest); GPU numbers come from a stored run on the
# device machine and are labelled with the device and date.

# %% tags=["nbval-ignore-output"]
import copy
import json
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import tinydynamo
import tininductor
from course import benchmark, load
from course.models import TinyBlock
from tinydynamo import artifacts
from tinydynamo.testing import CompileCounterWithBackend

ch = load("ch11", unfinished="package")
torch.manual_seed(0)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# A fixed thread count (one per physical core, at most 8): left to itself, torch's count and a
# busy machine's load make CPU timings swing from run to run.
print("device:", DEVICE, "| CPU threads:", benchmark.pin_threads())

# %% [markdown]
# ## 1. The whole stack on the seeds' block
#
# `tinydynamo.compile` with its default backend, `"tininductor"`, runs every layer of the
# course: bytecode → FX graph with guards (chapters 1–4) → decompositions and AOT autograd
# (5–6) → loop IR, fusion and kernels (7–9). Each layer recorded what it produced.

# %%
block = TinyBlock(hidden=64).eval()
x = torch.randn(4, 16, 64)
compiled_block = tinydynamo.compile(block)
with torch.no_grad():
    torch.testing.assert_close(compiled_block(x), block(x), rtol=1e-4, atol=1e-4)
print("compiled output equals eager")

frame = artifacts.history[-1]
for kind in artifacts.KINDS:
    if frame.get(kind):
        print(f"{kind:<17}", ", ".join(title for title, _ in frame.get(kind)))

# %% [markdown]
# Two matrix multiplies stay calls into torch (extern kernels); everything else became a few
# generated kernels. Here is the wrapper that runs them, the code `TINY_LOGS=output_code`
# prints:

# %%
wrapper_source = frame.get("output_code")[-1][1]
call_start = wrapper_source.index("def call(")
print(wrapper_source[call_start:call_start + 1500])

# %% [markdown]
# ## 2. The yardstick: ideal bytes and percent of bandwidth
#
# A pointwise chain does almost no arithmetic per byte, so its speed limit is memory
# bandwidth. The best any implementation can do is read each input once and write each
# output once: that is `ideal_bytes` (Exercise 11.1). Divide by the time to get GB/s, and by
# the bandwidth of a plain copy on the same machine to get "percent of what is possible".

# %%
def chain(x, s, b, r):
    return F.gelu(x * s + b, approximate="tanh") + r


n = 1 << 16
inputs = [torch.randn(n), torch.tensor(1.5), torch.tensor(0.25), torch.randn(n)]
print("ideal bytes for n = 2^16:", ch.ideal_bytes(torch.fx.symbolic_trace(chain), inputs))
print("that is", ch.ideal_bytes(torch.fx.symbolic_trace(chain), inputs) / (n * 4), "floats of 4 bytes per element")

# %% [markdown]
# Now the sweep. Each backend compiles once per size (shapes are static here), and each
# output is checked against eager before it is timed. Eager launches one kernel per op and
# writes every intermediate; the compilers fuse the chain into one kernel.

# %% tags=["nbval-ignore-output"]
peak = benchmark.copy_bandwidth(DEVICE, 1 << 26)
sizes = [1 << p for p in (10, 13, 16, 19, 21)]
backends = benchmark.compilers(["eager", "torch.compile", "tiny"])
results = {name: [] for name in backends}
for n in sizes:
    args = (torch.randn(n), torch.tensor(1.5), torch.tensor(0.25), torch.randn(n))
    expected = chain(*args)
    nbytes = ch.ideal_bytes(torch.fx.symbolic_trace(chain), list(args))
    benchmark.reset_compilers()
    for name, make in backends.items():
        fn = make(chain)
        benchmark.check_close(name, fn(*args), expected, rtol=1e-5, atol=1e-5)
        timing = benchmark.bench_spread(fn, args, DEVICE, warmup=3, iters=20)
        results[name].append((timing.median, nbytes / timing.median, timing))
print(f"copy bandwidth on this machine: {peak / 1e9:.1f} GB/s; us per call: median, and min-max of 5 batches")
rows = [{"n": n, **{col: val for k in results for col, val in ((f"{k} us", results[k][i][0] * 1e6),
                                                              (f"{k} range", results[k][i][2].format()))},
         "tiny vs eager": results["eager"][i][0] / results["tiny"][i][0],
         "tiny vs torch.compile": results["torch.compile"][i][0] / results["tiny"][i][0]} for i, n in enumerate(sizes)]
benchmark.print_table(rows, list(rows[0]))

# %% tags=["nbval-ignore-output"]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5), dpi=80)
for name, values in results.items():
    ax1.plot(sizes, [results["eager"][i][0] / s for i, (s, _, _) in enumerate(values)], marker="o", label=name)
    ax2.plot(sizes, [100 * bw / peak for _, bw, _ in values], marker="o", label=name)
ax1.set(xscale="log", xlabel="elements", ylabel="speedup over eager", title="pointwise chain")
ax2.set(xscale="log", xlabel="elements", ylabel="% of copy bandwidth", title="bandwidth used")
ax1.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# Read the plot from left to right. At small sizes every backend is dominated by fixed costs
# (Python, guards, the launch), so the lines sit near 1 and a compiler can even lose. As the
# tensors grow, eager pays for the intermediates it writes and reads back, and the fused
# kernels pull ahead, approaching the copy bandwidth.
#
# ## 3. The block: inference and a training step

# %% tags=["nbval-ignore-output"]
def time_block(phase: str) -> dict:
    torch.manual_seed(0)
    model = TinyBlock(hidden=128)
    x = torch.randn(8, 32, 128)
    row = {"phase": phase}
    for name, make in benchmark.compilers(["eager", "torch.compile", "tiny"]).items():
        benchmark.reset_compilers()
        if phase == "inference":
            fn = make(model.eval())
            with torch.no_grad():
                benchmark.check_close(name, fn(x), model(x), rtol=1e-4, atol=1e-4)
                timing = benchmark.bench_spread(fn, (x,), DEVICE, warmup=3, iters=10)
        else:
            fn = make(model.train())

            def step(inp):
                model.zero_grad(set_to_none=True)
                fn(inp).sum().backward()

            step(x)
            timing = benchmark.bench_spread(step, (x,), DEVICE, warmup=2, iters=5)
        row[f"{name} ms"], row[f"{name} range"] = timing.median * 1e3, timing.format(scale=1e3)
    row["tiny vs eager"] = row["eager ms"] / row["tiny ms"]
    return row


print("ms per call: median, and min-max of 5 batches")
benchmark.print_table([time_block("inference"), time_block("training")],
                      ["phase", "eager ms", "eager range", "torch.compile ms", "torch.compile range",
                       "tiny ms", "tiny range", "tiny vs eager"])

# %% [markdown]
# ## 4. When compiling is slower
#
# A compiler is a bet: pay once to compile, then save on every call. Four ways to lose the
# bet, each measured.
#
# ### 4a. The first call
#
# The first call traces, guards, decomposes, lowers, generates and builds kernels. How many
# calls does it take to earn that back?

# %% tags=["nbval-ignore-output"]
def first_call_and_steady(make, fn, args):
    benchmark.reset_compilers()
    compiled = make(fn)
    start = time.perf_counter()
    compiled(*args)
    first = time.perf_counter() - start
    return first, benchmark.bench(compiled, args, DEVICE, warmup=2, iters=20)


args = (torch.randn(1 << 18), torch.tensor(1.5), torch.tensor(0.25), torch.randn(1 << 18))
eager_s = benchmark.bench(chain, args, DEVICE, warmup=2, iters=20)
for name in ("torch.compile", "tiny"):
    first, steady = first_call_and_steady(benchmark.compilers([name])[name], chain, args)
    saved = eager_s - steady
    calls = f"{first / saved:,.0f} calls" if saved > 0 else "never (it is not faster per call)"
    print(f"{name:<14} first call {first:.2f} s, then {steady * 1e6:.0f} us vs eager {eager_s * 1e6:.0f} us: pays off after {calls}")

# %% [markdown]
# Where does the first call's time go? `tinydynamo.utils.compile_times()` (the counterpart of
# `torch._dynamo.utils.compile_times()`) adds up the wall time of each compile phase; phases
# nest (`trace` runs inside `compile_frame`), so read each row as "of which". Here a fresh
# function is compiled in this (already warm) process:

# %% tags=["nbval-ignore-output"]
from tinydynamo.utils import compile_times, reset_compile_times

reset_compile_times()
benchmark.reset_compilers()
benchmark.compilers(["tiny"])["tiny"](lambda x, r: torch.nn.functional.gelu(x * 2.5) - r)(*args[::3])
print(compile_times())

# %% [markdown]
# In a fresh process (`python bench/cold_compile.py`, which prints the same table) two phases
# dominate on this 2-core CPU: `fake_tensor_mode`, 1.3-2 s, is the first
# `FakeTensorMode()`, which imports all of TorchDynamo for its configuration (torch.compile
# pays that import too), and `cpp_build`, about 1 s per g++ run. Tracing, lowering,
# scheduling and code generation together take tens of milliseconds. On a GPU the g++ runs
# are replaced by Triton's compile of each kernel (`triton_first_launch`), which also builds
# Triton's C launcher and driver module with gcc the first time in an empty cache.
#
# ### 4b. Graph breaks
#
# The seeds' `bad_fn` prints and branches on `.item()`: a data-dependent jump that no guard
# can cover, because the value only exists after the computation runs. TorchDynamo (and
# chapter 4's tinydynamo) split the function there; each piece is a separate graph with its
# own launch and a trip back to Python in between. The tensor-only rewrite of Exercise 11.2
# keeps one graph.

# %%
def bad_fn(x):
    y = x.sin() + x.cos()
    if y.sum().item() > 0:
        return y * 2
    return y - 2


for fn in (bad_fn, ch.positive_branch):
    tinydynamo.reset()
    counter = CompileCounterWithBackend("tininductor")
    compiled = tinydynamo.compile(fn, backend=counter)
    x = torch.randn(4096)
    torch.testing.assert_close(compiled(x), bad_fn(x))
    print(f"{fn.__name__:<16} graphs compiled: {counter.frame_count}")

# %% tags=["nbval-ignore-output"]
x = torch.randn(1 << 18)
for fn in (bad_fn, ch.positive_branch):
    tinydynamo.reset()
    compiled = tinydynamo.compile(fn)
    compiled(x)
    print(f"{fn.__name__:<16} {benchmark.bench(compiled, (x,), DEVICE, 2, 20) * 1e6:8.0f} us per call")

# %% [markdown]
# ### 4c. Recompiles
#
# Guards specialise a compiled graph to its input shapes. Feed a new sequence length every
# call and every call compiles — until `recompile_limit` gives up and runs eagerly. Padding
# to a few buckets (Exercise 11.3) bounds the number of compiles by the number of buckets.
# (Shapes are kept static here with `dynamic=False`; chapter 10's default policy would make
# the length a symbol at its first change instead, and compile twice.)

# %%
def row_norm(x):
    return F.layer_norm(x, x.shape[-1:]) * 2 + 1


lengths = [3, 5, 8, 9, 12, 16, 17, 20, 31, 32, 4, 15]
for label, wrap in (("every length", lambda f: f), ("buckets 8/16/32", lambda f: ch.bucketed(f, [8, 16, 32]))):
    tinydynamo.reset()
    counter = CompileCounterWithBackend("eager")
    fn = wrap(tinydynamo.compile(row_norm, backend=counter, dynamic=False))
    for n in lengths:
        x = torch.randn(2, n, 24)
        torch.testing.assert_close(fn(x), row_norm(x))
    print(f"{label:<16} {len(lengths)} calls -> {counter.frame_count} compiles")

# %% [markdown]
# ### 4d. Tiny inputs
#
# On an 8-element tensor the kernel costs nothing; what remains is each system's own
# per-call overhead: guard checks, the wrapper, the launch. Eager has the least machinery.

# %% tags=["nbval-ignore-output"]
small = (torch.randn(8), torch.tensor(1.5), torch.tensor(0.25), torch.randn(8))
benchmark.reset_compilers()
for name, make in benchmark.compilers(["eager", "torch.compile", "tiny"]).items():
    fn = make(chain)
    fn(*small)
    print(f"{name:<14} {benchmark.bench(fn, small, DEVICE, 100, 2000) * 1e6:6.1f} us per call")

# %% [markdown]
# Where do tiny's microseconds go? A cached call passes through every layer of the course, and
# each one can be timed on its own. The whole call binds the arguments and looks up the cache
# (chapter 3), the guard check runs, and the compiled frame then fetches the graph inputs and
# calls the backend. The AOT runtime checks grad mode (chapter 6), and finally the wrapper's
# `call()` allocates the output and runs the kernel (chapters 8 and 9):

# %% tags=["nbval-ignore-output"]
import timeit

from tininductor.compile_fx import compiled_graphs


def add_one(x):
    return x + 1


x8 = torch.randn(8, device=DEVICE)
tinydynamo.reset()
compiled_add = tinydynamo.compile(add_one)
compiled_add(x8)
entry = tinydynamo.cache_info(compiled_add).entries[0]
wrapper = compiled_graphs[-1].module
L, G = {"x": x8}, add_one.__globals__
layers = {
    "eager x + 1": lambda: x8 + 1,
    "tiny, the whole cached call": lambda: compiled_add(x8),
    "  the guard check alone": lambda: entry.check_fn.check(L, G),
    "  the compiled frame (fetch inputs, run)": lambda: entry.run(L, G),
    "    the wrapper's call() alone": lambda: wrapper.call([x8]),
}
for name, fn in layers.items():
    seconds = min(timeit.repeat(fn, number=5000, repeat=5)) / 5000
    print(f"{name:<42} {seconds * 1e6:6.2f} us")

# %% [markdown]
# Each line of that wrapper is on the hot path of every call, so tininductor generates the
# cheapest exact form of each, the same forms TorchInductor generates. Outputs are allocated
# by torch's C++ `empty_strided_cpu` / `empty_strided_cuda`, and views are made by
# `reinterpret_tensor`; neither parses Python arguments. Library kernels are called as
# `torch.mm`, not through the `torch.ops.aten.mm.default` overload object: the ATen kernel is
# the same, with less Python in front of it. The guards and the compiled frame skip Python
# too: they read a parameter as `L['self']._modules['fc1']._parameters['weight']`, straight from
# the module's dicts, instead of through `nn.Module.__getattr__` (what people read is still
# `L['self'].fc1.weight`). On the GPU machine, benchmark runs before and after these changes
# took the cached `x + 1` from 18-24 us to 11-14 us per call, and the fp16 block's inference
# from 0.88x eager to 1.1-1.35x.
#
# ## 5. On a GPU
#
# The same benchmark scripts (`bench/run_all.py`) ran on the device machine. Their stored
# results are shown here with the device and date they came from; run
# `python bench/run_all.py` on your own GPU to compare.

# %%
stored = Path("data/gpu_results.json")
if stored.exists():
    gpu = json.loads(stored.read_text())
    print(f"device: {gpu['device']}   date: {gpu['date']}   torch {gpu['torch']}   python {gpu['python']}")
    for name, payload in gpu["results"].items():
        if "error" in payload:
            print(f"\n{name}: failed on the device: {payload['error'].strip().splitlines()[-1]}")
            continue
        rows = payload["rows"]
        print()
        benchmark.print_table(rows, list(dict.fromkeys(k for r in rows for k in r)), title=name)
else:
    print("no stored GPU run in notebooks/data/gpu_results.json")

# %% [markdown]
# The pointwise sweep of that run, plotted like the CPU one in section 2. At 2^26 elements
# both compilers move about 3 TB/s, the copy bandwidth of the H100's memory; eager moves a
# third of that, because every op of the chain writes its result to memory and the next op
# reads it back. Below about 2^22 elements all three are bound by per-call costs on the host,
# and tiny's lean cached path (section 4d) puts it ahead of torch.compile and, at most sizes,
# of eager. The host is noisy at these sizes: a point that breaks the pattern (here tiny's at
# 2^14) moves from run to run.

# %% tags=["nbval-ignore-output"]
if stored.exists() and "rows" in gpu["results"].get("pointwise_chain", {}):
    chain_rows = gpu["results"]["pointwise_chain"]["rows"]
    benchmark.plot_chain(chain_rows, title=f"chain on {gpu['device']}")
    plt.show()

# %% [markdown]
# ### Launch overhead: three levers
#
# On a GPU a small graph is bounded by the host, not the device. A kernel on 4096 elements
# runs in a few microseconds, but issuing it through Triton's `kernel[grid](...)` costs 10-20 us
# of Python (binding, specialisation key, cache lookup). tininductor removes that in three
# steps:
#
# * **direct launches** (always on): each generated kernel is bound once to a `TritonLauncher`
#   that calls the compiled kernel's C launcher with the precomputed grid (chapter 8);
# * **a lean wrapper** (always on): C++ allocators and views, `torch.mm` for library kernels
#   (section 4d above);
# * **CUDA graphs** (`tinydynamo.compile(f, mode="reduce-overhead")`): the whole sequence of
#   launches of an inference graph is recorded once and replayed with one call
#   (`tininductor/runtime/cudagraphs.py`). Inputs are copied into static buffers first, and the
#   outputs live in the graph's memory: the next call overwrites them, as with
#   `torch.compile(mode="reduce-overhead")`.
#
# The stored run measured both: the `call_overhead` and `block` tables above are the default
# mode; the `reduce-overhead` ones run both compilers in that mode.

# %% tags=["nbval-ignore-output"]
from IPython.display import display  # noqa: E402

from course.pictures import cudagraph_dot  # noqa: E402
from tinydynamo import viz  # noqa: E402

if viz.can_render():
    display(cudagraph_dot(["LayerNorm kernel", "mm", "bias + GELU kernel", "mm", "bias + residual kernel"],
                          "one forward of the block on a GPU: 3 fused kernels and 2 matmuls"))
else:
    print("install Graphviz (apt install graphviz) to see CUDA graph capture and replay drawn")

# %%
if stored.exists():
    def gpu_row(name, **match):
        return next(r for r in gpu["results"][name]["rows"] if all(r[k] == v for k, v in match.items()))

    for name in ("block", "block reduce-overhead"):
        r = gpu_row(name, phase="inference", dtype="float16")
        print(f"{name:<22} fp16 inference: eager {r['eager ms']:.3f} ms, torch.compile {r['torch.compile ms']:.3f} ms, "
              f"tiny {r['tiny ms']:.3f} ms ({r['tiny vs eager']:.2f}x eager)")
    for name in ("call_overhead", "call_overhead reduce-overhead"):
        r = gpu_row(name, function="x + 1")
        print(f"{name:<30} x + 1: eager {r['eager us/call']:.1f} us, torch.compile {r['torch.compile us/call']:.1f} us, "
              f"tiny {r['tiny us/call']:.1f} us")

# %% [markdown]
# ### Host-bound steps
#
# `profile_step` in the stored run splits one fp16 training step of the block into wall time and
# the time the GPU spends in kernels. Kernels account for well under half of the wall time,
# for every backend: at this size the step is bound by the host (Python, autograd, launches),
# so a compiler that fuses kernels barely moves the wall time; what helps is issuing fewer
# launches with less Python around them, which is what CUDA graphs do.

# %%
if stored.exists() and "rows" in gpu["results"].get("profile_step", {}):
    for r in gpu["results"]["profile_step"]["rows"]:
        print(f"{r['backend']:<14} wall {r['wall ms']:.2f} ms, kernels {r['kernel ms']:.3f} ms "
              f"({r['kernels/step']:.0f} per step): GPU busy {r['device busy %']:.0f}% of the step")

# %% [markdown]
# CUDA graphs pay off when a graph launches many kernels and its inputs are small to copy. For
# `x + 1` they do not: one kernel launch was already cheap, and the input copy costs about as
# much as the launch it saves. Training needs one more rule: the activations a forward replay
# saves live in graph memory and must survive until its backward, so a forward is not replayed
# while an earlier replay's backward is pending (it runs without the graph, in fresh memory),
# and gradients are handed to autograd as copies.

# %% [markdown]
# ### max-autotune: measure instead of guessing
#
# Block sizes and warp counts come from heuristics (chapter 8's `block_sizes`) that look only
# at the sizes. `tinydynamo.compile(f, mode="max-autotune")` gives each kernel's launcher a few
# candidate configs instead. At the first launch each one is compiled and timed on the real
# arguments (`triton.testing.do_bench`), and the fastest is kept, also in the code cache for
# the next process (`tininductor/runtime/autotune.py`). The candidates are checked against
# eager like everything else (`tests/test_autotune.py`). The stored run has the chain in that
# mode for both compilers (`max-autotune-no-cudagraphs`, large sizes):

# %%
if stored.exists() and "rows" in gpu["results"].get("pointwise_chain max-autotune", {}):
    for mode, name in (("default", "pointwise_chain"), ("max-autotune", "pointwise_chain max-autotune")):
        for r in gpu["results"][name]["rows"]:
            if r["n"] == "2^26":
                print(f"{mode:<13} {r['dtype']:<8} n = 2^26: torch.compile {r['torch.compile GB/s']:.0f} GB/s, "
                      f"tiny {r['tiny GB/s']:.0f} GB/s ({r['tiny vs torch.compile']:.3f}x torch.compile)")

# %% [markdown]
# At this size both compilers are at the memory roofline, so the autotuner has little left to
# find: the default and the tuned kernels agree to about 1%, the size of run-to-run noise.
# Autotuning pays where the heuristic is wrong for the machine, and its price is compile time.
# Every candidate is a separate Triton compile.

# %% [markdown]
# ### A real training step: a GPT with embeddings
#
# `bench/gpt_train.py` trains `course.models.GPT` (6 layers x 192, 32 x 128 tokens, token and
# position embeddings, attention written out) for one step per call: forward, cross-entropy,
# backward, every gradient checked against eager first. Three things had to change before tiny
# kept up with torch.compile on it, and each is a general lesson:
#
# * **Indexing belongs in the IR.** The embedding's backward is an `index_put(accumulate=True)`;
#   run by torch it is a sort-based kernel plus host-visible bounds checks. Lowered, it is one
#   kernel of `tl.atomic_add`s (a serial loop in C++), and the bounds check is inside the
#   kernel (`tl.device_assert`; `tiny_check_index` in C++), never an extra op. A slice's
#   gradient, an `index_put` at `start + step * arange(n)`, is not a scatter at all but a
#   pointwise select that fuses (`tininductor/lowering.py`, `tests/test_inductor_indexing.py`).
# * **Layouts matter to autograd.** A Linear's weight gradient made as a transposed view costs
#   a copy per weight per step (autograd puts it in the weight's layout); made contiguous by
#   the backward's own matmul it costs nothing.
# * **Compile in parallel.** Each Triton launcher starts compiling when the wrapper module
#   loads, so the graph's kernels compile side by side: in a thread pool at first, then in
#   worker processes (`tininductor/runtime/compile_worker.py`, TorchInductor's subprocess pool
#   in small), because Triton's compiler holds the GIL for most of its work. The first call of
#   this step dropped from about 41 s (one kernel after another) to 13 s with threads and about
#   10 s with worker processes on the H100, against 16-19 s for torch.compile. The workers
#   take a forward's kernels before a backward's: a graph waits only for its forward, and the
#   backward's kernels compile while the forward runs; its first call waits for what is left.
#   A model cut into several graphs (BART's LayerDrop breaks before each layer) then overlaps
#   the backward kernels of one graph with the tracing of the next. The workers are forked from
#   one process that imports Triton once: workers that each import it compete with the main
#   process while it traces (on two cores, four such workers took OPT's training compile from
#   2.2 to 3.7 s; forked, 2.3 s).
# * **Start each compile as early as it can start, and the longest first.** A kernel's compile
#   can begin as soon as its source exists, not when the module around it loads: the wrapper
#   hands each new Triton kernel to `compile_early`, which loads it as a module of its own whose
#   launcher submits it, and the graph's module later finds that compile under the same key. The
#   workers take the longest kernel first (by source length, longest-processing-time-first): a
#   long compile started last finishes after all the others. BART's backward sent its 33 kernels
#   only once its module loaded, in module order, and its first backward waited 0.74 s for them
#   (a 0.99 s kernel had started last); compiled as they were generated, BART's first call waited
#   0.00 s on the H200 host.
# * **Compiling for a GPU does not need the GPU.** A worker's first kernel also paid for starting
#   CUDA (a context, hundreds of MB of GPU memory, in each of sixteen workers at once) and Triton's
#   compiler: 2-3 s on the H200 host, against 0.1-0.5 s for its later kernels. Triton only asks
#   CUDA which architecture to compile for, so the main process names it and the workers install
#   a Triton driver that answers from that (`compile_server.offline_driver`); with no CUDA in it,
#   the forking process can compile one small kernel before it forks, and every worker starts
#   as a copy of a process whose compiler has already run. Until the pool is ready, two threads
#   of the main process take kernels over, and only
#   once the main thread waits for them (`triton_launcher.await_kernel`): sixteen took the GIL
#   from the main thread, and two started at once still slowed the backward's compile beside
#   them while taking 2.1-2.5 s per kernel that a worker compiles in 0.1-1 s. OPT's training
#   step, first call in a fresh process on the H200 host: its forward waited 2.3 s for its
#   kernels with workers that each start CUDA, 0.9 s with the offline driver, and the whole first
#   call took 6.95 s (11.5 s with sixteen take-over threads).
# * **A worker needs Triton, not torch.** Importing torch took the forking process four to five
#   seconds on the H200 host, longer than OPT's or Llama's whole compile: their first kernels
#   waited for the pool (OPT 3.9 s, Llama 3.4 s). Compiling a kernel needs only its source and
#   its *specialisation*: each argument's type, which pointers and sizes are 16-byte aligned, the
#   constexprs and options. The main process works that out with Triton's own binder, stopped
#   just before it would compile (`triton_launcher.specialization`, through Triton's
#   `jit_cache_hook`), and sends it as Triton's JSON record; the worker compiles the record
#   (`JITFunction.preload`) in a process that never imports torch
#   (`tininductor/runtime/compile_server.py`). Binding in the worker instead, with stand-ins for
#   tensors, is not safe: Triton's C++ argument specialiser imports torch on first use and
#   caches pointer types by `hash(dtype)`, and stand-in dtypes whose hashes collide got the
#   wrong pointer types. The pool of sixteen is now ready 1.5 s after it starts; OPT's first
#   call waits 0.2-0.4 s for kernels and takes 4.2-4.5 s, Llama's 5.0-5.8 s (torch.compile:
#   14.3 s and 20.7 s in the same dashboard run).
# * **Look at the slowest kernel's compile, not the average.** A timeline of one first call
#   (each compile phase with its wall and CPU time, each kernel's compile in a worker and its
#   load: `tinydynamo.utils.chromium_event_log()` records it, `bench/first_call.py` prints it
#   for a dashboard model and writes a Chrome trace) showed BART's training forward waiting 9 s for a
#   single kernel of 126 loads and 64 stores: residual sums saved for the backward, realized
#   last and piled into whichever kernel came last. The scheduler now puts each into the kernel
#   that already reads its inputs (chapter 7) and caps a kernel's size, and that first call
#   dropped from 28 to 22 s.
# * **Load what a worker compiled without asking Triton again.** A worker compiles a kernel
#   into Triton's disk cache; the main process could call Triton's `warmup` with the same
#   arguments to find it there. A cache hit still binds the arguments, hashes the source and
#   reads the cached metadata and every intermediate file: Python, in loader threads holding
#   the GIL while the main thread compiles the backward (BART's training step: 84 loads,
#   15-53 s of thread time in all). So a worker answers with the kernel's binary
#   (`KernelBinary`: the cubin's path, argument types, warps, shared memory), and the main
#   process hands the cubin to torch's launcher. On the H200 host BART's training step's first
#   call was 1.16 of torch.compile's through Triton's cache and 0.68 with the binary, OPT's 1.08
#   and 0.71.
# * **Generate and compile each kernel once, and build nothing to launch it.** Six identical
#   layers give six copies of each layer's kernels, equal but for their names: the wrapper keeps
#   the first and calls it for the others (`_defined_names` in `codegen/wrapper.py`; TorchInductor's
#   `src_to_kernel`). Finding them equal by their code still means generating every copy: BART's
#   training step generated about 500 kernels on the H200 host for 42 distinct ones, 1.7 s of its
#   compile. The scheduler already runs each body once with a recording ops handler, to learn its
#   loads and stores; recording every op as well, its results numbered and the buffers it reads
#   and writes listed apart (`scheduler.BodyRecorder`), gives each kernel a key before any code
#   exists (`FusedGroup.structure`): the loops, each body's ops and indices, which buffer plays
#   which role, their dtypes. A group whose key was seen calls that kernel with its own buffers,
#   and codegen took 0.5 s. The key must hold everything the code depends on, or a layer would run
#   another layer's kernel: `config.check_kernel_reuse`, on in the test suite, generates every
#   reused kernel anyway and raises unless the code is the same. And Triton launches a kernel
#   through a small C module it builds with gcc
#   for each new signature, about 0.2 s each in an empty cache; torch ships a launcher built
#   once with torch that takes the argument types as a string, which tininductor uses where it
#   can (`StaticKernel` in `runtime/static_kernel.py`). Together they took this step's cold
#   compile from about 0.6 to 0.55 of torch.compile's.
# * **Let the garbage collector wait.** A compile makes about a million Python objects (FX
#   nodes, fake tensors, sympy expressions). CPython's collector walks *every* live object in a
#   full (generation-2) collection, and its default thresholds start one each time enough new
#   objects survive: a dozen times during one large compile, each walk longer than the last.
#   BART's training compile spent 2.2 of its 9.5 s on the CPU there. While a frame compiles,
#   tinydynamo raises generation 2's threshold (`utils.deferred_full_collections`, as
#   TorchDynamo does); young objects are still collected, and the full walk happens once,
#   after, at some allocation of the compiled function's first call: on the CPU, 0.66 s inside
#   BART's first training step. `gc.callbacks` is how to see it: each callback gets the
#   generation and can time it, and `chromium_event_log` records every full collection as a
#   span, so `bench/first_call.py`'s timeline shows where one lands.
# * **Trace each op once, and leanly.** A large model's first call is mostly per-op front-end
#   work: BART's training graph (24 layers) has 2,239 forward prims and 4,425 backward ops.
#   The joint graph does not need the forward run again under a tracer, since `decompose` traced
#   it already: its nodes are copied, and only the backward walk is recorded (chapter 6). `make_fx`
#   spends most of its time per op on proxies: pytree flattening, proxy slots, a snapshot of each
#   fake output, a `TensorMetadata`. With static shapes none of that is needed. A dispatch mode
#   that runs each op on the fake tensors and appends one node, finding the node's arguments by the
#   identity of the tensors passed in, does the same work at about a third of the cost
#   (`tininductor/op_recorder.py`). `make_fx` stays for symbolic sizes, whose expressions it
#   keeps in the graph. On the 2-core CPU, BART's training compile with `make_fx` for both traces
#   and the forward traced twice took 16.6 s: `decompose` 2.0 s, `joint_graph` 4.9 s. With the
#   recorder and the copied forward it took 11.0 s: 0.85 s and 1.7 s. On the H200 host its first
#   call took 10.6 to 14 s in three runs (the recorder traced only the joint graph in the first),
#   against 19.2 to 27.4 s for torch.compile in the same runs.
#
# The step is host-bound (the GPU is busy for about 2 ms of a 9 ms step, 330 kernels), so the
# compilers' wall times are close; the stored run has both dtypes, the first call's seconds
# and a cold compile in a fresh process:

# %%
if stored.exists() and "rows" in gpu["results"].get("gpt_train", {}):
    for r in gpu["results"]["gpt_train"]["rows"]:
        if "tiny ms" in r:
            print(f"{r['dtype']:<9} eager {r['eager ms']:.2f} ms, torch.compile {r['torch.compile ms']:.2f} ms, "
                  f"tiny {r['tiny ms']:.2f} ms ({r['tiny vs torch.compile']:.2f}x torch.compile); first call "
                  f"torch.compile {r['torch.compile first call s']:.1f} s, tiny {r['tiny first call s']:.1f} s")
        elif "tiny cold s" in r:
            print(f"cold compile (fresh process, empty caches): torch.compile {r['torch.compile cold s']:.1f} s, "
                  f"tiny {r['tiny cold s']:.1f} s ({r['tiny / torch.compile cold']:.2f})")

# %% [markdown]
# ### Public models: the dashboard
#
# The seeds' table (PyTorch's A100 figures: BERT inference 2.30x eager, ResNet-50 training 1.43x)
# comes from real models, not from one block. `bench/dashboard.py` runs torchvision, timm and
# transformers models at their published sizes through eager, torch.compile and tiny in one
# process, checks accuracy first and then times them, in the manner of PyTorch's compile
# dashboard. Its stored H200 run (bf16 inference, 26 models):

# %%
dash_file = Path("data/dashboard_h200.json")
if dash_file.exists():
    dash = json.loads(dash_file.read_text())
    print(f"device: {dash['device']}   date: {dash['date']}   torch {dash['torch']}")
    benchmark.print_table(dash["rows"], ["model", "eager ms", "torch.compile speedup", "tiny speedup",
                                         "tiny vs torch.compile", "torch.compile first call s", "tiny first call s"])
    benchmark.print_table(dash["summary"], list(dash["summary"][0]), title="geomean over models")
else:
    print("no stored dashboard run in notebooks/data/dashboard_h200.json")

# %% [markdown]
# Three more stored runs of the same models: a training step (forward, loss, backward), the
# inference call with CUDA graphs on both sides (`--mode reduce-overhead`, where a replay takes the
# wrapper's Python out of the picture), and the host time of one cached call at batch 1
# (`bench/call_overhead.py --model`: kernels nearly free, so what is left is guards, the wrapper and
# the launches). A row is a compiled run only if tiny did not fall back to torch for a frame: a
# kernel that fails to compile makes tininductor warn and run that frame eagerly, and the dashboard
# records such a fallback in the row (`tiny fallbacks`) and names the model in its summary, so an
# eager time is never read as a compiled one. The inference and training runs record none:

# %%
for name, columns in (("dashboard_h200_training.json", ["model", "eager ms", "torch.compile speedup",
                                                        "tiny speedup", "tiny vs torch.compile",
                                                        "torch.compile first call s", "tiny first call s"]),
                      ("dashboard_h200_reduce_overhead.json", ["model", "eager ms", "torch.compile speedup",
                                                               "tiny speedup", "tiny vs torch.compile"]),
                      ("call_overhead_h200_models.json", ["model", "torch.compile us/call", "tiny us/call",
                                                          "tiny vs torch.compile", "tiny guards us"])):
    path = Path("data") / name
    if not path.exists():
        print(f"no stored run in notebooks/data/{name}")
        continue
    run = json.loads(path.read_text())
    benchmark.print_table(run["rows"], columns, title=f"{name} ({run['device']}, torch {run['torch']})")
    if "summary" in run:
        benchmark.print_table(run["summary"], list(run["summary"][0]), title="geomean over models")
    else:
        print(f"geomean tiny vs torch.compile: {run['geomean tiny vs torch.compile']:.2f}x")

# %% [markdown]
# ### One compile for every block of the same form
#
# transformers' LayerDrop draws `torch.rand([])` before every layer in training and skips the layer
# when the draw is below `layerdrop`. With `layerdrop = 0` (BART's and OPT's configs here) that
# branch is decided before the data exists: a uniform draw lies in [0, 1], and no value there is
# below 0. tinydynamo keeps that range on the draw (`element_range` in `variables/tensor.py`, the
# tensor counterpart of the value ranges torch keeps for symbolic sizes), so the `if` costs no graph
# break and the model is one graph; torch.compile breaks there. On the H200 that makes BART's training
# step 1.51x torch.compile's speed in the run above (1.33x with a graph per layer), at the price of a
# longer first call: one graph of every layer is traced and lowered as a whole.
#
# With `layerdrop > 0` the branch is real, and each layer reaches the backend as a graph of its own,
# pinned to its block. After AOT autograd lifts the parameters to inputs, those graphs are the same.
# tininductor's graph cache (`tininductor/graph_cache.py`) therefore compiles the form once, and each
# block binds its own parameters to that compile. Below is a stack of that shape, first with
# `layerdrop = 0`, then with 0.1 and the cache off and on (the training graphs count their joint
# graph, the expensive part the cache skips):

# %%
from tininductor import graph_cache  # noqa: E402


class LayerDropStack(torch.nn.Module):
    """Six blocks behind a LayerDrop draw, as in transformers' BART and OPT."""

    def __init__(self, layerdrop: float):
        super().__init__()
        self.layerdrop = layerdrop
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)) for _ in range(6))

    def forward(self, x):
        for layer in self.layers:
            if torch.rand([]) < self.layerdrop:  # skip this layer
                continue
            x = x + layer(x)
        return x


torch.manual_seed(0)
x = torch.randn(32, 64)
tinydynamo.reset()
print("layerdrop 0:  ", tinydynamo.explain(LayerDropStack(0.0))(x).graph_count, "graph")
stack = LayerDropStack(0.1)
torch.manual_seed(1)
expected = stack(x)
for cache_on in (False, True):
    tinydynamo.reset()  # also empties the graph cache
    with tininductor.config.patch({"graph_cache": cache_on}):
        reset_compile_times()
        torch.manual_seed(1)  # the same draws as eager's: the same layers skipped
        out = tinydynamo.compile(copy.deepcopy(stack), backend="tininductor")(x)
    phases = compile_times(repr="dict")
    print(f"layerdrop 0.1, graph cache {'on ' if cache_on else 'off'}: {phases['backend_compile'][0]} graphs reach "
          f"the backend, {phases['joint_graph'][0]} joint graphs traced and compiled, "
          f"{graph_cache.cache.stats['hit']} compiles reused; matches eager: {torch.allclose(out, expected, atol=1e-5)}")

# %% [markdown]
# Three graph-level passes decide most of the GPU time on these models, and each is a module of
# tininductor you can switch off to see its effect (`bench/model_passes.py`):
#
# * **batch norm decomposed** (`decompose_batch_norm`) into a reduction and pointwise ops, so it
#   fuses with the ReLU and the residual add; ResNet-50 goes from 338 kernels to 131;
# * **channels-last layouts** for convolution graphs (`layout_optimization`), decided once per
#   graph, so cuDNN stops converting NCHW to NHWC and back around every convolution (on the CPU,
#   oneDNN's convolutions run channels-last too: MobileNetV2 at a small size goes from 0.72x to
#   1.22x torch.compile's speed with it);
# * **padded matmul operands** (`shape_padding`, `fx_passes/pad_mm.py`): GPT-2's LM head multiplies
#   by a 768 x 50257 weight, and an odd width sends the library to a slow kernel; padding it to a
#   multiple of 8 took that matmul from 3.36 to 0.45 ms.
#
# A pass can also lose. Batch norm in *training* decomposes only with
# `decompose_batch_norm_training` (off). Its statistics become per-sample reductions combined over
# the batch, so that 64 channels of 400,000 values fill the GPU (chapter 8's split reductions); its
# gradient is ATen's formula, decomposed after AD; its running statistics leave the graph as outputs,
# written back after the call in one batched copy. On an H200 training step it saves 20-35% of the
# GPU's time and still loses to ATen's batch-norm kernels: it adds 200-250 kernel launches, and at
# these sizes the step waits on the host's launches, not on the GPU (ResNeXt-50 0.93x
# torch.compile's speed against 1.14x, DenseNet-121 0.82x against 1.01x). A pass ships when the
# dashboard says it helps.
#
# With them tiny's GPU time per call equals torch.compile's on ResNet-50 (1.70 vs 1.71 ms). At
# these sizes most calls are bound by the host, not the GPU (MobileNetV2 at batch 16: about 0.6 ms
# of kernels in a 2.5-4 ms call): every cached call checks guards over hundreds of parameters and
# runs a Python wrapper over hundreds of kernels. So the host decides the ratios, and a busy host
# moves them; the dashboard times the three backends in turns, round after round, so that the
# noise falls on all of them alike. The guard check of the parameters is one call of torch's C++
# tensor check, as in TorchDynamo; an object that many modules hold (a Hugging Face config) is
# guarded once (chapter 3); each kernel launch is one generated Python function around
# torch's prebuilt launcher; `mode="reduce-overhead"` replays the kernels as a CUDA graph and takes
# the wrapper out of the picture.

# %% [markdown]
# ## 6. What to take away
#
# * Compilers win by moving fewer bytes and launching fewer kernels; the yardstick is the
#   ideal traffic of the graph against the machine's measured bandwidth.
# * They lose on tiny inputs (fixed per-call costs), on graph breaks (each piece pays those
#   costs again, and fusion stops at the break), and on recompiles (compile time is paid
#   again). `tinydynamo.explain`, `TINY_LOGS=graph_breaks,recompiles` and the counters in
#   `tinydynamo.testing` tell you which one you are paying.
# * Everything here has a counterpart in PyTorch: `torch/_dynamo` (symbolic_convert.py,
#   guards.py, eval_frame.py, output_graph.py), `torch/_functorch/aot_autograd.py`,
#   `torch/_inductor` (lowering.py, ir.py, scheduler.py, codegen/triton.py, codegen/cpp.py,
#   codecache.py). You now know what to look for when you open them.
