"""The dynamo-suite shim (tests/dynamo_suite/shim.py) maps torch._dynamo's names to tinydynamo's with the
same meaning: an Unsupported raised under fullgraph is torch's ``Unsupported`` too, and torch's
``counters["frames"]`` count the frames tinydynamo tried and compiled. (The shim is not installed here:
its functions are called directly, so torch.compile stays torch's for the other tests.)"""
import pytest
import torch
import torch._dynamo.utils

import tinydynamo
import tinydynamo.eval_frame
from tests.dynamo_suite import shim


def test_an_unsupported_is_also_torchs_unsupported():
    e = tinydynamo.exc.ObservedException(StopIteration, "")
    mapped = shim.as_torch_unsupported(e)
    assert isinstance(mapped, torch._dynamo.exc.Unsupported) and isinstance(mapped, tinydynamo.exc.ObservedException)
    assert str(mapped) == str(e) and mapped.exc_type is StopIteration
    assert shim.as_torch_unsupported(mapped) is mapped


def _stop(x):
    it = iter([])
    return x + next(it)


def test_frame_counters_and_fullgraph_errors_read_as_torchs(monkeypatch):
    monkeypatch.setattr(tinydynamo.eval_frame, "convert_frame", shim.convert_frame)
    torch._dynamo.utils.counters.clear()
    tinydynamo.reset()
    x = torch.randn(2)
    torch.testing.assert_close(tinydynamo.optimize("eager")(lambda t: t + 1)(x), x + 1)
    assert dict(torch._dynamo.utils.counters["frames"]) == {"total": 1, "ok": 1}
    with pytest.raises(torch._dynamo.exc.Unsupported, match="Observed exception: StopIteration"):
        tinydynamo.optimize("eager", nopython=True)(_stop)(x)
    assert dict(torch._dynamo.utils.counters["frames"]) == {"total": 2, "ok": 1}
    torch._dynamo.utils.counters.clear()


def _checked(x):
    b = x.sin()
    if x.shape[0] != 3:
        raise ValueError("3 elements")
    return {"out": x.cos() + b, "n": 3}


def _breaks(x):
    print("", end="")
    return x + 1


def test_export_calls_the_exported_graph_like_the_function():
    x = torch.randn(3)
    gm, guards = shim.export(_checked)(x)
    assert gm(x)["n"] == 3 and guards
    torch.testing.assert_close(gm(x)["out"], _checked(x)["out"])
    y = torch.randn(3)
    torch.testing.assert_close(gm(y)["out"], _checked(y)["out"])  # the same graph, no guard checked
    assert [n.op for n in gm.graph.nodes].count("placeholder") == 1
    with pytest.raises(torch._dynamo.exc.Unsupported):
        shim.export(_breaks)(x)
