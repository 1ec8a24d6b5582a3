"""bench/triton_compile_times.py: a model's generated kernels compile for a GPU target (sm_90) on a
CPU-only machine, each one timed: Triton's real compiler, not the interpreter the CPU tests run."""
import importlib.util
import re

import pytest

from course.loader import ROOT
from tests import model_zoo


def test_squeezenet_kernels_compile_for_a_gpu_target(capsys):
    pytest.importorskip("triton.backends.nvidia")
    if model_zoo.import_torchvision() is None:
        pytest.skip("torchvision is not installed")
    spec = importlib.util.spec_from_file_location("triton_compile_times", ROOT / "bench" / "triton_compile_times.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--model", "squeezenet", "--top", "3"]) == 0
    out = capsys.readouterr().out
    summary = re.search(r"(\d+) Triton kernels for sm_90: ([\d.]+) s of compile in all, the slowest ([\d.]+) s", out)
    assert summary, out
    kernels, total, slowest = int(summary[1]), float(summary[2]), float(summary[3])
    assert kernels >= 5 and 0 < slowest <= total, out
    rows = re.findall(r"^\s+([\d.]+) s  (triton_\w+)$", out, re.M)
    assert len(rows) == 3 and float(rows[0][0]) == pytest.approx(slowest, abs=0.01), out
