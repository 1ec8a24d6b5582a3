"""Plots of saved benchmark results: one PNG per benchmark, from one script's JSON or run_all's.

Plots are drawn from the JSON files, never from a new measurement, so they can be drawn again
(and the GPU run's, which chapter 11 shows, drawn on a machine without a GPU):

    python bench/plot_results.py notebooks/data/gpu_results.json --out bench/results/plots
    python bench/plot_results.py bench/results/pointwise_chain-cpu-*.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from course import benchmark as harness


def results_in(path: Path) -> dict[str, dict]:
    """name -> one benchmark's saved payload, from a single result file or run_all's combined one."""
    data = json.loads(path.read_text())
    if "results" in data:
        return {name: {"device": data.get("device"), **payload} for name, payload in data["results"].items()}
    return {data.get("benchmark", path.stem): data}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=harness.RESULTS / "plots")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.json:
        for name, payload in results_in(path).items():
            fig = harness.plot_result(name, payload)
            if fig is None:
                print(f"{name}: no plot for this kind of result")
                continue
            target = args.out / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.png"
            fig.savefig(target)
            plt.close(fig)
            print(f"{name}: {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
