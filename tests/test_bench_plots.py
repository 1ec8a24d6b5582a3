"""bench/plot_results.py: a PNG per benchmark from saved JSON (one script's file or run_all's)."""
from __future__ import annotations

import json
from pathlib import Path

from bench import plot_results

STORED = Path(__file__).resolve().parent.parent / "notebooks" / "data" / "gpu_results.json"


def test_every_plottable_result_of_the_stored_run_gets_a_png(tmp_path, capsys):
    assert plot_results.main([str(STORED), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    names = json.loads(STORED.read_text())["results"]
    plotted = {p.stem for p in tmp_path.glob("*.png")}
    for name in names:
        stem = name.replace(" ", "_")
        if name.startswith(("profile_step", "guard_overhead")):
            assert stem not in plotted and f"{name}: no plot" in out
        else:
            assert stem in plotted, out
            assert (tmp_path / f"{stem}.png").read_bytes()[:4] == b"\x89PNG"


def test_a_single_result_file(tmp_path):
    rows = []
    for p in (10, 12):
        row = {"dtype": "float32", "n": f"2^{p}"}
        for backend, us in (("eager", 9.0), ("tiny", 3.0)):
            row.update({f"{backend} us": us, f"{backend} %bw": 10.0 * p})
        rows.append(row)
    saved = tmp_path / "chain.json"
    saved.write_text(json.dumps({"benchmark": "pointwise_chain", "device": "cpu", "rows": rows}))
    assert plot_results.main([str(saved), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "pointwise_chain.png").stat().st_size > 1000
