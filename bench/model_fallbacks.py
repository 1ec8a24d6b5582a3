"""Which ATen ops a dashboard model's compiled code still hands to torch, per model (CPU, small sizes).

Every op that tininductor neither decomposes nor lowers runs as a *fallback*: a library call between
generated kernels, one more host call per inference and a point fusion cannot cross. This script
compiles each model's small version (tests/model_zoo.py) with tinydynamo for fp32 inference, checks the
output against eager, and counts the calls in the generated code: the fallbacks by op, and the matmuls
(``mm`` / ``addmm``, the latter with the bias in the library's epilogue, fx_passes/mm_bias.py).

    python bench/model_fallbacks.py [--models opt,t5,bart,vit_b_16]
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import tinydynamo  # noqa: E402
from bench import dashboard  # noqa: E402
from tests import model_zoo  # noqa: E402

FALLBACK = re.compile(r"= (torch\.ops\.[\w.]+)\(.*# fallback")
LIBRARY = re.compile(r"= torch\.(mm|addmm|bmm|baddbmm)\(")


def calls_in(code_dir: Path) -> tuple[collections.Counter, collections.Counter]:
    """(fallback op -> calls, library matmul -> calls) over every output_code.py under ``code_dir``."""
    fallbacks, matmuls = collections.Counter(), collections.Counter()
    for path in sorted(code_dir.rglob("output_code*.py")):
        for line in path.read_text().splitlines():
            if m := FALLBACK.search(line):
                fallbacks[m.group(1).removeprefix("torch.ops.")] += 1
            elif m := LIBRARY.search(line):
                matmuls[m.group(1)] += 1
    return fallbacks, matmuls


def survey(name: str) -> str:
    """One line for ``name``: its fallbacks and matmuls, or why it was skipped."""
    built = dashboard.BY_NAME[name].make("small")
    if built is None:
        return f"{name:12s} skipped (its library is not installed or it has no small version)"
    model, args = built
    model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TINY_COMPILE_DEBUG"], os.environ["TINY_COMPILE_DEBUG_DIR"] = "1", tmp
        try:
            tinydynamo.reset()
            compiled = tinydynamo.compile(model, backend="tininductor", dynamic=False)
            with torch.no_grad():
                got, expected = compiled(*args), model(*args)
            torch.testing.assert_close(model_zoo.first_tensor(got), model_zoo.first_tensor(expected),
                                       atol=1e-4, rtol=1e-4)
        finally:
            del os.environ["TINY_COMPILE_DEBUG"], os.environ["TINY_COMPILE_DEBUG_DIR"]
        fallbacks, matmuls = calls_in(Path(tmp))
    listed = ", ".join(f"{op}:{n}" for op, n in fallbacks.most_common()) or "none"
    mms = " ".join(f"{op}:{n}" for op, n in sorted(matmuls.items()))
    return f"{name:12s} matmuls {mms:28s} fallbacks {listed}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = [m.name for m in dashboard.MODELS if m.library == "transformers" and m.small] + ["vit_b_16"]
    p.add_argument("--models", default=",".join(default), help="comma list of dashboard models")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    for name in args.models.split(","):
        print(survey(name), flush=True)


if __name__ == "__main__":
    main()
