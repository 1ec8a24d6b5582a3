"""Hypothesis fuzzer: random pointwise/reduction/view graphs, compiled vs eager.

Each example draws input shapes (with broadcasting, size-1 dims and transposed inputs), a
program of 1-7 steps (unary, binary, reduction, view, softmax-like ops), and the reduction
mode (persistent or looped), then checks the compiled graph against eager.

The default example count is small for CI; for a long run::

    TINY_FUZZ_EXAMPLES=2000 python -m pytest tests/test_inductor_fuzz.py -q
"""
import os

import torch
from hypothesis import HealthCheck, given, seed, settings, strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from tininductor import config
from tininductor.testing import DEVICE, compile_graph, patch_config

EXAMPLES = int(os.environ.get("TINY_FUZZ_EXAMPLES", "200"))
SEED = os.environ.get("TINY_FUZZ_SEED")  # set it to run a different (random) slice of programs

UNARY = {
    "sin": torch.sin, "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "abs": torch.abs, "neg": torch.neg, "relu": torch.relu, "erf": torch.erf,
    "exp_sin": lambda x: torch.exp(torch.sin(x)), "square": lambda x: x * x,
    "log1p_abs": lambda x: torch.log1p(x.abs()), "sqrt_abs": lambda x: torch.sqrt(x.abs()),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 1), "affine": lambda x: x * 0.5 - 1.25,
    "floor": lambda x: torch.floor(x * 4),
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum,
    "minimum": torch.minimum, "div": lambda a, b: a / (b.abs() + 1),
    "where": lambda a, b: torch.where(a > b, a, b * 2), "pow": lambda a, b: (a.abs() + 0.5) ** torch.sigmoid(b),
}
REDUCE = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k), "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k), "amin": lambda x, d, k: x.amin(d, keepdim=k),
    "var": lambda x, d, k: x.var(d, keepdim=k, correction=0),
    "softmax": lambda x, d, k: torch.softmax(x, d), "log_softmax": lambda x, d, k: torch.log_softmax(x, d),
}


@st.composite
def programs(draw):
    ndim = draw(st.integers(1, 3))
    base = [draw(st.integers(1, 9)) for _ in range(ndim)]
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
        shape = list(base)
        if draw(st.booleans()):  # broadcast: drop leading dims and/or set some to 1
            shape = shape[draw(st.integers(0, ndim - 1)):]
            shape = [1 if draw(st.integers(0, 3)) == 0 else s for s in shape]
        transposed = len(shape) >= 2 and draw(st.booleans())
        inputs.append((shape, transposed))
    steps = []
    nvals = len(inputs)
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["unary", "unary", "binary", "binary", "reduce", "view"]))
        a = draw(st.integers(0, nvals - 1))
        if kind == "unary":
            steps.append(("unary", draw(st.sampled_from(sorted(UNARY))), a))
        elif kind == "binary":
            steps.append(("binary", draw(st.sampled_from(sorted(BINARY))), a, draw(st.integers(0, nvals - 1))))
        elif kind == "reduce":
            steps.append(("reduce", draw(st.sampled_from(sorted(REDUCE))), a, draw(st.integers(-1, 2)), draw(st.booleans())))
        else:
            steps.append(("view", draw(st.sampled_from(["t", "flatten", "unsqueeze", "slice"])), a))
        nvals += 1
    extra_output = draw(st.integers(0, nvals - 1))
    looped = draw(st.booleans())
    return inputs, steps, extra_output, looped


COUNT = []  # examples run (printed by the long run)


def make_inputs(inputs):
    out = []
    for shape, transposed in inputs:
        if transposed:
            t = torch.randn(list(reversed(shape)), device=DEVICE).t() if len(shape) == 2 else \
                torch.randn(shape[::-1], device=DEVICE).permute(*reversed(range(len(shape))))
        else:
            t = torch.randn(shape, device=DEVICE)
        out.append(t)
    return out


def build(steps, extra_output):
    def fn(*args):
        vals = list(args)
        for step in steps:
            kind, name, a = step[:3]
            x = vals[a]
            if kind == "unary":
                y = UNARY[name](x)
            elif kind == "binary":
                b = vals[step[3]]
                try:
                    torch.broadcast_shapes(x.shape, b.shape)
                except RuntimeError:
                    b = x
                y = BINARY[name](x, b)
            elif kind == "reduce":
                if x.dim() == 0:
                    y = x * 2
                else:
                    y = REDUCE[name](x, step[3] % x.dim(), step[4])
            else:
                if name == "t" and x.dim() >= 2:
                    y = x.transpose(0, 1)
                elif name == "flatten":
                    y = x.reshape(-1)
                elif name == "slice" and x.dim() >= 1:
                    y = x[..., ::2]
                else:
                    y = x.unsqueeze(0)
            vals.append(y)
        return vals[-1], vals[extra_output] * 1.5

    return fn


@settings(max_examples=EXAMPLES, deadline=None, derandomize=SEED is None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@seed(int(SEED or 0))
@given(programs())
def test_random_graphs_match_eager(program):
    inputs, steps, extra_output, looped = program
    fn = build(steps, extra_output)
    args = make_inputs(inputs)
    expected = fn(*args)
    limit = 4 if looped else 1024
    with patch_config(config.triton, persistent_reduction_max=limit, looped_rblock=4):
        compiled = compile_graph(make_fx(fn)(*args), args)  # make_fx: shape logic runs concretely
        actual = compiled(*args)
    COUNT.append(1)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4, equal_nan=True, check_stride=False,
                               msg=lambda m: f"{m}\nprogram: {program}\n{compiled.source}")


def teardown_module():
    if SEED is not None:
        print(f"\nfuzz: {len(COUNT)} examples compiled and compared (seed {SEED})")
