"""bench/eager_vs_compile.py: runs end to end at tiny sizes, checks outputs, reports a broken column."""
from __future__ import annotations

from bench import eager_vs_compile as bench

TINY = ["--batch", "1", "--seq", "2", "--hidden", "8", "--iters", "2", "--warmup", "0"]


def test_bench_prints_a_row_per_workload_and_backend(capsys):
    rc = bench.main(TINY + ["--backends", "torch.compile[eager]"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = [line.split() for line in out.splitlines() if line.startswith(("tinyblock", "pointwise"))]
    assert [(r[0], r[1]) for r in rows] == [
        ("tinyblock", "eager"), ("tinyblock", "torch.compile[eager]"),
        ("pointwise", "eager"), ("pointwise", "torch.compile[eager]"),
    ]
    assert all(r[-1].endswith("x") for r in rows), out  # every row has a ratio vs eager
    assert rows[0][-1] == "1.00x"


def test_bench_refuses_to_time_a_wrong_backend(monkeypatch, capsys):
    def wrong(model, args):
        return lambda x: model(x) + 1  # off by one: must be caught before timing

    monkeypatch.setitem(bench.BACKENDS, "wrong", wrong)
    rc = bench.main(TINY + ["--workloads", "pointwise", "--backends", "wrong"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "wrong" in out and "FAILED" in out, out

