"""The full OpInfo sweep: every op of torch's ``op_db`` through tinydynamo, compared with eager.

    python scripts/opinfo_sweep.py                              # aot_eager and tininductor (C++)
    python scripts/opinfo_sweep.py --backends tininductor_triton --samples 1
    python scripts/opinfo_sweep.py --shard 0/4 --json out0.json # a quarter of the ops
    python scripts/opinfo_sweep.py --merge out0.json out1.json  # counts of several shards
    python scripts/opinfo_sweep.py --ops add,sort,topk          # a few ops, one line per sample
    python scripts/opinfo_sweep.py --device cuda --shard 0/8    # on a GPU (real Triton kernels)
    python scripts/opinfo_sweep.py --dynamic --backends tininductor   # dynamic=True: every size a symbol

Prints per backend: ops tried, passed, fell back (reasons grouped), WRONG and ERROR (both
must be 0), and skipped (reasons grouped). With ``--dynamic`` a graph compiled per concrete shape
(not symbolically) counts as a fallback, "per shape: <reason>". See tests/opinfo_harness.py for what is compared.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cuda"]:
    os.environ["TINY_OPINFO_DEVICE"] = "cuda"  # read by the harness at import: samples on the GPU, real Triton
else:
    os.environ.setdefault("TRITON_INTERPRET", "1")


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def sweep(names, backends, samples, timeout, verbose, dynamic=False) -> list[dict]:
    import opinfo_harness as h

    rows = []
    signal.signal(signal.SIGALRM, _alarm)
    for n, name in enumerate(names):
        for backend in backends:
            start = time.time()
            signal.alarm(timeout)
            try:
                results = h.run_op(name, backend, samples, dynamic=dynamic)
            except _Timeout:
                results = [h.Result(name, -1, "error", f"timeout after {timeout}s")]
            except Exception as e:  # noqa: BLE001  a harness problem: show it, keep going
                results = [h.Result(name, -1, "error", f"harness: {type(e).__name__}: {e}"[:200])]
            finally:
                signal.alarm(0)
            for r in results:
                rows.append(dict(backend=backend, op=r.op, sample=r.sample, status=r.status,
                                 reason=r.reason, notes=r.notes))
                if verbose or r.status in ("wrong", "error"):
                    print(f"[{n + 1}/{len(names)} {backend} {time.time() - start:.1f}s] {r.op} #{r.sample}: "
                          f"{r.status} {r.reason}", flush=True)
                    if r.status == "error" and r.notes:  # the whole message (a Triton CompilationError's source line)
                        print("    " + str(r.notes[0]).replace("\n", "\n    "), flush=True)
    return rows


def report(rows: list[dict]) -> int:
    bad = 0
    for backend in dict.fromkeys(r["backend"] for r in rows):
        mine = [r for r in rows if r["backend"] == backend]
        order = {"wrong": 5, "error": 4, "fallback": 3, "pass": 2, "skip": 1}
        per_op: dict = {}
        for r in mine:
            if order[r["status"]] > order.get(per_op.get(r["op"]), 0):
                per_op[r["op"]] = r["status"]
        counts = collections.Counter(per_op.values())
        tried = len(per_op) - counts["skip"]
        print(f"\n== {backend}: {len(per_op)} OpInfo entries, {tried} tried "
              f"({sum(1 for r in mine if r['status'] != 'skip')} samples): "
              f"passed {counts['pass']}, fell back {counts['fallback']}, WRONG {counts['wrong']}, "
              f"ERROR {counts['error']}, skipped {counts['skip']}")
        for status in ("wrong", "error"):
            for r in mine:
                if r["status"] == status:
                    print(f"   {status.upper()}: {r['op']} #{r['sample']}: {r['reason']}")
        bad += counts["wrong"] + counts["error"]
        for title, status in (("fell back", "fallback"), ("skipped", "skip")):
            reasons = collections.Counter()
            examples: dict = {}
            for r in mine:
                if r["status"] == status:
                    reasons[r["reason"]] += 1
                    examples.setdefault(r["reason"], set()).add(r["op"])
            if reasons:
                print(f"  {title} (samples, reason, ops):")
                for reason, k in reasons.most_common():
                    ops = sorted(examples[reason])
                    print(f"   {k:4d}  {reason}  [{', '.join(ops[:6])}{' ...' if len(ops) > 6 else ''}]")
        strides = sum(1 for r in mine if any(str(n).startswith("stride") for n in r["notes"]))
        print(f"  samples whose output strides differ from eager's (reported, not failed): {strides}")
    return 1 if bad else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="aot_eager,tininductor")
    parser.add_argument("--samples", type=int, default=2, help="sample inputs per op (the first N)")
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all of op_db)")
    parser.add_argument("--shard", help="i/n: every n-th op starting at i")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per op and backend")
    parser.add_argument("--json", help="write the per-sample rows here")
    parser.add_argument("--merge", nargs="+", help="report on rows saved by earlier --json runs")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--dynamic", action="store_true", help="compile with dynamic=True (symbolic sizes)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cuda: samples made on the GPU, tininductor through real Triton kernels")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.merge:
        rows = [row for path in args.merge for row in json.load(open(path))]
        return report(rows)
    import opinfo_harness as h

    names = args.ops.split(",") if args.ops else h.all_op_names()
    if args.shard:
        i, n = map(int, args.shard.split("/"))
        names = names[i::n]
    rows = sweep(names, args.backends.split(","), args.samples, args.timeout, args.verbose or bool(args.ops),
                 dynamic=args.dynamic)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    return report(rows)


if __name__ == "__main__":
    sys.exit(main())
