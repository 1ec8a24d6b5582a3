"""mode="max-autotune": every candidate config computes what eager does, the fastest is kept and cached.

Timing only means something on a GPU, so on the CPU the choice is driven by a stand-in timer;
the candidates themselves run for real (Triton's interpreter here, CUDA on the GPU machine).
"""
from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("triton")
from tininductor import config  # noqa: E402
from tininductor.runtime import autotune  # noqa: E402
from tininductor.testing import DEVICE, compile_graph, patch_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TINY_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)


def tuned(fn, *args):
    with patch_config(config.triton, max_autotune=True):
        return compile_graph(fn, args)


CASES = {
    "pointwise exact": (lambda x: torch.nn.functional.gelu(x * 1.5 + 0.25) + x, (4096,)),
    "pointwise masked": (lambda x: (x.sin() * 2).exp(), (1000,)),
    "persistent rows": (lambda x: torch.softmax(x, -1), (24, 64)),
    "looped rows": (lambda x: x.sum(-1), (3, 5000)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_candidate_matches_eager(case):
    fn, shape = CASES[case]
    x = torch.randn(shape, device=DEVICE)
    compiled = tuned(fn, x)
    expected = fn(x)
    module = compiled.compiled_graphs[0].module
    for name in compiled.kernels:
        launcher = getattr(module, name)
        candidates = launcher.autotune  # not launched yet, so not tuned yet
        assert candidates and len(candidates) >= 2, f"{name} has no candidates"
        xblock = launcher.constants["XBLOCK"]
        assert candidates[0]["XBLOCK"] == xblock and candidates[0]["num_warps"] == launcher.num_warps
        if re.search(rf"def {name}\(.*?xmask = tl.full", compiled.source, re.S):  # no mask: exact tiling
            assert all(launcher.numel % c["XBLOCK"] == 0 for c in candidates), candidates
        for config_ in candidates:
            setattr(module, name, launcher.with_config(config_))
            try:
                torch.testing.assert_close(compiled(x), expected, msg=lambda m: f"{name} {config_}: {m}")
            finally:
                setattr(module, name, launcher)


def timer_from(times: list[float]):
    calls = iter(times)
    return lambda launch: (launch(), next(calls))[1]


def test_fastest_is_chosen_then_reused_from_the_cache():
    x = torch.randn(4096, device=DEVICE)
    compiled = tuned(lambda x: (x * 2).cos(), x)
    launcher = getattr(compiled.compiled_graphs[0].module, compiled.kernels[0])  # not launched yet
    n = len(launcher.autotune)
    out = torch.empty_like(x)
    times = [5.0] * n
    times[-1] = 1.0
    before = dict(autotune.stats)
    best = autotune.autotune(launcher, (x, out, x.numel()), timer=timer_from(times), device="test")
    assert best == launcher.autotune[-1]
    torch.testing.assert_close(out, (x * 2).cos())
    assert autotune.stats["tuned"] == before.get("tuned", 0) + 1

    def no_timing(launch):
        raise AssertionError("a stored choice must not be timed again")

    assert autotune.autotune(launcher, (x, out, x.numel()), timer=no_timing, device="test") == best
    assert autotune.stats["disk_hit"] == before.get("disk_hit", 0) + 1
    # another GPU is tuned on its own
    times[0] = 0.5
    assert autotune.autotune(launcher, (x, out, x.numel()), timer=timer_from(times), device="other") == launcher.autotune[0]


@pytest.mark.parametrize("damage", ["garbage", "not a candidate"])
def test_a_bad_cache_entry_is_tuned_again(damage):
    x = torch.randn(2048, device=DEVICE)
    compiled = tuned(lambda x: x.abs() + 1, x)
    launcher = getattr(compiled.compiled_graphs[0].module, compiled.kernels[0])
    args = (x, torch.empty_like(x), x.numel())
    n = len(launcher.autotune)
    autotune.autotune(launcher, args, timer=timer_from([1.0] + [2.0] * (n - 1)), device="test")
    [entry] = (autotune._subdir("autotune")).glob("*.json")
    if damage == "garbage":
        entry.write_text("{not json")
    else:
        entry.write_text(json.dumps({"best": {"XBLOCK": 3, "num_warps": 1}}))
    best = autotune.autotune(launcher, args, timer=timer_from([2.0] * (n - 1) + [1.0]), device="test")
    assert best == launcher.autotune[-1]
    assert json.loads(entry.read_text())["best"] == best


def test_modes_reach_the_wrapper():
    import tinydynamo

    fn = lambda x: torch.relu(x) * 3  # noqa: E731
    x = torch.randn(256, device=DEVICE)
    with patch_config(config, cpu_backend="triton"):
        compiled = tinydynamo.compile(fn, mode="max-autotune-no-cudagraphs")
        torch.testing.assert_close(compiled(x), fn(x))
    from tininductor.compile_fx import compiled_graphs

    assert "autotune=[" in compiled_graphs[-1].source
    with pytest.raises(ValueError, match="unknown mode 'fastest'"):
        tinydynamo.compile(fn, mode="fastest")


@pytest.mark.gpu
def test_gpu_tunes_at_the_first_launch():
    x = torch.randn(1 << 20, device="cuda")
    fn = lambda x: torch.nn.functional.gelu(x) * 2  # noqa: E731
    before = autotune.stats["tuned"]
    compiled = tuned(fn, x)
    torch.testing.assert_close(compiled(x), fn(x))
    assert autotune.stats["tuned"] == before + 1
    launcher = getattr(compiled.compiled_graphs[0].module, compiled.kernels[0])
    assert launcher.autotune is None  # tuned: the chosen config is now the launcher's own


def test_a_candidate_that_cannot_run_is_skipped():
    x = torch.randn(2048, device=DEVICE)
    compiled = tuned(lambda x: x * x, x)
    launcher = getattr(compiled.compiled_graphs[0].module, compiled.kernels[0])
    n = len(launcher.autotune)
    broken = launcher.autotune[1]
    original = launcher.with_config

    def with_config(config):
        trial = original(config)
        if config == broken:  # as if this config needed more registers than the GPU has
            trial.run = lambda *args: (_ for _ in ()).throw(RuntimeError("out of resources"))
        return trial

    launcher.with_config = with_config
    times = [2.0] * (n - 1)  # the broken candidate is never timed
    times[-1] = 1.0
    args = (x, torch.empty_like(x), x.numel())
    assert autotune.autotune(launcher, args, timer=timer_from(times), device="test") == launcher.autotune[-1]
