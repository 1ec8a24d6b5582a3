"""Benchmark scripts take their size arguments literally: ``--max-log2 0`` means 2^0, not "default"."""
import importlib.util

import pytest

from course.loader import ROOT


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pointwise_chain():
    return _bench("pointwise_chain")


def test_max_log2_zero_is_not_the_default(capsys):
    with pytest.raises(SystemExit) as exit_info:  # 2^10 .. 2^0 is empty: said, not silently replaced by 2^23
        _pointwise_chain().main(["--max-log2", "0", "--backends", "eager", "--device", "cpu"])
    assert exit_info.value.code == 2
    assert "--max-log2 0" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["--seqs", ""], "--seqs"),
    (["--seqs", "64,x"], "--seqs"),
    (["--seqs", "0,64"], "--seqs"),
    (["--backends", "eager"], "--backends"),
    (["--mode", "reduce-overhead"], "--mode"),
])
def test_dynamic_shapes_refuses_bad_arguments_before_compiling(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _bench("dynamic_shapes").main([*argv, "--device", "cpu"])
    assert exit_info.value.code == 2
    assert said in capsys.readouterr().err
