"""The reliability suite's harness: run one *case* eagerly and compiled, compare every observation.

A case is ``case(C, rec)``: it builds its own fresh state, compiles what it wants to compile
with ``C(fn_or_module)`` (the identity for the eager run), calls it in a sequence that changes
state between calls, and records what a user could see with ``rec(value)``: tensors (values,
dtype, requires_grad), Python values, and facts about identity (``out is x``) or storage
sharing. An exception ends the run and is recorded as its type.

Each case is run under eager (the oracle), each tinydynamo backend, and torch.compile, and
classified: ``ok`` (every observation matches), ``wrong`` (a value differs, or eager raised
and the compiled run did not: a silently wrong result), ``raised`` (the compiled run raised
where eager did not, or raised another error type than eager's). ``python -m tests.reliability`` prints the table per family.
"""
from __future__ import annotations

import collections
import dataclasses
import warnings
from typing import Any, Callable

import torch

import tinydynamo
from tinydynamo.exc import EagerFallbackWarning

BACKENDS = ("eager", "aot_eager", "tininductor")
TORCH_BACKENDS = ("eager", "aot_eager")

#: family -> {name: case}
CASES: dict[str, dict[str, Callable]] = collections.defaultdict(dict)


def case(family: str):
    def register(fn):
        CASES[family][fn.__name__.removeprefix("case_")] = fn
        return fn
    return register


@dataclasses.dataclass
class Raised:
    type_name: str
    message: str
    bases: tuple[str, ...] = ()  # the exception's classes, itself first

    def __eq__(self, other):
        """The compiled run raised the eager error's type or a subclass of it (torch.compile wraps
        a user error in TorchRuntimeError, a RuntimeError)."""
        return isinstance(other, Raised) and (other.type_name == self.type_name or
                                              self.type_name in other.bases or other.type_name in self.bases)


def snapshot(value: Any) -> Any:
    """What a user can observe of ``value``, copied now (later in-place writes must not change it)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().clone(), value.dtype, tuple(value.shape), value.requires_grad)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, [snapshot(v) for v in value])
    return ("value", value)


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, Raised):
        return a == b
    if isinstance(a, tuple) and a and a[0] == "tensor":
        return a[2:] == b[2:] and torch.allclose(a[1], b[1], rtol=1e-4, atol=1e-5, equal_nan=True)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def observe(run_case: Callable, compiler: Callable) -> list:
    """Run a case with ``compiler``; its observations (an exception is the last one)."""
    seen: list = []
    torch.manual_seed(0)
    try:
        run_case(compiler, lambda v: seen.append(snapshot(v)))
    except Exception as e:  # noqa: BLE001 - what the user would see
        seen.append(Raised(type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "",
                           tuple(c.__name__ for c in type(e).__mro__)))
    return seen


def classify(expected: list, actual: list) -> tuple[str, str]:
    """("ok" | "wrong" | "raised", detail)."""
    for i, (e, a) in enumerate(zip(expected, actual)):
        if same(e, a):
            continue
        if isinstance(a, Raised) and not isinstance(e, Raised):
            return "raised", f"observation {i}: raised {a.type_name}: {a.message}"
        if isinstance(a, Raised) and isinstance(e, Raised):  # an error, of another type: not silent
            return "raised", f"observation {i}: eager raised {e.type_name}, compiled {a.type_name}: {a.message}"
        if _is_tensor(e) and _is_tensor(a) and e[2:4] == a[2:4] and e[4] != a[4] and \
                torch.allclose(e[1], a[1], rtol=1e-4, atol=1e-5, equal_nan=True):
            return "wrong", f"observation {i}: same values, requires_grad eager {e[4]}, compiled {a[4]}"
        return "wrong", f"observation {i}: eager {_short(e)}, compiled {_short(a)}"
    if len(expected) != len(actual):
        return "wrong", f"{len(expected)} observations in eager, {len(actual)} compiled"
    return "ok", ""


def _is_tensor(v) -> bool:
    return isinstance(v, tuple) and len(v) == 5 and v[0] == "tensor"


def _short(v) -> str:
    if isinstance(v, Raised):
        return f"raised {v.type_name}"
    text = repr(v[1] if isinstance(v, tuple) and len(v) > 1 else v).replace("\n", " ")
    return text[:120]


def tiny_compiler(backend: str, **kw) -> Callable:
    def C(fn):
        return tinydynamo.compile(fn, backend=backend, **kw)
    return C


def torch_compiler(backend: str, **kw) -> Callable:
    def C(fn):
        return torch.compile(fn, backend=backend, **kw)
    return C


def eager_compiler(fn):
    return fn


def run_one(run_case: Callable, target: str, backend: str) -> tuple[str, str]:
    """Classify one case for ``target`` ("tiny" or "torch") and ``backend``."""
    expected = observe(run_case, eager_compiler)
    if target == "tiny":
        tinydynamo.reset()
        compiler = tiny_compiler(backend)
    else:
        import logging

        import torch._dynamo

        torch._dynamo.reset()
        logging.getLogger("torch._dynamo").setLevel(logging.ERROR)  # its graph-break warnings
        compiler = torch_compiler(backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        actual = observe(run_case, compiler)
    return classify(expected, actual)


#: (family, case, backend) -> why it is not ok yet (pytest xfails it; the table still counts it)
KNOWN: dict[tuple[str, str, str], str] = {}  # (family, case, backend) -> why it is expected to fail: none now


def check(family: str, name: str, backend: str) -> None:
    """The pytest body of one case: ok against eager, or an expected failure listed in KNOWN."""
    import pytest

    result, detail = run_one(CASES[family][name], "tiny", backend)
    if result != "ok" and (family, name, backend) in KNOWN:
        pytest.xfail(f"{KNOWN[family, name, backend]} ({detail})")
    assert result == "ok", detail


def quiet_fallback_logs() -> None:
    """The table's run expects fallbacks (their reasons are tested elsewhere): keep stderr short."""
    warnings.filterwarnings("ignore", category=EagerFallbackWarning)


def load_all() -> None:
    import importlib

    for mod in ("guards", "mutation", "rng", "autograd"):
        importlib.import_module(f"tests.test_reliability_{mod}")


def table(families: list[str] | None = None, backends=BACKENDS, torch_backends=TORCH_BACKENDS,
          verbose: bool = False) -> str:
    """The per-family table: cases, OK, wrong, raised-where-eager-did-not, for tinydynamo and torch."""
    load_all()
    rows = []
    details = []
    for family in [f for f in families or sorted(CASES) if f in CASES]:
        for target, bks in (("tiny", backends), ("torch", torch_backends)):
            if not bks:
                continue
            counts = collections.Counter()
            for name, fn in CASES[family].items():
                for backend in bks:
                    result, detail = run_one(fn, target, backend)
                    counts[result] += 1
                    if result != "ok":
                        details.append(f"  {target}/{backend} {family}.{name}: {result}: {detail}")
            rows.append((family, "tinydynamo" if target == "tiny" else "torch.compile", "/".join(bks),
                         sum(counts.values()), counts["ok"], counts["wrong"], counts["raised"]))
    if families is None or "faults" in families:
        from tests.test_reliability_faults import fault_outcomes

        c = fault_outcomes()
        rows.append(("faults", "tinydynamo", "aot_eager/tininductor", c["cases"], c["ok"], c["wrong"], c["raised"]))
    head = f"{'family':<10} {'target':<14} {'backends':<28} {'cases':>5} {'ok':>4} {'wrong':>5} {'raised':>6}"
    lines = [head, "-" * len(head)]
    lines += [f"{f:<10} {t:<14} {b:<28} {n:>5} {ok:>4} {w:>5} {r:>6}" for f, t, b, n, ok, w, r in rows]
    if verbose and details:
        lines += ["", "not ok:"] + details
    return "\n".join(lines)


if __name__ == "__main__":  # the cases register into the importable module, not into __main__
    import argparse

    from tests.reliability import quiet_fallback_logs, table as _table

    parser = argparse.ArgumentParser(description="the reliability table: per family, compiled against eager")
    parser.add_argument("families", nargs="*", help="default: every family")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every case that is not ok")
    parser.add_argument("--device", default="cpu",
                        help="cuda: the GPU subset (every case's tensors are made on the GPU, "
                             "through torch.set_default_device)")
    parser.add_argument("--tiny-only", action="store_true", help="leave out the torch.compile rows")
    args = parser.parse_args()
    quiet_fallback_logs()
    torch.set_default_device(args.device)
    print(f"device: {args.device}")
    print(_table(args.families or None, torch_backends=() if args.tiny_only else TORCH_BACKENDS,
                 verbose=args.verbose))
