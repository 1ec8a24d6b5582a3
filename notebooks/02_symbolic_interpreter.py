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
# # Chapter 2 — The symbolic interpreter: from bytecode to an FX graph
#
# TorchDynamo does not trace your function by *running* it. It reads the function's **bytecode**
# and executes it *symbolically*: instead of real values, its stack holds **VariableTrackers**
# ("this is a tensor of shape [4, 5], produced by graph node `add`", "this is the constant 3",
# "this is a list of two tensors"). Every tensor operation it meets becomes a node in a
# `torch.fx.Graph`; everything else — constants, Python lists, loops over `range`, calls of your
# own helper functions — is simply carried out at trace time and leaves no trace in the graph.
#
# In this chapter we build that interpreter in small steps, then plug your own opcode handlers
# into the real one in `tinydynamo`, and finish by capturing a whole GPT in a single graph.

# %%
import operator

import torch
import torch.fx
import torch.nn.functional as F

import tinydynamo
from course import load
from tinydynamo import bytecode as bc

ch = load("ch02", unfinished="package")
_ = torch.manual_seed(0)

# %% [markdown]
# ## 1. The instructions we interpret
#
# CPython's bytecode changes with every version (3.11, 3.12 and 3.13 all differ in how calls,
# jumps and comparisons are encoded). `tinydynamo.bytecode.get_instructions` hides that: it
# gives *normalised* instructions, with `argval` always the meaningful value (a name, a constant,
# an operator symbol) and `target` the index of a jump's destination. (The listing below is from
# whatever Python runs this notebook; on another version a few lines differ.)

# %% tags=["nbval-ignore-output"]
def f(x, y):
    return torch.add(torch.relu(x), torch.mul(y, 2))


print(bc.format_instructions(f))

# %% [markdown]
# ## 2. A toy symbolic interpreter, opcode by opcode
#
# Two kinds of values are enough for `f`: a `TensorVar` (an FX node plus an *example value* that
# carries shape and dtype — a tensor on the `meta` device, which has metadata but no data) and a
# `ConstVar` (a Python value known now). The interpreter walks the instructions with a stack.

# %%
class TensorVar:
    def __init__(self, node, example):
        self.node, self.example = node, example

    def __repr__(self):
        return f"TensorVar({self.node.name}, {list(self.example.shape)})"


class ConstVar:
    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"ConstVar({self.value!r})"


NULL = ConstVar("<NULL>")  # what CPython pushes in one of CALL's two "call slots"
HANDLERS = {}  # opname -> handler(interp, inst): the registry we fill below


class ToyInterpreter:
    def __init__(self, fn, example_args):
        self.fn, self.graph, self.stack, self.locals = fn, torch.fx.Graph(), [], {}
        for name, value in zip(fn.__code__.co_varnames, example_args):
            node = self.graph.placeholder(name)
            self.locals[name] = TensorVar(node, torch.empty_like(value, device="meta"))
        self.instructions, self.ip, self.result = bc.get_instructions(fn), 0, None

    def run(self):
        while self.result is None:
            inst = self.instructions[self.ip]
            self.ip += 1
            if inst.opname not in HANDLERS:
                raise NotImplementedError(f"no handler for {inst.opname} (instruction #{inst.index})")
            HANDLERS[inst.opname](self, inst)
        self.graph.output(self.result.node)
        return torch.fx.GraphModule(torch.nn.Module(), self.graph)

    def call_tensor_op(self, fn, args):
        """Add ``fn(*args)`` to the graph; run it on the meta examples to learn the result's shape."""
        node = self.graph.call_function(fn, tuple(a.node if isinstance(a, TensorVar) else a.value for a in args))
        example = fn(*[a.example if isinstance(a, TensorVar) else a.value for a in args])
        return TensorVar(node, example)


x, y = torch.randn(4, 5), torch.randn(4, 5)


def try_run():
    try:
        gm = ToyInterpreter(f, (x, y)).run()
        print("captured!")
        return gm
    except NotImplementedError as e:
        print("stopped:", e)


try_run()

# %% [markdown]
# The first real instruction loads the global `torch`. Globals and attributes of modules are just
# Python values we can look up now: they become constants. A `LOAD_GLOBAL` with `push_null`
# also pushes the NULL call slot — `bc.with_null` puts it on the correct side for this version.

# %%
def LOAD_GLOBAL(interp, inst):
    value = ConstVar(interp.fn.__globals__[inst.argval])
    interp.stack.extend(bc.with_null(value, NULL) if inst.push_null else [value])


def LOAD_ATTR(interp, inst):
    obj = interp.stack.pop()
    value = ConstVar(getattr(obj.value, inst.argval))
    interp.stack.extend(bc.with_null(value, NULL) if inst.push_null else [value])


HANDLERS.update(RESUME=lambda interp, inst: None, LOAD_GLOBAL=LOAD_GLOBAL, LOAD_ATTR=LOAD_ATTR)
try_run()

# %%
HANDLERS["LOAD_FAST"] = lambda interp, inst: interp.stack.append(interp.locals[inst.argval])
HANDLERS["LOAD_CONST"] = lambda interp, inst: interp.stack.append(ConstVar(inst.argval))
try_run()

# %% [markdown]
# `CALL n`: below the `n` arguments sit the two call slots. Whatever the version, one rule reads
# them (`bc.resolve_call_slots`): if one slot is NULL the callable is the other; otherwise it is a
# method call and the second slot is `self`. A call of a torch function on tensors becomes a node.

# %%
def CALL(interp, inst):
    args = [interp.stack.pop() for _ in range(inst.argval)][::-1]
    slot1, slot0 = interp.stack.pop(), interp.stack.pop()
    fn, lead = bc.resolve_call_slots(slot0, slot1, lambda v: v is NULL)
    interp.stack.append(interp.call_tensor_op(fn.value, lead + args))


HANDLERS["CALL"] = CALL
try_run()

# %%
def RETURN_VALUE(interp, inst):
    interp.result = interp.stack.pop()


HANDLERS.update(RETURN_VALUE=RETURN_VALUE)
gm = try_run()
print(gm.code)

# %%
print("same as eager:", torch.equal(gm(x, y), f(x, y)))

# %% [markdown]
# That is the whole idea. The real translator (`tinydynamo.symbolic_convert`) is the same loop
# with ~70 handlers and a family of VariableTrackers (`tinydynamo.variables`): tensors whose
# example values are *fake tensors* (they also keep the real device), constants, tuples, lists,
# dicts, `torch.Size`, user functions (inlined: a nested translator runs their bytecode),
# closures, `nn.Module`s (forward inlined, parameters lifted to graph inputs), torch functions,
# builtins. Constants fold; loops over constants unroll; jumps on constants pick one side.
#
# Two questions this toy never met, and the first two exercises ask:
#
# * **Operators** (`BINARY_OP`, Exercise 2.1). `f` called `torch.add`; most code writes `a + b`,
#   `2 ** 3`, `x -= 1`. Which operand is which on the stack? What should `2 ** 3` put in the graph
#   when both values are known now? And `x -= 1` on the caller's tensor: in eager the caller sees
#   its tensor change; must the graph say so?
# * **Jumps** (`POP_JUMP_IF_FALSE`/`TRUE`, Exercise 2.2). An interpreter that runs the code *now*,
#   on stand-ins, must decide every `if` now. On `if flag:` with a Python `flag` it can: the
#   compiled graph then holds one side only. What makes that graph safe to reuse on the next
#   call, when `flag` may differ? And `if x.sum() > 0:` on a tensor: the stand-in has a shape
#   but no values, so what can a jump do with it? (The end of section 3 shows what tinydynamo does;
#   chapter 3 is about the first answer, chapter 4 about the second.)
#
# ## 3. Your handlers inside the real translator
#
# The exercises in `exercises/ch02_symbolic_interpreter.py` are four handlers of the real
# translator: `BINARY_OP`, `POP_JUMP_IF_FALSE`/`POP_JUMP_IF_TRUE`, `CALL` and `FOR_ITER`.
# `use_handlers` plugs them in for a block; `CompileCounter` is a backend that counts frames and
# ops (like `torch._dynamo.testing.CompileCounter`).

# %%
from tinydynamo.symbolic_convert import use_handlers  # noqa: E402
from tinydynamo.testing import CompileCounter  # noqa: E402


def g(x, n: int, scale: float):
    for i in range(n):  # unrolled: n is a constant (and guarded)
        if i % 2 == 0:  # folded: i is a constant
            x = x * scale
        else:
            x = F.gelu(x) - i
    return x


with use_handlers(**ch.HANDLERS):
    tinydynamo.reset()
    cnt = CompileCounter()
    gc = tinydynamo.optimize(cnt, nopython=True)(g)
    out = gc(x, 3, 0.5)
print("matches eager:", torch.allclose(out, g(x, 3, 0.5)), "| frames:", cnt.frame_count, "| ops:", cnt.op_count)
print(cnt.graphs[0].code)

# %% [markdown]
# A jump on a *tensor's value* cannot be decided at trace time. With `nopython=True`
# (`fullgraph=True`) tinydynamo stops with a precise reason, the user's source line and a hint;
# without it, tinydynamo splits the function there — a *graph break*, the subject of chapter 4.

# %%
def h(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


try:
    tinydynamo.optimize("eager", nopython=True)(h)(x)
except tinydynamo.Unsupported as e:
    print(e)

# %% [markdown]
# ### How PyTorch really does it
#
# TorchDynamo's translator is `torch/_dynamo/symbolic_convert.py`: `InstructionTranslatorBase`
# has one method per opcode (`LOAD_FAST`, `BINARY_OP`, `POP_JUMP_IF_FALSE` via `generic_jump`,
# ...), a `stack` of VariableTrackers and `symbolic_locals`, as here. The trackers live in
# `torch/_dynamo/variables/` (`TensorVariable`, `ConstantVariable`, `BuiltinVariable`,
# `UserFunctionVariable`, `NNModuleVariable`, ...), and the graph in `OutputGraph`
# (`output_graph.py`) through a `SubgraphTracer`. What the real one does that the toy does not:
# every tensor carries a *fake* example value (`wrap_fx_proxy`, `get_fake_value`), so shapes and
# dtypes are known while tracing; a call to a Python function is inlined by an
# `InliningInstructionTranslator`; each value read from outside the frame records where it came
# from (a `Source`) and installs the guards chapter 3 checks; mutations of lists, dicts and
# attributes are deferred and replayed (`SideEffects`, chapter 4); and an instruction it cannot
# handle becomes a graph break instead of an error (`break_graph_if_unsupported`, chapter 4).

# %% [markdown]
# ## 4. The package: whole models in one graph
#
# `tinydynamo.compile` mirrors `torch.compile`. The seeds' LayerNorm-MLP block: its `forward`
# is inlined, `nn.LayerNorm` and `nn.Linear` are inlined too (down to `F.layer_norm` and
# `F.linear`), and the parameters become graph inputs named by where they came from.

# %%
from course.models import GPT, TinyBlock  # noqa: E402

block = TinyBlock(hidden=32, expansion=4)
tinydynamo.reset()
cnt = CompileCounter()
cblock = tinydynamo.compile(block, backend=cnt, fullgraph=True)
xb = torch.randn(2, 8, 32)
print("matches eager:", torch.allclose(cblock(xb), block(xb), atol=1e-6), "| frames:", cnt.frame_count, "| ops:", cnt.op_count)
print([n.meta["source"] for n in cnt.graphs[0].graph.nodes if n.op == "placeholder"])

# %% tags=["nbval-ignore-output"]
print(cnt.graphs[0].code)

# %% [markdown]
# The graph, drawn with graphviz (as SVG when the `dot` program is installed; otherwise we show
# the DOT text, which any graphviz viewer renders).

# %% tags=["nbval-ignore-output"]
from tinydynamo import viz  # noqa: E402

if viz.can_render():
    display(viz.draw(cnt.graphs[0]))  # noqa: F821 (Jupyter's display)
else:
    print(viz.to_dot(cnt.graphs[0]))

# %% [markdown]
# And a GPT-style transformer with its cross-entropy loss: embeddings, causal self-attention
# (`view`, `transpose`, `masked_fill` with a registered mask buffer, `softmax`), GELU MLPs,
# LayerNorms, the LM head — one frame, one graph.

# %%
gpt = GPT(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32).eval()
tinydynamo.reset()
cnt = CompileCounter()
cgpt = tinydynamo.compile(gpt, backend=cnt, fullgraph=True)
idx, targets = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
(logits, loss), (ref_logits, ref_loss) = cgpt(idx, targets), gpt(idx, targets)
print("logits match:", torch.allclose(logits, ref_logits, atol=1e-5), "| loss matches:", torch.allclose(loss, ref_loss))
print("frames:", cnt.frame_count, "| ops:", cnt.op_count, "| graph inputs:",
      sum(n.op == "placeholder" for n in cnt.graphs[0].graph.nodes))
ops = sorted({getattr(n.target, "__name__", n.target) for n in cnt.graphs[0].graph.nodes if n.op.startswith("call")})
print(ops)

# %% [markdown]
# **What you built.** A symbolic interpreter turns bytecode into an FX graph: tensors become
# nodes, Python becomes trace-time computation. The graph is only valid for the inputs it was
# traced with — shapes, dtypes, the constant `n` above, `self.training`... Chapter 3 makes those
# assumptions explicit as **guards**, and caches graphs safely.
