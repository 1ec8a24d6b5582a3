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
# # Chapter 3 — Guards and the cache: reusing a graph safely
#
# The graph from chapter 2 was traced for *particular* inputs. It baked in the shapes (the `view`
# sizes are literal ints), the dtypes, the value of every Python constant it read (a global
# `SCALE`, an `int` argument, `self.training`), which submodules a module had, and whether grad
# mode was on. Calling it on inputs that break one of those assumptions would be silently wrong.
#
# TorchDynamo therefore stores each graph with its **guards**: cheap checks of exactly those
# assumptions, run before every call. All guards pass: run the cached graph. One fails: trace
# again (a **recompile**), and say which guard failed, in words.

# %%
import logging
import timeit
import warnings

import torch

import tinydynamo
from course import load
from tinydynamo.testing import CompileCounter

ch = load("ch03", unfinished="package")
_ = torch.manual_seed(0)

SCALE = 2.0


def f(x, n: int):
    return torch.sin(x) * SCALE + n


tinydynamo.reset()
cnt = CompileCounter()
fc = tinydynamo.optimize(cnt)(f)
x = torch.randn(4, 3)
print("matches eager:", torch.allclose(fc(x, 1), f(x, 1)))

# %% [markdown]
# ## 1. Reading the guards
#
# Each guard has a **kind**, a **source** — an expression over `L` (the frame's locals) and `G`
# (its globals) that says where the value came from — and the value it expects.

# %%
entry = tinydynamo.cache_info(fc).entries[0]
for guard in entry.check_fn.guards:
    print(guard)

# %% [markdown]
# They are compiled into **one** generated Python function: each source is read once into a
# local, and each guard is one `if not (...): return False`. A cache hit costs a few attribute
# reads and comparisons.

# %%
print(entry.check_fn.code)

# %% [markdown]
# The graph itself is not re-run by anything else: the cache entry also holds a small generated
# function that fetches the graph's inputs from the same sources and rebuilds the return value:

# %%
print(entry.code)

# %% [markdown]
# ### How PyTorch really does it
#
# TorchDynamo (`torch/_dynamo/guards.py`) records the same kinds of guards for the same function:
# `torch._dynamo.explain` compiles `f` once and returns them. Each has a source (`L['n']`,
# `G['SCALE']`), a kind (the function that created it) and, for the readable ones, Python code:

# %%
import re

import torch._dynamo

torch._dynamo.reset()
report = torch._dynamo.explain(f)(x, 1)
for guard in sorted(report.out_guards, key=lambda g: (g.name, g.create_fn_name())):
    code = re.sub(r"\d{8,}", "<id>", "; ".join(guard.code_list or []))  # object ids differ per run
    print(f"{guard.create_fn_name():28} {guard.name or '(global)':16} {code[:80]}")

# %% [markdown]
# Ours has `CONSTANT_MATCH` on `L['n']` and `G['SCALE']` and `TENSOR_MATCH` on `L['x']` too.
# What the real one adds:
#
# - **A C++ guard tree.** The guards are not one generated Python function but a tree of
#   `GuardManager`s (`torch._C._dynamo.guards`), one node per source, run in C++; TENSOR_MATCH
#   (dispatch keys, dtype, device, sizes, strides, requires_grad) has no Python code at all,
#   which is why its code list above only checks that no `mark_dynamic` attribute appeared.
# - **Global state**: grad mode, deterministic algorithms, the default device, torch-function
#   modes, saved-tensor hooks: each a guard with no source, like our GRAD_MODE.
# - **Identity guards** (`MODULE_MATCH`, `BUILTIN_MATCH`, `ID_MATCH`) on every global the code
#   touched, here `torch` and `torch.sin`: rebinding `torch.sin` must recompile.
# - **SHAPE_ENV**: the relations between symbolic sizes (chapter 10), empty here since all sizes
#   are static.

# %% [markdown]
# ## 2. Watch a recompile happen
#
# `TINY_LOGS=recompiles` (or `tinydynamo.set_logs(recompiles=True)` in a notebook) logs every
# recompile with the failing guard of each cache entry.

# %%
tinydynamo.set_logs(recompiles=True)
logging.getLogger("tinydynamo.recompiles").handlers[0].setStream(__import__("sys").stdout)

fc(torch.randn(4, 3), 1)  # same metadata, new values: a cache hit
print("frames so far:", cnt.frame_count)
fc(torch.randn(5, 3), 1)  # a new shape
fc(x.double(), 1)  # a new dtype
SCALE = 3.0  # a global constant the graph read
fc(x, 1)
print("frames so far:", cnt.frame_count)
tinydynamo.set_logs(recompiles=False)

# %% [markdown]
# Notice what did **not** recompile: new tensor *values*. Notice too that after `SCALE = 3.0`
# the old entries fail on `G['SCALE']` — without that guard, `fc` would have kept multiplying
# by 2.0. After `config.recompile_limit` entries (8, like TorchDynamo's), tinydynamo stops
# recompiling that function and runs it eagerly, with one warning:

# %%
tinydynamo.reset()
fc = tinydynamo.optimize(CompileCounter())(f)
with tinydynamo.config.patch(recompile_limit=3), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for n in range(6):
        assert torch.allclose(fc(x, n), f(x, n))
print(len(caught), "warning:", str(caught[0].message).split(";")[1].strip())

# %% [markdown]
# ## 3. Your guard kind: CONSTANT_MATCH
#
# Exercise 3.1 writes the conditions of CONSTANT_MATCH. Careful: `True == 1` and `1 == 1.0`, so
# a guard that only compares values would reuse an `int` graph for a `bool` argument.
# `use_guard_kind` plugs your version into tinydynamo for a block.

# %%
from tinydynamo.guards import CheckFunction, Guard, TensorMeta, use_check_codegen, use_guard_kind  # noqa: E402
from tinydynamo.source import LocalSource, SourceScope  # noqa: E402

guard = Guard("CONSTANT_MATCH", LocalSource("n"), 2)
print(ch.constant_match_code(guard, "___v0", SourceScope({})))
with use_guard_kind("CONSTANT_MATCH", code=ch.constant_match_code):
    tinydynamo.reset()
    cnt = CompileCounter()
    fc = tinydynamo.optimize(cnt)(f)
    for n in (2, 2, True, 2.0):
        fc(x, n)
print("frames for n = 2, 2, True, 2.0:", cnt.frame_count)

# %% [markdown]
# ## 4. Your failure reason: TENSOR_MATCH in words
#
# The fast check only says *no*. On a miss, a second, slow path asks each guard *why*. Exercise
# 3.2 writes that for tensors.

# %%
tg = Guard("TENSOR_MATCH", LocalSource("x"), TensorMeta.of(x))
for value in (torch.randn(4, 3), torch.randn(4, 7), x.t(), x.clone().requires_grad_(), 1.5):
    print(ch.tensor_match_failure(tg, value))

# %% [markdown]
# ## 5. Your check-function generator and cache lookup
#
# Exercise 3.3 generates the single check function from the guards; exercise 3.4 is the cache
# lookup itself: the first (newest) entry for this backend whose guards pass.

# %%
from tinydynamo.eval_frame import use_cache_lookup  # noqa: E402

scope = SourceScope({})
print(ch.generate_check_code([Guard("GRAD_MODE", None, True), tg, guard], scope))
with use_check_codegen(ch.generate_check_code), use_cache_lookup(ch.lookup_entry):
    tinydynamo.reset()
    cnt = CompileCounter()
    fc = tinydynamo.optimize(cnt)(f)
    a, b = torch.randn(2), torch.randn(3)
    results = [torch.allclose(fc(t, 1), f(t, 1)) for t in (a, b, a, b, a)]
print(results, "| frames:", cnt.frame_count, "| entries:", len(tinydynamo.cache_info(fc).entries))

# %% [markdown]
# ## 6. Guards on a module
#
# For an `nn.Module`, the parameters are graph inputs fetched through sources like
# `L['self'].fc1.weight` (each with TENSOR_MATCH); submodules are guarded by identity (NN_MODULE);
# plain attributes such as `self.training` by value. So `model.eval()` recompiles (dropout leaves
# the graph), and replacing `model.fc1` does too, while an optimizer step — new values in the same
# parameters — does not. Identity is where a frame starts: when a miss finds another module of the
# same class at the same source (a second block, a copy made for every call), that source is
# guarded by its type from then on, and one entry serves every such module
# (`config.unspecialize_replaced_modules`, TorchDynamo's `inline_inbuilt_nn_modules`).

# %%
from course.models import TinyBlock  # noqa: E402

block = TinyBlock(16, 2)
tinydynamo.reset()
cnt = CompileCounter()
cb = tinydynamo.compile(block, backend=cnt)
xb = torch.randn(2, 16)
cb(xb)
with torch.no_grad():
    block.fc1.weight.add_(0.1)  # new values, same parameter: a cache hit
print("after an in-place update: frames =", cnt.frame_count, "| matches:", torch.allclose(cb(xb), block(xb)))
block.fc1 = torch.nn.Linear(16, 32)
print("after replacing fc1: matches:", torch.allclose(cb(xb), block(xb)), "| frames =", cnt.frame_count)
print("reason:", tinydynamo.cache_info(cb).last_reason)

# %% [markdown]
# A guard has two spellings of its source. `source.name()` is what people read and what
# failure reasons print: `L['self'].fc1.weight`. `source.code()` is what the generated check
# function evaluates, and for a module member it reads the module's own dicts:
# `._modules['fc1']`, then `._parameters['weight']`. `nn.Module` stores members there, and
# `block.fc1` reaches them through a Python `__getattr__`. That costs about half a microsecond
# per read, on every call, for every parameter (`tinydynamo/source.py`, `ModuleMemberSource`).
# The check goes one step further: because `nn.Module` defines `__getattr__`, CPython cannot
# specialise *any* attribute read on a module, so each module's instance `__dict__` is read once
# and everything else comes out of it by subscript, its tables (`['_modules']['fc1']`) and its
# plain attributes (`['training']`, `InstanceAttrSource`): a dict subscript costs about a third of
# such an attribute read, and a ViT's check reads over a thousand of them.
# Your `generate_check_code` from Exercise 3.3 uses `name()`, which is just as correct:

# %%
check_code = [line.strip() for line in tinydynamo.cache_info(cb).entries[0].check_fn.code.splitlines()]
reads = dict(line.split(" = ", 1) for line in check_code if line.startswith("___v") and " = " in line)
fc1 = next(local for local, expr in reads.items() if expr.endswith("['fc1']"))  # its local
def read_from(expr):  # the local a read starts from: "___v2['_modules']" -> "___v2"
    return expr.split("[")[0].split(".")[0]


below = {fc1}  # fc1's local, and every read made through it
for local, expr in reads.items():
    if read_from(expr) in below:
        below.add(local)
above, local = set(), fc1  # the reads on the way to it
while (local := read_from(reads[local])) in reads:
    above.add(local)
print("\n".join(f"{local} = {expr}" for local, expr in reads.items() if local in above | below))

# %% [markdown]
# ## 7. What a guard check costs
#
# `bench/guard_overhead.py` measures it properly (4 tensors, against `torch.compile` in the same
# run). Here, roughly:

# %% tags=["nbval-ignore-output"]
def four(a, b, c, d):
    return a + b * c - d


tinydynamo.reset()
g4 = tinydynamo.optimize("eager")(four)
xs = [torch.randn(8, 8) for _ in range(4)]
g4(*xs)
check = tinydynamo.cache_info(g4).entries[0].check_fn
L = dict(zip("abcd", xs))
n = 20000
print(f"guard check: {min(timeit.repeat(lambda: check(L, four.__globals__), number=n, repeat=3)) / n * 1e6:.2f} us per call")

# %% [markdown]
# A big model's check is long because a module tree is wide, and because one object is often
# reached by many paths: every attention layer of a Hugging Face model holds the model's one
# config, and reads `config._attn_implementation` through it. Guarded path by path, the same
# attribute of the same object is checked once per layer (and a config's attribute read runs
# Python: its class defines `__getattribute__`). The check function guards such an object once,
# through the first path that reached it, and every other path with one identity check
# (`ALIAS_MATCH: second is first`): if they are still the same object, what was read through one
# holds for the other (`guards.share_aliased_objects`; `config.share_aliased_guards=False` turns
# it off):

# %%
class Config:
    scale = 2.0


class Layer(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config, self.fc = config, torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) * self.config.scale


shared = Config()
stack = torch.nn.Sequential(*[Layer(shared) for _ in range(6)])
for share in (False, True):
    tinydynamo.reset()
    with tinydynamo.config.patch(share_aliased_guards=share):
        cs = tinydynamo.optimize("eager")(stack)
        cs(torch.randn(2, 4))
    guards = tinydynamo.cache_info(cs).entries[0].check_fn.guards
    print(f"share_aliased_guards={share}: {sum(g.name.endswith('config.scale') for g in guards)} guard(s) on "
          f"config.scale, {sum(g.kind == 'ALIAS_MATCH' for g in guards)} identity checks")

# %% [markdown]
# **What you built.** Guards turn "this graph was traced for these inputs" into code that checks
# it in microseconds; the cache keeps several graphs per function and says why it needed each new
# one. Next (chapter 4): what to do when tracing cannot continue — graph breaks.
