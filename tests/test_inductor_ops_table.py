"""The op table (tininductor/ops_table.py) and everything driven by it stay in step."""
import string

import pytest
import torch

from tininductor import lowering, ops_table, virtualized
from tininductor.codegen import common
from tininductor.codegen.cpp import CPP_OPS, CppScheduling
from tininductor.codegen.triton import TritonOverrides, TritonScheduling
from tininductor.virtualized import PlainTextHandler, V, ops

TABLE = set(ops_table.OPS)


@pytest.mark.parametrize("name, table", [("triton", TritonOverrides.ops), ("cpp", CPP_OPS)])
def test_backend_tables_have_exactly_the_ops_of_the_table(name, table):
    assert sorted(set(table) - TABLE) == [], f"{name} prints ops the op table lacks"
    assert ops_table.missing_ops(table) == [], f"{name} cannot print ops of the table"


def test_backends_implement_every_reduction_type():
    from tininductor.codegen.cpp import CPP_REDUCTIONS

    assert set(ops_table.REDUCTION_TYPES) <= set(TritonOverrides.reductions)
    assert set(ops_table.REDUCTION_TYPES) <= set(CPP_REDUCTIONS)


def test_registered_backends_declare_the_table():
    assert TritonScheduling.op_formats is TritonOverrides.ops
    assert CppScheduling.op_formats is CPP_OPS


@pytest.mark.parametrize("op", ops_table.OP_TABLE, ids=lambda op: op.name)
def test_format_strings_use_every_operand(op):
    for fmt in (op.triton, op.cpp):
        used = {int(f[1]) for f in string.Formatter().parse(fmt) if f[1] is not None}
        assert used == set(range(op.arity)), (op.name, fmt)
    assert op.dtype in ("same", "float", "bool")


def test_protocol_lists_come_from_the_table():
    assert set(virtualized.UNARY_OPS) | set(virtualized.BINARY_OPS) | {"where"} == TABLE
    assert TABLE <= virtualized.ALL_OPS
    with V.set_ops_handler(PlainTextHandler()):
        with pytest.raises(AttributeError, match="ops_table.py"):
            ops.not_an_op("a")
        for op in ops_table.OP_TABLE:
            assert getattr(ops, op.name)(*"abc"[: op.arity]).startswith(op.name + "(")


@pytest.mark.parametrize("op", [op for op in ops_table.OP_TABLE if op.aten], ids=lambda op: op.name)
def test_aten_targets_lower_to_their_op(op):
    for target in op.aten:
        assert lowering.lookup(getattr(torch.ops.aten, target)) is not None, target


def test_register_backend_refuses_a_backend_missing_ops():
    class Partial:
        op_formats = {k: v for k, v in TritonOverrides.ops.items() if k not in ("exp", "where")}

    with pytest.raises(TypeError, match=r"\['exp', 'where'\]"):
        common.register_backend("test_device", Partial)

    class Undeclared:
        pass

    with pytest.raises(TypeError, match="op_formats"):
        common.register_backend("test_device", Undeclared)
    assert "test_device" not in common.backends


# ------------------------------------------------------------------ composite lowerings
COMPOSITES = {
    "softmax": (torch.ops.aten._softmax, lambda x, w, b: torch.softmax(x, -1)),
    "log_softmax": (torch.ops.aten._log_softmax, lambda x, w, b: torch.log_softmax(x, -1)),
    "layer_norm": (torch.ops.aten.native_layer_norm,
                   lambda x, w, b: torch.nn.functional.layer_norm(x, (8,), w, b)),
    "gelu": (torch.ops.aten.gelu, lambda x, w, b: torch.nn.functional.gelu(x)),
    "gelu_tanh": (torch.ops.aten.gelu, lambda x, w, b: torch.nn.functional.gelu(x, approximate="tanh")),
    "silu": (torch.ops.aten.silu, lambda x, w, b: torch.nn.functional.silu(x)),
}


@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_composite_ops_are_decompositions_and_kernels_keep_their_name(name, backend):
    """softmax, layer_norm, gelu ... are defined once, as decompositions, and have no lowering; the
    decomposed graph records the op each node came from, so with ``descriptive_names="original_aten"``
    the one fused kernel is still named after the op written (what chapters 7 and 8 print)."""
    from tininductor import config
    from tininductor.compile_fx import compile_fx_inner
    from tininductor.decompositions import DECOMPOSITIONS, decompose
    from tininductor.graph import op_name
    from tininductor.testing import patch_config

    target, fn = COMPOSITES[name]
    assert target in DECOMPOSITIONS and target not in lowering.lowerings
    args = [torch.randn(4, 8), torch.randn(8), torch.randn(8)]
    with torch.no_grad(), patch_config(config, fallback_to_eager=False, cpu_backend=backend,
                                       descriptive_names="original_aten"):
        compiled = compile_fx_inner(decompose(torch.fx.symbolic_trace(fn), args), args)
    out = compiled(*args)
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, fn(*args))
    assert len(compiled.kernels) == 1 and f"_fused_{op_name(target)}_0" in compiled.kernels[0], compiled.kernels


@pytest.mark.parametrize("name", ["gelu_tanh", "layer_norm", "softmax"])
def test_decomposition_lowering_lowers_an_op_through_its_decomposition(name):
    """``decomposition_lowering(op)`` is a lowering built from the op's decomposition: registered
    for the op, a graph that keeps the op (traced without decomposing) lowers it, with no fallback."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tininductor import config
    from tininductor.compile_fx import compile_fx_inner
    from tininductor.decompositions import decomposition_lowering
    from tininductor.testing import patch_config

    target, fn = COMPOSITES[name]
    overload = target.default
    args = [torch.randn(4, 8), torch.randn(8), torch.randn(8)]
    with torch.no_grad():
        gm = make_fx(fn)(*args)
    assert overload in [n.target for n in gm.graph.nodes]
    with torch.no_grad(), patch_config(config, fallback_to_eager=False, cpu_backend="cpp"), \
            lowering.lowerings.swap({overload: decomposition_lowering(overload)}):
        compiled = compile_fx_inner(gm, args)
    assert compiled.fallback_reasons == [] and len(compiled.kernels) == 1
    out = compiled(*args)
    torch.testing.assert_close(out[0] if isinstance(out, (list, tuple)) else out, fn(*args))


# ------------------------------------------------------------------ ops added by one table row
@pytest.mark.parametrize("backend", ["cpp", "triton"])
@pytest.mark.parametrize("fn", [torch.exp2, torch.log2], ids=lambda f: f.__name__)
def test_table_only_ops_match_eager(fn, backend):
    """exp2 and log2 exist only as rows of the op table: that alone lowers them on both backends."""
    from tininductor import config
    from tininductor.compile_fx import compile_fx_inner
    from tininductor.decompositions import decompose
    from tininductor.testing import patch_config

    def f(x, i):
        return fn(x) * 2, fn(i)

    x = torch.cat([torch.randn(20) * 4, torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan")])])
    i = torch.arange(-3, 9)
    with torch.no_grad(), patch_config(config, fallback_to_eager=False, cpu_backend=backend):
        compiled = compile_fx_inner(decompose(torch.fx.symbolic_trace(f), [x, i]), [x, i])
        out = compiled(x, i)
    assert compiled.fallback_reasons == []
    for got, want in zip(out, f(x, i)):
        torch.testing.assert_close(got, want, equal_nan=True)
