"""Benchmark: data-parallel training steps on N processes, eager vs torch.compile vs tiny, under DDP and FSDP2.

Each mode builds the same model (same seed), wraps it (``DistributedDataParallel``, or ``fully_shard``
on each block and the root), compiles it or not, and runs ``--steps`` SGD steps on per-rank data;
the losses must equal eager's (per wrapper) within the dtype's tolerance. Step time: the median of
the steps after ``--warmup`` (the first step compiles). Modes:

    ddp_eager, ddp_compile (torch.compile), ddp_tiny (tinydynamo + tininductor, DDP optimizer on),
    ddp_tiny_nosplit (the DDP optimizer off), fsdp_eager, fsdp_compile, fsdp_tiny,
    local_eager, local_compile, local_tiny (no wrapper, no communication: not run by default)

``--profile`` records a torch.profiler trace of a few steps of ``ddp_eager``, ``ddp_compile``,
``ddp_tiny`` and ``ddp_tiny_nosplit`` and reports the share of all-reduce time that runs while
backward compute runs (GPU: NCCL kernels against the other kernels; CPU: gloo's all-reduce against
autograd's backward functions). ``--out DIR`` (implies ``--profile``) writes everything there: the
JSON, rank 0's chrome traces (``traces/<mode>.json.gz``, open in ui.perfetto.dev) and
``overlap.txt``, a table of every all-reduce kernel of one profiled step with the compute time it
overlaps, split on and off.

GPUs (NCCL; one process per GPU): GPT-2 6 x 768 from transformers (else the course's GPT), bf16,
8 x 512 tokens per GPU, 20 steps::

    python bench/distributed.py --out $OUT/distributed
CPU smoke test (gloo, 2 processes, a tiny model)::

    python bench/distributed.py --device cpu --world 2
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from course import benchmark as harness

DDP_MODES = ("ddp_eager", "ddp_compile", "ddp_tiny", "ddp_tiny_nosplit")
PROFILED = DDP_MODES  # --profile: the DDP modes, whose all-reduces should overlap the backward
PROFILE_STEPS = 2
FSDP_MODES = ("fsdp_eager", "fsdp_compile", "fsdp_tiny")
#: the model unwrapped, no communication (each rank trains alone): what the compilers do with the model
#: itself, so that a gap under DDP can be told apart from a gap in the model's own graphs
LOCAL_MODES = ("local_eager", "local_compile", "local_tiny")
COMM = ("nccl", "allreduce", "all_reduce", "reducescatter", "reduce_scatter", "allgather", "all_gather")


def build_model(args, device: str, dtype: torch.dtype):
    """GPT-2 from transformers (random weights) if installed, else the course's GPT; blocks listed for FSDP."""
    torch.manual_seed(0)
    try:
        if args.local_model:
            raise ImportError
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads, vocab_size=args.vocab,
                         n_positions=max(args.seq, 64), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         use_cache=False)  # training: no key-value cache to build
        model = GPT2LMHeadModel(cfg)
        blocks, name = list(model.transformer.h), f"transformers GPT2LMHeadModel {args.layers}x{args.embd}"

        def logits_of(m, idx):
            return m(input_ids=idx).logits
    except ImportError:
        from course.models import GPT

        model = GPT(args.vocab, args.seq, args.layers, args.heads, args.embd)
        blocks, name = list(model.blocks), f"course GPT {args.layers}x{args.embd}"

        def logits_of(m, idx):
            return m(idx)
    return model.to(device=device, dtype=dtype), blocks, logits_of, name


def wrap(mode: str, model, blocks, device: str, args):
    """The wrapped model and the callable a step runs."""
    if mode.startswith("local"):
        wrapped = model
    elif mode.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [torch.device(device).index] if device.startswith("cuda") else None
        wrapped = DDP(model, device_ids=ids, bucket_cap_mb=args.bucket_cap_mb)
    else:
        from torch.distributed.fsdp import fully_shard

        for block in blocks:
            fully_shard(block)
        wrapped = fully_shard(model)
    if mode.endswith("_compile"):
        return wrapped, torch.compile(wrapped)
    if "_tiny" in mode:
        import tinydynamo

        return wrapped, tinydynamo.compile(wrapped, backend=args.tiny_backend)
    return wrapped, wrapped


def batches(args, rank: int, device: str):
    g = torch.Generator().manual_seed(1000 + rank)
    idx = torch.randint(0, args.vocab, (args.steps + 8, args.batch, args.seq + 1), generator=g).to(device)
    return [(b[:, :-1], b[:, 1:]) for b in idx]


def run_mode(mode: str, args, rank: int, device: str, dtype) -> dict:
    import tinydynamo
    from tinydynamo import artifacts, config

    torch._dynamo.reset()
    tinydynamo.reset()
    model, blocks, logits_of, name = build_model(args, device, dtype)
    wrapped, step_fn = wrap(mode, model, blocks, device, args)
    kept = list(artifacts.history)  # the DDP optimizer's splits made by this mode are the new ones
    before = {id(a) for a in kept}
    opt = torch.optim.SGD(wrapped.parameters(), lr=args.lr)
    data = batches(args, rank, device)
    losses, times = [], []
    with config.patch(optimize_ddp=not mode.endswith("nosplit")), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(args.steps):
            idx, tgt = data[i]
            harness.synchronize(device)
            t0 = time.perf_counter()
            logits = logits_of(step_fn, idx)
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tgt.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            harness.synchronize(device)
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        profile = measure_overlap(args, mode, step_fn, logits_of, opt, data, device, rank) \
            if args.profile and mode in PROFILED else None
    steady = times[args.warmup:] or times[-1:]
    splits = [str(v) for a in artifacts.history if id(a) not in before for _, v in a.get("ddp_split")]
    pieces = [int(re.search(r"(\d+) piece", text).group(1)) for text in splits] if "_tiny" in mode else None
    return {"mode": mode, "model": name, "step_ms": 1e3 * statistics.median(steady), "first_step_s": times[0],
            "losses": losses, "pieces": pieces, "overlap": profile,
            "warnings": [str(w.message)[:200] for w in caught if "tinydynamo" in str(w.message)]}


def _intervals(events, comm: bool, device: str, names: bool = False):
    out = []
    for e in events:
        name = e.name.lower()
        is_comm = any(c in name for c in COMM)
        if device.startswith("cuda"):
            if e.device_type != torch.autograd.DeviceType.CUDA or is_comm != comm:
                continue
        elif comm != is_comm or (not comm and "backward" not in name):
            continue
        elif not comm and not name.startswith("autograd::engine::evaluate_function"):
            continue
        out.append((e.time_range.start, e.time_range.end, e.name) if names else (e.time_range.start, e.time_range.end))
    return out


def _union(intervals):
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _overlapped(start, end, busy) -> float:
    """How long ``[start, end]`` overlaps the merged intervals ``busy``."""
    return sum(max(0, min(end, be) - max(start, bs)) for bs, be in busy)


def overlap_share(comm, compute) -> float:
    """The share of communication time during which compute runs too."""
    busy = _union(compute)
    total = sum(e - s for s, e in _union(comm))
    inter = sum(_overlapped(s, e, busy) for s, e in _union(comm))
    return inter / total if total else 0.0


def comm_table(comm, compute, steps: int) -> list[dict]:
    """Each communication kernel of the last profiled step: start (ms after that step's first
    communication), duration and the part of it overlapped by compute. The step boundary: the
    profiled communication kernels split into ``steps`` equal runs (each step launches the same ones)."""
    busy = _union(compute)
    kernels = sorted(comm)  # (start, end, name)
    per_step = len(kernels) // max(steps, 1)
    last = kernels[-per_step:] if per_step else []
    t0 = last[0][0] if last else 0
    return [{"start_ms": (s - t0) / 1e3, "ms": (e - s) / 1e3, "overlapped_ms": _overlapped(s, e, busy) / 1e3,
             "name": name[:60]} for s, e, name in last]


def measure_overlap(args, mode, step_fn, logits_of, opt, data, device, rank) -> dict:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        for idx, tgt in data[args.steps:args.steps + PROFILE_STEPS]:
            logits = logits_of(step_fn, idx)
            F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tgt.reshape(-1)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        harness.synchronize(device)
    events = prof.events()
    comm, compute = _intervals(events, True, device), _intervals(events, False, device)
    trace = None
    if rank == 0 and args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
        trace = os.path.join(args.trace_dir, f"{mode}.json.gz")  # gzipped by the profiler (.gz)
        prof.export_chrome_trace(trace)
    return {"comm_events": len(comm), "comm_ms": sum(e - s for s, e in _union(comm)) / 1e3 / PROFILE_STEPS,
            "overlap_share": overlap_share(comm, compute), "trace": trace,
            "kernels": comm_table(_intervals(events, True, device, names=True), compute, PROFILE_STEPS)}


def worker(rank: int, world: int, port: int, args, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    cuda = args.device.startswith("cuda")
    device = f"cuda:{rank}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    if args.bucket_cap_mb is not None:  # DDP's (and torch.compile's) first bucket is at most bucket_cap_mb
        dist._DEFAULT_FIRST_BUCKET_BYTES = min(dist._DEFAULT_FIRST_BUCKET_BYTES, int(args.bucket_cap_mb * 2**20))
    dtype = getattr(torch, args.dtype)
    rows = []
    try:
        for mode in args.modes.split(","):
            try:
                rows.append(run_mode(mode, args, rank, device, dtype))
            except Exception as e:  # noqa: BLE001 - one mode failing must not lose the others' figures
                rows.append({"mode": mode, "error": f"{type(e).__name__}: {e}"[:500]})
            if rank == 0:
                print(f"[rank 0] {mode}: {rows[-1].get('step_ms', rows[-1].get('error'))}", flush=True)
                with open(out, "w") as f:  # after every mode: a run cut short keeps what it measured
                    json.dump(rows, f)
                if args.out:
                    with open(os.path.join(args.out, "overlap.txt"), "w") as f:
                        f.write(overlap_report(rows, args))
    finally:
        dist.destroy_process_group()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gpu = torch.cuda.is_available()
    parser.add_argument("--device", default="cuda" if gpu else "cpu")
    parser.add_argument("--world", type=int, default=torch.cuda.device_count() if gpu else 2)
    parser.add_argument("--modes", default=",".join(DDP_MODES + FSDP_MODES))
    parser.add_argument("--layers", type=int, default=6 if gpu else 2)
    parser.add_argument("--embd", type=int, default=768 if gpu else 64)
    parser.add_argument("--heads", type=int, default=12 if gpu else 2)
    parser.add_argument("--vocab", type=int, default=50257 if gpu else 512)
    parser.add_argument("--batch", type=int, default=8 if gpu else 2)
    parser.add_argument("--seq", type=int, default=512 if gpu else 32)
    parser.add_argument("--dtype", default="bfloat16" if gpu else "float32")
    parser.add_argument("--steps", type=int, default=20 if gpu else 6)
    parser.add_argument("--warmup", type=int, default=5 if gpu else 2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP's bucket_cap_mb (default: DDP's, 25)")
    parser.add_argument("--tiny-backend", default="tininductor")
    parser.add_argument("--local-model", action="store_true", help="the course's GPT even if transformers is there")
    parser.add_argument("--profile", action="store_true", help="measure all-reduce / backward overlap")
    parser.add_argument("--trace-dir", default=None, help="--profile: write rank 0's chrome traces here")
    parser.add_argument("--json", default=None)
    parser.add_argument("--out", default=None, help="a folder for the JSON, the traces and overlap.txt (implies --profile)")
    args = parser.parse_args(argv)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        args.profile = True
        args.json = args.json or os.path.join(args.out, "distributed.json")
        args.trace_dir = args.trace_dir or os.path.join(args.out, "traces")
    if args.bucket_cap_mb is None and not gpu:
        args.bucket_cap_mb = 0.05  # a few buckets for the tiny CPU model
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.json + ".partial" if args.json else os.path.join(tmp, "rows.json")
        mp.spawn(worker, args=(args.world, port, args, out), nprocs=args.world)
        rows = json.load(open(out))
    report(rows, args)
    if args.json:
        os.remove(out)  # the partial rows are in the saved JSON now
    if args.out:  # written by rank 0 after each mode too
        print(overlap_report(rows, args))


def overlap_report(rows: list[dict], args) -> str:
    """The profiled modes' all-reduce kernels (rank 0, one step) and the compute each overlaps."""
    kind = "NCCL kernels vs other CUDA kernels" if args.device.startswith("cuda") else "gloo all-reduce vs backward functions"
    lines = [f"All-reduce / backward overlap ({kind}), rank 0, {PROFILE_STEPS} profiled steps"]
    for r in rows:
        ov = r.get("overlap")
        if not ov:
            continue
        lines.append(f"\n{r['mode']}: {r.get('step_ms', 0):.2f} ms/step, pieces {r.get('pieces')}, "
                     f"{ov['comm_ms']:.2f} ms of communication per step, {ov['overlap_share']:.0%} of it overlapped")
        lines.append(f"  {'#':>3} {'start ms':>9} {'ms':>8} {'overlapped ms':>14}  kernel")
        for i, k in enumerate(ov.get("kernels", [])):
            lines.append(f"  {i:>3} {k['start_ms']:>9.3f} {k['ms']:>8.3f} {k['overlapped_ms']:>14.3f}  {k.get('name', '')}")
    return "\n".join(lines) + "\n"


def report(rows: list[dict], args) -> None:
    tol = 5e-2 if args.dtype in ("bfloat16", "float16") else 1e-4
    base, compiled = {}, {}
    for r in rows:
        if "error" in r:
            continue
        family = r["mode"].split("_")[0]
        base.setdefault(family, r) if r["mode"].endswith("_eager") else None
        compiled.setdefault(family, r) if r["mode"].endswith("_compile") else None
    for r in rows:
        if "error" in r:
            continue
        family = r["mode"].split("_")[0]
        if family in compiled:  # > 1: faster than torch.compile's step
            r["speedup_vs_compile"] = compiled[family]["step_ms"] / r["step_ms"]
        ref = base.get(family)
        if ref is None:
            continue
        r["max_loss_diff"] = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"]))
        r["losses_match"] = r["max_loss_diff"] <= tol * max(1.0, abs(ref["losses"][0]))
        r["speedup_vs_eager"] = ref["step_ms"] / r["step_ms"]
        if r.get("overlap"):
            r["overlap_share"] = r["overlap"]["overlap_share"]
    harness.print_table(rows, ["mode", "step_ms", "speedup_vs_eager", "speedup_vs_compile", "first_step_s", "max_loss_diff",
                               "losses_match", "overlap_share", "pieces", "error"],
                        f"{args.world} x {harness.describe_device(args.device)}: {rows[0].get('model', '')}, "
                        f"{args.dtype}, {args.batch} x {args.seq} tokens per rank, {args.steps} steps")
    meta = {"world": args.world, "dtype": args.dtype, "batch": args.batch, "seq": args.seq, "steps": args.steps,
            "bucket_cap_mb": args.bucket_cap_mb}
    harness.save("distributed", args.device, rows, meta, path=args.json and __import__("pathlib").Path(args.json))


if __name__ == "__main__":
    main()
