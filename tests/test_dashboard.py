"""The model dashboard (bench/dashboard.py): its CPU slice passes accuracy through tiny, its arguments are checked.

The slice is the test zoo's scaled-down models, eager against tinydynamo only, accuracy only: the
same code path the GPU run takes, minus the timing. Speed is never asserted here.
"""
import importlib.util
import json
import sys

import pytest

import tininductor.compile_fx as compile_fx_module
from course.loader import ROOT
from tinydynamo.exc import EagerFallbackWarning


def _dashboard():
    spec = importlib.util.spec_from_file_location("dashboard", ROOT / "bench" / "dashboard.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["dashboard"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _slice(tmp_path, models: str, suite: str):
    out = tmp_path / "dashboard.json"
    code = _dashboard().main(["--device", "cpu", "--sizes", "small", "--models", models, "--suite", suite,
                              "--backends", "eager,tiny", "--accuracy-only", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    return code, rows


def _assert_all_pass(code, rows):
    ran = [r for r in rows if not r["status"].startswith("skipped")]
    assert ran, "every library of the slice is missing"
    for r in ran:
        assert r["statuses"].get("tiny") == "ok", (r["model"], r["suite"], r["statuses"], r.get("traces"))
        assert not r.get("tiny fallbacks"), (r["model"], r["suite"], r["tiny fallbacks"])  # compiled, all of it
    assert code == 0


def test_cpu_slice_inference_passes_accuracy_through_tiny(tmp_path):
    _assert_all_pass(*_slice(tmp_path, "resnet18,bert,timm_vit_small", "inference"))


def test_cpu_slice_training_passes_accuracy_through_tiny(tmp_path):
    _assert_all_pass(*_slice(tmp_path, "resnet18,bert", "training"))


@pytest.mark.slow
def test_cpu_slice_every_small_model_passes_accuracy_through_tiny(tmp_path):
    module = _dashboard()
    names = ",".join(m.name for m in module.MODELS if m.small)
    _assert_all_pass(*_slice(tmp_path, names, "inference,training"))


def test_a_wrong_backend_is_reported_not_timed():
    module = _dashboard()
    import torch

    expected = {"output 0": torch.ones(4), "grad w": torch.ones(3), "grad unused": None}
    assert module.compare(expected, dict(expected), torch.float32) == []
    assert module.compare(expected, {**expected, "grad unused": torch.zeros(3)}, torch.float32) == []
    wrong = module.compare(expected, {**expected, "output 0": torch.ones(4) * 1.01}, torch.float32)
    assert wrong and "output 0" in wrong[0]
    assert module.compare(expected, {**expected, "output 0": torch.ones(4) * 1.01}, torch.bfloat16) == []
    assert "missing" in module.compare(expected, {**expected, "grad w": None}, torch.float32)[0]
    assert module.compare(expected, {**expected, "output 0": torch.full((4,), float("nan"))}, torch.float32)
    # bf16 past the tolerance: judged by the distance to float64, against eager bf16's own
    truth = {"grad b": torch.ones(4)}
    noisy_eager = {"grad b": torch.tensor([1.1, 0.9, 1.1, 0.9])}
    assert module.compare_with_truth(noisy_eager, {"grad b": torch.tensor([0.9, 1.1, 1.0, 1.0])}, truth) == []
    assert module.compare_with_truth(noisy_eager, {"grad b": torch.full((4,), 2.0)}, truth)
    # fp32: eager's own error from float64 (an ill-conditioned model) sets the bar, with a smaller slack
    close_eager = {"grad b": torch.tensor([1.001, 0.999, 1.0, 1.0])}
    assert module.compare_with_truth(close_eager, {"grad b": torch.tensor([0.999, 1.001, 1.0, 1.0])}, truth,
                                     torch.float32) == []
    assert module.compare_with_truth(close_eager, {"grad b": torch.tensor([1.01, 0.99, 1.0, 1.0])}, truth,
                                     torch.float32)


def test_a_failing_model_is_recorded_and_the_run_goes_on(tmp_path, monkeypatch):
    module = _dashboard()

    def broken(lib):
        raise RuntimeError("this model cannot be built")

    monkeypatch.setattr(module.model_zoo.BY_NAME["resnet18"], "build", broken)
    out = tmp_path / "d.json"
    code = module.main(["--device", "cpu", "--sizes", "small", "--models", "resnet18,bert", "--suite", "inference",
                        "--backends", "eager,tiny", "--accuracy-only", "--out", str(out)])
    rows = {r["model"]: r for r in json.loads(out.read_text())["rows"]}
    assert code == 1
    if not rows["resnet18"]["status"].startswith("skipped"):
        assert "cannot be built" in rows["resnet18"]["status"]
    assert rows["bert"]["status"] in ("ok", "skipped (transformers missing)")


def test_jobs_run_each_model_in_its_own_process_into_one_table(tmp_path):
    """``--jobs 2``: the models run two at a time, a process each, and their rows come back in the
    order asked for, as one run's table and JSON."""
    out = tmp_path / "d.json"
    code = _dashboard().main(["--device", "cpu", "--sizes", "small", "--models", "squeezenet,resnet18,bert", "--jobs", "2",
                              "--suite", "inference", "--backends", "eager,tiny", "--accuracy-only", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["model"] for r in result["rows"]] == ["squeezenet", "resnet18", "bert"]
    assert "summary" in result and "partial" not in result
    _assert_all_pass(code, result["rows"])


def test_timed_models_each_get_a_fresh_process(monkeypatch):
    """Timing several models, even one at a time, runs each in a process of its own: a process keeps
    what it compiled, so a later model's first call would find an earlier one's kernels in memory.
    Checking accuracy only (the CI slice) stays in this process."""
    dashboard = _dashboard()
    calls = []
    monkeypatch.setattr(dashboard, "run_in_processes", lambda args, argv, jobs: calls.append(jobs) or [])
    monkeypatch.setattr(dashboard, "finish", lambda args, rows: 0)
    monkeypatch.setattr(dashboard, "run_model", lambda *a: pytest.fail("timed in this process"))
    dashboard.main(["--device", "cpu", "--sizes", "small", "--models", "squeezenet,resnet18", "--suite", "inference"])
    assert calls == [[("squeezenet", "inference", "fp32"), ("resnet18", "inference", "fp32")]]


@pytest.mark.parametrize("argv, said", [
    (["--models", "resnet18,nope"], "--models"),
    (["--models", ""], "--models"),
    (["--suite", "inference,eval"], "--suite"),
    (["--dtype", "fp16"], "--dtype"),
    (["--mode", "max-autotune"], "--mode"),
    (["--sizes", "huge"], "--sizes"),
    (["--backends", "tiny"], "--backends"),
    (["--backends", "eager,inductor"], "--backends"),
    (["--iters", "0"], "--iters"),
    (["--jobs", "0"], "--jobs"),
    (["--jobs", "2", "--device", "cuda:1"], "--jobs"),
])
def test_dashboard_refuses_bad_arguments(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _dashboard().parse_args(["--device", "cpu", *argv])
    assert exit_info.value.code == 2
    assert said in capsys.readouterr().err


def test_dashboard_arguments_parse():
    args = _dashboard().parse_args(["--device", "cpu", "--models", "bert,resnet18,bert", "--dtype", "fp32,bf16",
                                    "--suite", "training", "--mode", "reduce-overhead", "--sizes", "small"])
    assert args.models == ["bert", "resnet18"]
    assert args.dtype == ["fp32", "bf16"]
    assert args.suite == ["training"]
    assert args.mode == "reduce-overhead"


def test_dashboard_has_twenty_models_of_three_libraries():
    module = _dashboard()
    assert len(module.MODELS) >= 20
    assert {m.library for m in module.MODELS} == {"torchvision", "timm", "transformers"}
    from tests import model_zoo

    assert all(m.small is None or m.small in model_zoo.BY_NAME for m in module.MODELS)


def test_a_graph_run_eagerly_is_recorded(tmp_path, monkeypatch):
    """A graph tininductor gave up on runs in torch (right, with a warning) but is not compiled: the
    row lists it, and the summary names the model, so an eager time is never read as tiny's."""
    module = _dashboard()

    def broken(*args, **kwargs):
        raise RuntimeError("no lowering for this graph")

    monkeypatch.setattr(compile_fx_module, "_compile_fx_inner", broken)
    out = tmp_path / "d.json"
    with pytest.warns(EagerFallbackWarning, match="running it eagerly"):
        module.main(["--device", "cpu", "--sizes", "small", "--models", "resnet18", "--suite", "inference",
                     "--backends", "eager,tiny", "--accuracy-only", "--out", str(out)])
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    if row["status"].startswith("skipped"):
        pytest.skip(row["status"])
    assert row["statuses"]["tiny"] == "ok"  # right: eager's own answer
    assert any("no lowering for this graph" in f for f in row["tiny fallbacks"])
    assert data["summary"][0]["tiny with an eager fallback"] == ["resnet18"]


def test_first_call_timeline_of_a_dashboard_model(tmp_path, capsys, monkeypatch):
    """bench/first_call.py: one model's first call, with empty compile caches, as a timeline of its
    compile phases, and the same as a Chrome trace."""
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TINY_CACHE_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var))  # (the script points them at fresh directories)
    spec = importlib.util.spec_from_file_location("first_call", ROOT / "bench" / "first_call.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trace = tmp_path / "trace.json"
    assert module.main(["squeezenet", "--device", "cpu", "--sizes", "small", "--suite", "training",
                        "--min-ms", "0", "--trace", str(trace), "--profile", "3"]) == 0
    out = capsys.readouterr().out
    assert "squeezenet training fp32 on cpu: first call" in out
    for phase in ("compile_frame", "joint_graph", "partition", "lowering", "codegen"):
        assert phase in out, phase
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["name"] == "compile_frame" for e in events)
    # the run after the compile: the compiled forward and backward are among its longest operations
    profile = out[out.index("longest operations after the compile"):].splitlines()
    names = [line.split("  <-")[0] for line in profile[2:]]
    assert len(profile) == 5 and any(n.endswith(" CompiledFunction") for n in names), profile
    assert any(n.endswith("CompiledFunctionBackward") for n in names), profile
