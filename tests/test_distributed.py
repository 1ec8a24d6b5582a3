"""DDP and FSDP2 through tinydynamo, on two processes, compared with eager step by step.

One spawn of two processes runs every case (starting torch twice is most of the time); each rank
sees different data, so parameters equal to eager DDP's on both ranks prove that the gradients were
all-reduced. Cases: a small transformer (DDP with the DDP optimizer's split on and off, FSDP2 with
``fully_shard`` on each of 12 blocks of one class: more blocks than ``config.recompile_limit``) and
a small convnet (DDP, split on). The backend counts the graphs it compiles, so a silently eager run
fails.

Every test runs twice: on the CPU with gloo (in CI), and with NCCL on two GPUs, one process per
GPU (skipped unless two CUDA devices are present): ``pytest -x -q tests/test_distributed.py -k nccl``.
"""
from __future__ import annotations

import copy
import json
import multiprocessing
import os
import socket
import time
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

import tinydynamo
from tininductor.aot_autograd import aot_eager
from tinydynamo import convert_frame
from tinydynamo.distributed import DDPOptimizer
from tinydynamo.exc import EagerFallbackWarning

WORLD = 2
STEPS = 3
TIMEOUT_S = 300
FSDP_BLOCKS = 12  # more blocks of one class than config.recompile_limit (8)

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")


def _skip_reason(backend: str) -> str | None:
    """Why the run on ``backend`` cannot happen here, else None."""
    if backend == "nccl":
        if not dist.is_nccl_available():
            return "torch.distributed has no NCCL in this build"
        if torch.cuda.device_count() < WORLD:
            return f"NCCL needs {WORLD} CUDA devices, found {torch.cuda.device_count()}"
    return None


class Block(nn.Module):
    """A pre-norm transformer block (attention + MLP)."""

    def __init__(self, d: int = 32, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(layers)])
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        h = self.emb(idx)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.features(x))


def _batches(kind: str, rank: int, device: str):
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for _ in range(STEPS):
        if kind == "transformer":
            idx = torch.randint(0, 64, (2, 8), generator=g)
            yield idx.to(device), torch.randint(0, 64, (2, 8), generator=g).to(device)
        else:
            yield torch.randn(2, 3, 8, 8, generator=g).to(device), torch.randint(0, 10, (2,), generator=g).to(device)


def _loss(out, target):
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def _run_case(case: str, rank: int, device: str) -> dict:
    from torch.distributed.fsdp import fully_shard  # only where torch.distributed is built (skipped otherwise)
    from torch.nn.parallel import DistributedDataParallel as DDP

    tinydynamo.reset()
    kind = "convnet" if case.startswith("convnet") else "transformer"
    torch.manual_seed(0)
    # FSDP2: many blocks (each compiled on its own); DDP: one block is enough for several buckets
    model = ConvNet() if kind == "convnet" else Transformer(layers=FSDP_BLOCKS if case.endswith("fsdp2") else 1)
    model = model.to(device)
    graphs: list = []
    splits: list = []
    def backend(gm, example_inputs):  # counts what is compiled: a silently eager run has no graphs
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    if case.endswith("fsdp2"):
        ref, tiny = model, copy.deepcopy(model)
        for m in (ref, tiny):
            for block in m.blocks:
                fully_shard(block)
            fully_shard(m)
    else:
        cap_mb = 0.002 if kind == "convnet" else 0.02  # a few buckets for these small models
        ids = [torch.device(device).index] if device.startswith("cuda") else None
        ref, tiny = (DDP(m, bucket_cap_mb=cap_mb, device_ids=ids) for m in (model, copy.deepcopy(model)))
    compiled = tinydynamo.compile(tiny, backend=backend)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt_tiny = torch.optim.SGD(tiny.parameters(), lr=0.05)
    losses = []
    start = time.perf_counter()
    orig_call = DDPOptimizer.__call__

    def recording_call(self, gm, example_inputs):
        out = orig_call(self, gm, example_inputs)
        splits.append(len(self.buckets))
        return out

    DDPOptimizer.__call__ = recording_call
    try:
        with tinydynamo.config.patch(optimize_ddp=not case.endswith("nosplit")), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for x, y in _batches(kind, rank, device):
                loss_ref = _loss(ref(x), y)
                loss_ref.backward()
                opt_ref.step()
                opt_ref.zero_grad()
                loss_tiny = _loss(compiled(x), y)
                loss_tiny.backward()
                opt_tiny.step()
                opt_tiny.zero_grad()
                losses.append((loss_ref.item(), loss_tiny.item()))
    finally:
        DDPOptimizer.__call__ = orig_call

    def full(p):
        return p.full_tensor() if hasattr(p, "full_tensor") else p.detach()

    seconds = time.perf_counter() - start
    diff = max((full(a) - full(b)).abs().max().item() for a, b in zip(ref.parameters(), tiny.parameters()))
    return {"losses": losses, "param_diff": diff, "graphs": len(graphs), "splits": splits, "seconds": seconds,
            "unsupported": dict(convert_frame.counters["unsupported"]), "device": device,
            "frames": dict(convert_frame.counters["frames"]), "recompiles": dict(convert_frame.counters["recompiles"]),
            "warnings": [str(w.message) for w in caught if "tinydynamo" in str(w.message)]}


CASES = ("transformer_ddp", "transformer_ddp_nosplit", "convnet_ddp", "transformer_fsdp2")


def _worker(rank: int, port: int, out_dir: str, backend: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast (not available on every host)
    torch.set_num_threads(1)
    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{rank}"
        torch.cuda.set_device(rank)
        # float32 convolutions and matmuls in full precision: eager and compiled agree to float32 rounding
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group(backend, rank=rank, world_size=WORLD)
    try:
        results = {case: _run_case(case, rank, device) for case in CASES}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(out, backend: str) -> list:
    """Run the workers once; their exit codes (None: still running after TIMEOUT_S, killed)."""
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, port, str(out), backend)) for rank in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT_S)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    return codes


@pytest.fixture(scope="module", params=["gloo", "nccl"])
def results(request, tmp_path_factory):
    backend = request.param
    reason = _skip_reason(backend)
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp(backend)
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env_path) if p)
    codes = _spawn(out, backend)
    if codes != [0] * WORLD:  # once more: the free port may have been taken before the group bound it
        codes = _spawn(out, backend)
    assert codes == [0] * WORLD, f"the {WORLD}-process {backend} run failed: exit codes {codes} (None: timed out)"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("case", CASES)
def test_matches_eager_every_step(results, case):
    for rank, res in enumerate(results):
        r = res[case]
        tol = 1e-5 if r["device"] == "cpu" else 1e-4  # GPU kernels may order reductions differently
        for step, (ref, tiny) in enumerate(r["losses"]):
            assert tiny == pytest.approx(ref, rel=tol, abs=1e-6), f"rank {rank} step {step}: {tiny} vs eager {ref}"
        assert r["param_diff"] < tol, f"rank {rank}: parameters differ from eager's by {r['param_diff']}"
        assert r["graphs"] > 0 and not r["warnings"], f"rank {rank}: nothing compiled / warned: {r}"


def test_ddp_graph_is_split_at_buckets(results):
    r = results[0]["transformer_ddp"]
    assert r["splits"] and r["splits"][0] >= 3, r  # 0.02 MiB buckets over ~65 KiB of parameters
    assert r["graphs"] == sum(r["splits"])  # each piece compiled by the backend, nothing else
    assert not r["unsupported"], r["unsupported"]
    assert results[0]["convnet_ddp"]["splits"][0] >= 2
    print({case: round(results[0][case]["seconds"], 1) for case in CASES})


def test_ddp_split_off_compiles_one_graph(results):
    r = results[0]["transformer_ddp_nosplit"]
    assert r["splits"] == [] and r["graphs"] == 1, r


def test_fsdp2_compiles_each_block(results):
    r = results[0]["transformer_fsdp2"]
    # the blocks' forward (pinned to the first block, then one entry for every block of the class:
    # tinydynamo.config.unspecialize_replaced_modules) and the code around them
    assert 2 <= r["graphs"] < FSDP_BLOCKS, r
    assert all("FSDP" in k for k in r["unsupported"]) or not r["unsupported"], r
    # one entry per block, none of them a recompile: no block runs eagerly at the recompile limit
    assert not r["recompiles"] and not any("limit" in k for k in r["frames"]), r


# ---- in this process (a process group of one): what explain() and the warnings say ----------------
@pytest.fixture
def group_of_one():
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_explain_reports_the_ddp_split(group_of_one):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    out = tinydynamo.explain(DDP(model, bucket_cap_mb=0.003))(torch.randn(2, 8))
    assert len(out.ddp_splits) == 1 and "2 piece(s)" in out.ddp_splits[0], out.ddp_splits
    assert out.graph_count == 2  # the pieces, each handed to the backend
    with tinydynamo.config.patch(optimize_ddp=False):
        out = tinydynamo.explain(DDP(model, bucket_cap_mb=0.003))(torch.randn(2, 8))
    assert out.graph_count == 1 and not out.ddp_splits


class _Uncapturable(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        try:  # a graph break inside try cannot be resumed: the frame runs eagerly
            y = self.fc(x)
            print(end="")
        finally:
            pass
        return y


def test_a_wrapped_module_that_runs_eagerly_warns(group_of_one):
    from torch.nn.parallel import DistributedDataParallel as DDP

    tinydynamo.reset()
    compiled = tinydynamo.compile(DDP(_Uncapturable()), backend="eager")
    with pytest.warns(EagerFallbackWarning, match="_Uncapturable.forward .*wrapped by DistributedDataParallel.* runs eagerly"):
        compiled(torch.randn(2, 4))


def test_assign_buckets_as_ddp():
    from tinydynamo.distributed import assign_buckets

    # gradient order; the first bucket closes at 100 bytes, the others at 300
    assert assign_buckets([60, 60, 100, 100, 100, 50], 300, 100) == [[0, 1], [2, 3, 4], [5]]
    assert assign_buckets([10, 1000, 10], 100, 100) == [[0, 1], [2]]
