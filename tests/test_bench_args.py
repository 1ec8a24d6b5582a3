"""Benchmark scripts take their size arguments literally: ``--max-log2 0`` means 2^0, not "default"."""
import importlib.util

import pytest

from course.loader import ROOT


def _pointwise_chain():
    spec = importlib.util.spec_from_file_location("pointwise_chain", ROOT / "bench" / "pointwise_chain.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_max_log2_zero_is_not_the_default(capsys):
    with pytest.raises(SystemExit) as exit_info:  # 2^10 .. 2^0 is empty: said, not silently replaced by 2^23
        _pointwise_chain().main(["--max-log2", "0", "--backends", "eager", "--device", "cpu"])
    assert exit_info.value.code == 2
    assert "--max-log2 0" in capsys.readouterr().err
