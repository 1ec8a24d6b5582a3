"""Run PyTorch's own op test database (OpInfo ``op_db``) through tinydynamo and compare with eager.

For every op and each of its first few CPU sample inputs, ``check_sample`` compiles a function
that calls the op on the sample (its tensors are the function's inputs), runs it, and compares
with eager PyTorch, the oracle:

* outputs: values, dtype and shape of every tensor (non-tensor outputs compared with ``==``);
* gradients: when eager's output requires grad, the compiled output must too (a dropped gradient
  is the failure this sweep looks for), and the gradients of every float input, for the same
  random output gradient, must match (float64 where the op supports it);
* strides are compared and *reported* (``stride`` note) but do not fail a sample: a compiled
  graph returns fresh contiguous buffers where eager returns views (aliasing is checked elsewhere: tests/test_aot_inplace_views.py).

Each sample ends in one of these outcomes (``Result.status``):

``pass``      compiled and matched;
``fallback``  the compiler gave up on the frame/graph with a warning (the reason is kept) and
              the (eager) result matched;
``wrong``     a mismatch: values, dtype, shape, a dropped or wrong gradient. Must never happen;
``error``     the compiled call raised where eager did not. Must never happen either;
``skip``      eager itself cannot run the sample, or the op is random/nondeterministic.

Used by tests/test_opinfo.py (a fixed fast slice) and scripts/opinfo_sweep.py (everything).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import re
import warnings

import torch
import torch.utils._pytree as pytree

import tinydynamo

#: random or uninitialised outputs: not comparable with eager value by value (matched against
#: each dot-separated part of the OpInfo name)
RANDOM_OR_UNINITIALISED = re.compile(
    r"^(bernoulli|normal|rand\w*|\w*dropout\w*|multinomial|uniform|exponential|geometric|cauchy|"
    r"log_normal|poisson|\w*empty\w*|rrelu|\w*lowrank)$")


#: names that match but are deterministic
NOT_RANDOM = {"native_dropout_backward", "signal.windows.exponential",
              "nn.functional.feature_alpha_dropout.without_train"}


def is_random(name: str) -> bool:
    return name not in NOT_RANDOM and any(RANDOM_OR_UNINITIALISED.match(part) for part in name.split("."))


#: the backends the sweep knows; "tininductor_triton" uses Triton kernels (interpreter on CPU)
BACKENDS = ("aot_eager", "tininductor", "tininductor_triton")


@dataclasses.dataclass
class Result:
    op: str
    sample: int
    status: str          # pass | fallback | wrong | error | skip
    reason: str = ""
    notes: list = dataclasses.field(default_factory=list)


def op_by_name(name: str):
    """The OpInfo entry called ``name`` (``name`` or ``name.variant``)."""
    from torch.testing._internal.common_methods_invocations import op_db

    for op in op_db:
        if _full_name(op) == name:
            return op
    raise KeyError(f"no OpInfo named {name!r}")


def _full_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def all_op_names() -> list[str]:
    from torch.testing._internal.common_methods_invocations import op_db

    return [_full_name(op) for op in op_db]


#: where samples are made: "cpu" (C++ kernels, or Triton's interpreter), or "cuda" for the GPU
#: sweep (``scripts/opinfo_sweep.py --device cuda``: real Triton kernels)
DEVICE = os.environ.get("TINY_OPINFO_DEVICE", "cpu")


def pick_dtype(op):
    """float64 where the op supports it (gradients checked precisely), else float32, else any."""
    supported = op.supported_dtypes(DEVICE)
    for dtype in (torch.float64, torch.float32):
        if dtype in supported:
            return dtype
    for dtype in (torch.int64, torch.int32, torch.bool, torch.complex128):
        if dtype in supported:
            return dtype
    return next(iter(supported), None)


def _tolerances(dtype):
    if dtype.is_floating_point and dtype.itemsize == 1:  # float8: bitwise
        return dict(rtol=0, atol=0)
    if dtype == torch.float64 or dtype == torch.complex128:
        return dict(rtol=1e-6, atol=1e-6)
    if dtype in (torch.float16, torch.bfloat16):
        return dict(rtol=1e-2, atol=1e-2)
    return dict(rtol=1e-4, atol=1e-5)


def _clone(tree):
    def one(x):
        if isinstance(x, torch.Tensor):
            return x.detach().clone().requires_grad_(x.requires_grad)
        return x
    return pytree.tree_map(one, tree)


def _call(op, sample_tree, tensors):
    """Rebuild the sample with ``tensors`` in place of its tensor leaves and call the op."""
    leaves, spec = sample_tree
    it = iter(tensors)
    filled = [next(it) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    inp, args, kwargs = pytree.tree_unflatten(filled, spec)
    return op.op(inp, *args, **kwargs)


def _traceable(op, sample):
    """``f(*tensors)`` calling the op on the sample, as plain generated source that tinydynamo
    traces (a pytree rebuild inside the traced function would be a graph break)."""
    names: dict = {"__op": op.op, "__name__": "opinfo_sample"}
    counter = iter(range(10 ** 6))

    def expr(x):
        if isinstance(x, torch.Tensor):
            return f"t{next(counter)}"
        if isinstance(x, list):
            return "[" + "".join(expr(v) + ", " for v in x) + "]"
        if isinstance(x, tuple):
            return "(" + "".join(expr(v) + ", " for v in x) + ")"
        if isinstance(x, dict) and all(isinstance(k, str) and k.isidentifier() for k in x):
            return "dict(" + ", ".join(f"{k}={expr(v)}" for k, v in x.items()) + ")"
        name = f"c{len(names)}"
        names[name] = x
        return name

    call = "__op(" + expr(sample.input) + ", " + "".join(expr(a) + ", " for a in sample.args)
    call += "".join(f"{k}={expr(v)}, " for k, v in sample.kwargs.items()) + ")"
    n = next(counter)
    params = ", ".join(f"t{i}" for i in range(n))
    source = f"def sample_fn({params}):\n    return {call}\n"
    exec(compile(source, f"<opinfo {op.name}>", "exec"), names)
    return names["sample_fn"]


def _backend(backend: str):
    """The backend callable for a sweep backend name."""
    if backend == "tininductor_triton":
        import tininductor
        import tininductor.compile_fx as cfx

        def triton_backend(gm, example_inputs):
            with tininductor.config.patch({"cpu_backend": "triton"}):
                return cfx.compile_fx(gm, example_inputs)

        return triton_backend
    if backend == "tininductor":
        import tininductor
        import tininductor.compile_fx as cfx

        def cpp_backend(gm, example_inputs):
            with tininductor.config.patch({"cpu_backend": "cpp"}):
                return cfx.compile_fx(gm, example_inputs)

        return cpp_backend
    from tinydynamo.backends import lookup_backend

    return lookup_backend(backend)


def _compile(fn, backend: str, graphs: list, dynamic: bool | None = None):
    """``tinydynamo.compile(fn, dynamic=dynamic)`` with ``backend``, appending each graph it
    compiles to ``graphs``."""
    inner = _backend(backend)

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inner(gm, example_inputs)

    return tinydynamo.compile(fn, backend=counting, dynamic=dynamic)


class _PerShapeLog(logging.Handler):
    """Collects AOT autograd's "compiling per concrete shape instead (reason)" warnings: with
    ``dynamic=True`` a graph that could not be compiled symbolically is a fallback too."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons: list[str] = []

    def emit(self, record):
        text = record.getMessage()
        if "per concrete shape" in text:
            self.reasons.append(text)


def _grads(outs, inputs, seed: int):
    """Gradients of ``inputs`` for a fixed random gradient of every differentiable output."""
    diff_outs = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    wanted = [x for x in inputs if x.requires_grad]
    if not diff_outs or not wanted:
        return None
    gen = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype) if o.is_floating_point()
                  else torch.randn(o.shape, generator=gen, dtype=torch.complex128).to(o.dtype) for o in diff_outs]
    return torch.autograd.grad(diff_outs, wanted, cotangents, allow_unused=True)


def _fallback_reason(caught) -> str | None:
    for w in caught:
        text = str(w.message)
        if "failed" in text or "running it eagerly" in text or "running eagerly" in text:
            m = re.search(r"\((\w+): (.*)", text)
            reason = f"{m.group(1)}: {m.group(2)}" if m else text
            return _shorten(reason)
    return None


def _shorten(reason: str) -> str:
    """Group fallback reasons: drop node names, shapes and addresses."""
    reason = reason.split("\n")[0]
    reason = re.sub(r"\(node [^)]*\)", "", reason)
    reason = re.sub(r"0x[0-9a-f]+", "", reason)
    reason = re.sub(r"\[[0-9, ]*\]|\([0-9, ]*\)", "[...]", reason)
    return reason[:160]


@contextlib.contextmanager
def _per_shape_log():
    handler = _PerShapeLog()
    logger = logging.getLogger("tininductor.aot_autograd")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def check_sample(op, sample, index: int, backend: str, check_grad: bool = True, dynamic: bool = False) -> Result:
    """One sample, compiled (``dynamic=True``: with every size symbolic, as ``torch.compile(dynamic=True)``)."""
    name = _full_name(op)
    tree = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    leaves = [x for x in tree[0] if isinstance(x, torch.Tensor)]
    # eager, twice: the oracle, and a check that it is deterministic
    try:
        eager_inputs = _clone(leaves)
        want = _call(op, tree, eager_inputs)
        again = _call(op, tree, _clone(leaves))
    except Exception as e:  # noqa: BLE001  eager cannot run it: nothing to compare with
        return Result(name, index, "skip", f"eager raises {type(e).__name__}")
    want_flat = pytree.tree_leaves(want)
    try:
        torch.testing.assert_close(pytree.tree_leaves(again), want_flat, equal_nan=True, rtol=0, atol=0)
    except Exception:  # noqa: BLE001
        return Result(name, index, "skip", "eager is nondeterministic on this sample")
    if any(isinstance(o, torch.Tensor) and (o.is_sparse or o.layout != torch.strided) for o in want_flat):
        return Result(name, index, "skip", "sparse/non-strided output")

    from tinydynamo.eval_frame import counters

    tinydynamo.reset()
    graphs: list = []
    compiled_fn = _compile(_traceable(op, sample), backend, graphs, dynamic=True if dynamic else None)
    got_inputs = _clone(leaves)
    unsupported = collections.Counter(counters["unsupported"])
    with warnings.catch_warnings(record=True) as caught, _per_shape_log() as per_shape:
        warnings.simplefilter("always")
        try:
            got = compiled_fn(*got_inputs)
        except Exception as e:  # noqa: BLE001
            return Result(name, index, "error", _shorten(f"{type(e).__name__}: {e}"),
                          notes=[f"{type(e).__name__}: {e}"[:2000]])
    fallback = _fallback_reason(caught)
    if fallback is None and per_shape.reasons:
        fallback = "per shape: " + _shorten(per_shape.reasons[0].split("instead (", 1)[-1])
    if fallback is None and not graphs:  # tinydynamo captured nothing: it all ran eagerly
        new = collections.Counter(counters["unsupported"]) - unsupported
        fallback = "tinydynamo: no graph: " + _shorten(next(iter(new), "no tensor op captured"))
    result = Result(name, index, "fallback" if fallback else "pass", fallback or "")
    got_flat = pytree.tree_leaves(got)
    problem = _compare(want_flat, got_flat, result)
    if problem:
        return dataclasses.replace(result, status="wrong", reason=problem)
    if check_grad:
        try:
            want_g = _grads(want_flat, eager_inputs, seed=index)
        except Exception:  # noqa: BLE001  eager has no gradient for it: nothing to compare
            want_g = None
        if want_g is not None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    got_g = _grads(got_flat, got_inputs, seed=index)
                except Exception as e:  # noqa: BLE001
                    return dataclasses.replace(result, status="error",
                                               reason=_shorten(f"backward: {type(e).__name__}: {e}"))
            if got_g is None:
                return dataclasses.replace(result, status="wrong", reason="gradient dropped: no output requires grad")
            for i, (w, g) in enumerate(zip(want_g, got_g)):
                w = torch.zeros_like(got_inputs[i]) if w is None else w
                g = torch.zeros_like(got_inputs[i]) if g is None else g
                try:
                    torch.testing.assert_close(g, w, equal_nan=True, **_tolerances(w.dtype))
                except AssertionError as e:
                    return dataclasses.replace(result, status="wrong",
                                               reason=f"gradient of input {i}: " + _shorten(str(e).split("\n")[0]))
    return result


def _compare(want_flat, got_flat, result: Result) -> str | None:
    if len(want_flat) != len(got_flat):
        return f"{len(got_flat)} outputs, eager has {len(want_flat)}"
    for i, (w, g) in enumerate(zip(want_flat, got_flat)):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                return f"output {i} is {type(g).__name__}, eager's a tensor"
            if g.dtype != w.dtype:
                return f"output {i} dtype {g.dtype}, eager {w.dtype}"
            if g.shape != w.shape:
                return f"output {i} shape {tuple(g.shape)}, eager {tuple(w.shape)}"
            try:
                torch.testing.assert_close(g, w, equal_nan=True, check_stride=False, **_tolerances(w.dtype))
            except AssertionError as e:
                return f"output {i} values: " + _shorten(str(e).split("\n")[0] + " " + str(e).split("\n")[2:4].__str__())
            if w.requires_grad and not g.requires_grad:
                return f"output {i}: gradient dropped (eager's output requires grad, the compiled one does not)"
            if w.numel() > 1 and g.stride() != w.stride():
                result.notes.append(f"stride: output {i} {g.stride()} vs eager {w.stride()}")
        elif not isinstance(g, torch.Tensor) and g != w and not (g != g and w != w):
            return f"output {i} = {g!r}, eager {w!r}"
    return None


def run_op(name: str, backend: str, max_samples: int = 3, check_grad: bool = True,
           dynamic: bool = False) -> list[Result]:
    """The first ``max_samples`` samples (on :data:`DEVICE`) of OpInfo ``name`` through ``backend``
    (``dynamic``: compiled with ``dynamic=True``, every size a symbol)."""
    op = op_by_name(name)
    if is_random(name) or getattr(op, "is_factory_function", False):
        return [Result(name, -1, "skip", "random, uninitialised or factory op")]
    if name.startswith("jiterator_"):  # CUDA-only test ops whose kernels torch JIT-compiles from a string
        return [Result(name, -1, "skip", "jiterator test op (torch.compile does not trace it either)")]
    dtype = pick_dtype(op)
    if dtype is None:
        return [Result(name, -1, "skip", f"no {DEVICE} dtype")]
    grad = check_grad and op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
    torch.manual_seed(0)
    try:
        samples = list(_first(op.sample_inputs(DEVICE, dtype, requires_grad=grad), max_samples))
    except Exception as e:  # noqa: BLE001
        return [Result(name, -1, "skip", f"sample_inputs raises {type(e).__name__}")]
    return [check_sample(op, s, i, backend, grad, dynamic) for i, s in enumerate(samples)]


def _first(iterable, n):
    for i, x in enumerate(iterable):
        if i >= n:
            return
        yield x


def summarize(results: list[Result]) -> dict:
    """Per-op counts: an op is wrong/error if any sample is, else fallback if any sample fell back."""
    per_op: dict[str, str] = {}
    order = {"wrong": 5, "error": 4, "fallback": 3, "pass": 2, "skip": 1}
    for r in results:
        if order[r.status] > order.get(per_op.get(r.op), 0):
            per_op[r.op] = r.status
    counts = collections.Counter(per_op.values())
    reasons = collections.Counter(r.reason for r in results if r.status == "fallback")
    skips = collections.Counter(r.reason for r in results if r.status == "skip")
    return {"ops": len(per_op), "counts": dict(counts), "fallback_reasons": reasons, "skip_reasons": skips}
