# %% [markdown]
# # Chapter 12 — Distributed training: DDP, FSDP and where a compiled graph must end
#
# When a model trains on several GPUs, each GPU runs the same compiled step on its own slice
# of the batch, and the processes talk through collectives (`torch.distributed`'s all-reduce,
# all-gather, reduce-scatter). The compiler does not do the talking, but it decides *when* the
# talking can start: a gradient can only be sent once the backward has produced it, and a
# compiled backward produces its gradients when it ends.
#
# **What you will learn**
#
# * what `DistributedDataParallel` (DDP) does with gradients (buckets, all-reduce during the
#   backward) and what FSDP2 (`fully_shard`) does with parameters (shards, all-gather before a
#   block, reduce-scatter after);
# * how `tinydynamo.compile` handles both: the wrappers run natively, the model inside compiles;
# * why one compiled backward would kill DDP's overlap of communication with computation, and how
#   TorchDynamo's **DDP optimizer** splits the graph at DDP's bucket boundaries (Exercises 12.1
#   and 12.2);
# * what the split buys, first on a timeline (Exercise 12.3), then measured on two GPUs.
#
# Everything here runs in one CPU process (a process group of size 1 with the gloo backend):
# the code paths are the real ones, only the communication is trivial. The multi-process runs
# live in `tests/test_distributed.py` (2 CPU processes) and `bench/distributed.py` (N GPUs).

# %%
import json
import socket
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import tinydynamo
from course import load
from course.models import GPT

ch = load("ch12", unfinished="package")
torch.manual_seed(0)

if not dist.is_initialized():  # one process, gloo: DDP and FSDP run their real code paths
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
print("world size:", dist.get_world_size(), "| backend:", dist.get_backend())

# %% [markdown]
# ## 1. What DDP does with gradients
#
# Every rank holds a full copy of the model and computes gradients on its own data. Before the
# optimizer step, each gradient must become the **average over all ranks** (an all-reduce), so
# every copy takes the same step. Waiting for the whole backward and then all-reducing would
# leave the network idle during the backward and the GPU idle during the all-reduce. DDP
# overlaps them:
#
# * at construction, its *reducer* groups the parameters into **buckets** of about
#   `bucket_cap_mb` (25 MiB by default; the first bucket only 1 MiB, to start early), in the
#   order backward produces their gradients: the *reverse* of the model's order;
# * it puts a hook on every parameter's `AccumulateGrad` node: when the last gradient of a bucket
#   arrives, that bucket's all-reduce starts (asynchronously) while backward goes on.
#
# `tinydynamo.compile(DDP(model))` does what TorchDynamo does: DDP's own `forward` (bucket
# bookkeeping, buffer broadcast) runs natively, and the module it wraps is compiled as a frame of
# its own. The compiled backward hands the parameters' gradients to autograd, whose
# `AccumulateGrad` nodes fire DDP's hooks as in eager.

# %%
model = GPT(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
ddp = DDP(model, bucket_cap_mb=0.01)
compiled = tinydynamo.compile(ddp, backend="aot_eager")
idx = torch.randint(0, 64, (2, 16))
loss = compiled(idx).square().mean()
loss.backward()
ref = DDP(GPT(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32), bucket_cap_mb=0.01)
ref.module.load_state_dict(model.state_dict())
ref(idx).square().mean().backward()
worst = max((a.grad - b.grad).abs().max().item() for a, b in zip(model.parameters(), ref.module.parameters()))
print(f"loss {loss.item():.4f}; every gradient equals eager DDP's (within 1e-6): {worst < 1e-6}")

# %% [markdown]
# ## 2. DDP's buckets (Exercise 12.1)
#
# Write `ddp_buckets(params, bucket_cap, first_bucket_cap)`: `params` are `(name, nbytes)` in the
# model's order; return the buckets (lists of names) in the order DDP all-reduces them. Walk the
# parameters in gradient order (reversed); add each to the open bucket; once a bucket holds `cap`
# bytes or more, close it. The first bucket's cap is `first_bucket_cap`.

# %%
params = [(name, p.numel() * p.element_size()) for name, p in model.named_parameters()]
buckets = ch.ddp_buckets(params, bucket_cap=10_000, first_bucket_cap=2_000)
for i, bucket in enumerate(buckets):
    size = sum(n for name, n in params if name in bucket)
    print(f"bucket {i} ({size:>6} bytes): {', '.join(bucket)}")

# %% [markdown]
# The lm_head's weight (the last layer) is in bucket 0: its gradient is produced first, so it is
# all-reduced first. The small first bucket gets the network busy early.
#
# ## 3. Why the compiled backward must be split, and where (Exercise 12.2)
#
# A compiled training graph is one `autograd.Function`: its backward runs as *one* node and
# returns every gradient when it ends. Under DDP that means every bucket becomes ready at the
# same moment, at the end of the backward: no overlap at all. TorchDynamo's DDP optimizer
# therefore splits each graph captured inside a DDP forward into pieces that end at bucket
# boundaries; each piece is compiled on its own, with its own backward. When the backward of
# the last piece ends, its bucket's all-reduce starts while the backward of the piece before it
# runs.
#
# How the split is chosen: walk the graph's nodes backwards (the order in which backward
# produces gradients) and fill pieces with parameter bytes, as DDP fills buckets; a parameter
# belongs to the piece of its *first* use (a tied weight, like GPT-2's embedding reused by the
# output layer, has its gradient complete only when the backward of its first use ends). A
# preamble without parameters joins the piece after it. Write `split_points(gm, param_bytes,
# bucket_cap, first_bucket_cap)`: the piece of every op node.

# %%
graphs = []


def capture(gm, example_inputs):
    graphs.append((gm, example_inputs))
    return gm.forward


tinydynamo.compile(model, backend=capture, fullgraph=True)(idx)
gm, example_inputs = graphs[0]
placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
param_bytes = {n.name: x.numel() * x.element_size() for n, x in zip(placeholders, example_inputs)
               if isinstance(x, nn.Parameter)}
pieces = ch.split_points(gm, param_bytes, bucket_cap=10_000, first_bucket_cap=2_000)
for piece in sorted(set(pieces.values())):
    print(f"piece {piece}:", " ".join(name for name, p in pieces.items() if p == piece))

# %% [markdown]
# tinydynamo does this split by itself for every graph captured inside a DDP forward
# (`tinydynamo.distributed.DDPOptimizer`, switched off by `tinydynamo.config.optimize_ddp =
# False`, as `torch._dynamo.config.optimize_ddp`). `explain()` reports the pieces (its `graphs`
# are then the pieces, each handed to the backend), and `show()` has a `ddp_split` artefact:

# %%
explanation = tinydynamo.explain(DDP(model, bucket_cap_mb=0.01))(idx)
print("graphs handed to the backend:", explanation.graph_count)
print(explanation.ddp_splits[0].split("class GraphModule")[0])

# %% [markdown]
# ## 4. What the split buys: a timeline (Exercise 12.3)
#
# A model of one step's backward: pieces run their backward from the last to the first; the
# all-reduces share one channel, so they run one at a time, each as soon as its gradients are
# ready *and* the channel is free. Write `step_time(backward_ms, allreduce_ms, split)`: when the
# backward and every all-reduce are done. Without the split every gradient is ready only at the
# end of the whole backward.

# %%
backward_ms = [3.0, 2.0, 2.0, 2.0, 2.0, 1.0]  # six pieces, forward order (the embedding piece is heavier)
allreduce_ms = [1.5, 1.0, 1.0, 1.0, 1.0, 0.3]
for split in (False, True):
    print(f"split={split!s:<5}: step's backward + communication = {ch.step_time(backward_ms, allreduce_ms, split):.1f} ms")
print(f"compute alone: {sum(backward_ms):.1f} ms, communication alone: {sum(allreduce_ms):.1f} ms")

# %% [markdown]
# With the split, only the last bucket's all-reduce (the first layers' gradients) sticks out after
# the backward; without it, all of the communication does. The smaller the pieces, the more
# overlap, but each piece is a separate compiled graph: fewer fusion opportunities across the
# boundary and more per-call overhead. DDP's bucket size is the compromise DDP already made.
#
# ## 5. FSDP2: parameters are sharded, blocks are compiled one by one
#
# FSDP goes further than DDP: each rank keeps only a **shard** (1/N) of every parameter, of its
# gradient and of the optimizer state. Before a block's forward, a pre-hook **all-gathers** the
# block's parameters; after it, a post-hook frees them again; in the backward, they are
# gathered again, and the gradients are **reduce-scattered** (summed across ranks, each rank
# keeping its shard). `fully_shard(block)` installs those hooks; the parameters become `DTensor`s
# sharded on dim 0.
#
# tinydynamo does not trace FSDP's hooks (as `torch._dynamo.config.skip_fsdp_hooks`): calling a
# block under `fully_shard` is a graph break; the hooks and their collectives run natively around
# the block's compiled `forward`, and the code between the blocks is compiled as resume functions.
# Every block runs the same code object, `Block.forward`, and its guards pin `self` to one block:
# each block gets its own cache entry. As in TorchDynamo, `config.recompile_limit` (8) counts only
# the entries pinned to the same module, so a model of 12 or 48 blocks compiles each block once
# instead of running the ninth and later blocks eagerly.

# %%
fsdp_model = GPT(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
fsdp_model.load_state_dict(model.state_dict())
for block in fsdp_model.blocks:
    fully_shard(block)
fully_shard(fsdp_model)
weight = fsdp_model.blocks[0].mlp.fc.weight
print(type(weight).__name__, weight.placements, "local shard:", tuple(weight.to_local().shape),
      "of", tuple(weight.shape), f"(1/{dist.get_world_size()} per rank)")
explanation = tinydynamo.explain(fsdp_model)(idx)
print("graphs:", explanation.graph_count, "| graph breaks:", explanation.graph_break_count)
print("first break:", explanation.break_reasons[0].reason)
compiled_fsdp = tinydynamo.compile(fsdp_model, backend="aot_eager")
with warnings.catch_warnings():  # FSDP notes that the logits are a view (F.linear on 3-d input): harmless here
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    print("loss equals eager:", torch.allclose(compiled_fsdp(idx).square().mean(), fsdp_model(idx).square().mean()))

# %% [markdown]
# ## 6. Measured on two GPUs
#
# `bench/distributed.py` trains GPT-2 (6 layers x 768, from transformers, random weights, bf16,
# 8 x 512 tokens per GPU, 20 SGD steps) on 2 GPUs with NCCL: eager DDP, `torch.compile` DDP,
# tinydynamo DDP with the split on and off, and the same under FSDP2. The losses of every mode
# equal eager's; `--profile` records a trace of a few steps and measures how much of the
# all-reduce time runs while other kernels (the backward) run. The stored run:

# %%
run = json.loads(Path("data/distributed_h200x2.json").read_text())
print(f"{run['world']} x {run['device']}, torch {run['torch']}, {run['dtype']}, {run['batch']} x {run['seq']} tokens per GPU")
eager = {r["mode"].split("_")[0]: r["step_ms"] for r in run["rows"] if r["mode"].endswith("eager")}
print(f"{'mode':<18}{'ms/step':>9}{'vs eager':>10}{'all-reduce overlapped':>23}")
for r in run["rows"]:
    overlap = r.get("overlap") or {}
    share = f"{overlap['overlap_share']:.0%}" if overlap else "-"
    print(f"{r['mode']:<18}{r['step_ms']:>9.1f}{eager[r['mode'].split('_')[0]] / r['step_ms']:>9.2f}x{share:>23}")

# %% [markdown]
# With the split, 77% of the all-reduce time is hidden behind the backward (eager DDP: 71%);
# without it, 46% (GPT-2's forward is captured in a few frames because of graph breaks inside
# transformers, so even unsplit there are several backward nodes), and the step is 6% slower.
# tinydynamo's step is faster than eager DDP's here but well behind `torch.compile`'s: the
# distributed side overlaps as it should; the gap is in the kernels and the graph breaks
# (chapter 11's measurements), not in the communication. Under FSDP2, compiling per block saves
# little: the all-gathers and reduce-scatters between blocks dominate this model's step.
