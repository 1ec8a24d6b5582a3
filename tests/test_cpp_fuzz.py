"""A hypothesis fuzzer for the C++ backend: random pointwise/reduction graphs vs eager.

Each example is a small program over 1-3 inputs with broadcasting, non-contiguous inputs and
0/1-sized dims, built from random unary/binary ops and ending, maybe, in a reduction over a
random dim; it is compiled with compile_fx (cpu_backend="cpp") and compared with eager.
CI runs the same 60 cases every time (each one is a g++ build), so a red run is never a roll
of the dice; a long run on a fresh slice of programs:

    TINY_FUZZ_EXAMPLES=2000 TINY_FUZZ_SEED=7 python -m pytest tests/test_cpp_fuzz.py -q
"""
import os

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings, strategies as st

from tininductor.testing import check

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

EXAMPLES = int(os.environ.get("TINY_FUZZ_EXAMPLES", "60"))
SEED = os.environ.get("TINY_FUZZ_SEED")  # set it to run a different (random) slice of programs

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": lambda x: torch.exp(x.clamp(-20, 20)), "sin": torch.sin,
    "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "sqrt_abs": lambda x: torch.sqrt(x.abs()), "floor": torch.floor, "log1p_abs": lambda x: torch.log1p(x.abs()),
    "square": lambda x: x * x, "add_const": lambda x: x + 0.5, "rsqrt": lambda x: torch.rsqrt(x.abs() + 1),
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum,
    "div": lambda a, b: a / (b.abs() + 1), "where_gt": lambda a, b: torch.where(a > b, a, b),
}
REDUCE = {
    "sum": lambda x, d: x.sum(d), "mean": lambda x, d: x.mean(d), "amax": lambda x, d: x.amax(d),
    "amin": lambda x, d: x.amin(d, keepdim=True), "softmax": lambda x, d: torch.softmax(x, d),
    "log_softmax": lambda x, d: torch.log_softmax(x, d), "var": lambda x, d: x.var(d),
}


@st.composite
def programs(draw):
    rank = draw(st.integers(1, 3))
    shape = [draw(st.sampled_from([0, 1, 2, 3, 5, 7, 16, 33])) for _ in range(rank)]
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))  # values reproducible from the example
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
        s = [1 if draw(st.booleans()) and draw(st.booleans()) else d for d in shape]  # broadcast dims
        s = s[draw(st.integers(0, rank - 1)):] if draw(st.booleans()) else s           # fewer leading dims
        t = torch.randn(list(reversed(s)), dtype=dtype, generator=gen).permute(*reversed(range(len(s)))) \
            if draw(st.booleans()) and len(s) > 1 else torch.randn(s, dtype=dtype, generator=gen)  # maybe non-contiguous
        inputs.append(t)
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            steps.append(("unary", draw(st.sampled_from(sorted(UNARY))), draw(st.integers(0, 99))))
        else:
            steps.append(("binary", draw(st.sampled_from(sorted(BINARY))), draw(st.integers(0, 99)), draw(st.integers(0, 99))))
    reduce = draw(st.sampled_from([None, *sorted(REDUCE)]))
    dim = draw(st.integers(-rank, rank - 1))
    return inputs, steps, reduce, dim


def make_function(program):
    """The program as Python source with fixed arity (so torch.fx.symbolic_trace can trace it)."""
    inputs, steps, reduce, dim = program
    names = [f"x{i}" for i in range(len(inputs))]
    lines = [f"def fn({', '.join(names)}):"]
    for step in steps:
        if step[0] == "unary":
            lines.append(f"    v{len(names)} = U[{step[1]!r}]({names[step[2] % len(names)]})")
        else:
            a, b = names[step[2] % len(names)], names[step[3] % len(names)]
            lines.append(f"    v{len(names)} = B[{step[1]!r}]({a}, {b})")
        names.append(f"v{len(names)}")
    out = names[-1]
    if reduce is not None:
        # the result's rank is known once the broadcasts are: run the steps eagerly to see it
        namespace = {"U": UNARY, "B": BINARY}
        exec("\n".join(lines + [f"    return {out}"]), namespace)
        result = namespace["fn"](*inputs)
        rank = result.dim()
        if reduce in ("amax", "amin", "softmax", "log_softmax") and result.shape[dim % rank] == 0:
            reduce = "sum"  # eager refuses max over an empty dim (the broadcast result's, not an input's)
        lines.append(f"    r = R[{reduce!r}]({out}, {dim % rank})")
        out = "r"
    lines.append(f"    return {out}, {names[len(inputs)] if len(names) > len(inputs) else 'x0'}")
    namespace = {"U": UNARY, "B": BINARY, "R": REDUCE}
    exec("\n".join(lines), namespace)
    return namespace["fn"], "\n".join(lines)


def run_program(program):
    fn, source = make_function(program)
    try:
        check(fn, *program[0], atol=1e-4, rtol=1e-4)
    except AssertionError as e:
        raise AssertionError(f"{e}\nprogram:\n{source}") from None


@pytest.fixture(autouse=True, scope="module")
def _cpp_backend(tmp_path_factory):
    saved = {k: os.environ.get(k) for k in ("TINY_CPU_BACKEND", "TINY_CACHE_DIR")}
    os.environ["TINY_CPU_BACKEND"] = "cpp"
    os.environ.setdefault("TINY_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tiny_cache"))
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=SEED is None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@seed(int(SEED or 0))
@given(programs())
def test_random_graphs_match_eager(program):
    run_program(program)
