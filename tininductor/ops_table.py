"""The op table: every pointwise op of the ``ops`` protocol, declared once.

One row per op says everything the rest of tininductor needs to know about it:

* ``name`` and ``arity``: what ``ops.<name>(a, b, ...)`` takes (virtualized.py's protocol);
* ``dtype``: how the aten ops lowered to it promote their inputs (PyTorch's
  ``ELEMENTWISE_TYPE_PROMOTION_KIND``): ``"same"`` (DEFAULT: the promoted input dtype),
  ``"float"`` (INT_TO_FLOAT: integers compute in float) or ``"bool"`` (ALWAYS_BOOL: a
  comparison; the result is bool);
* ``triton`` and ``cpp``: how it prints, as format strings over the operands' expressions
  ``{0}``, ``{1}``, ``{2}`` (like tinygrad's renderers; PyTorch's inductor writes one method per
  op in ``TritonOverrides`` / ``CppOverrides`` instead);
* ``aten``: the aten ops lowered to it by the generic pointwise lowering (lowering.py registers
  them from this table). Ops whose aten op needs more than that (``add``'s ``alpha``, ``div``'s
  ``rounding_mode``, ``pow``'s special exponents, ``where``'s three dtypes) have a hand-written
  lowering in lowering.py and list no aten op here.

Driven from this table: the ops protocol (``virtualized.POINTWISE_OPS``, the plain-text
handler), the generic lowerings, ``TritonOverrides.ops`` and ``CPP_OPS``. A kernel backend
declares the table it prints with (``op_formats``) and ``register_backend`` refuses one that
misses an op; tests/test_inductor_ops_table.py fails when a backend table and this one drift.

Adding an op: see "How to add an op" in tininductor/README.md.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One pointwise op of the ops protocol (see the module docstring)."""

    name: str
    arity: int
    dtype: str  # "same" | "float" | "bool"
    triton: str
    cpp: str
    aten: tuple[str, ...] = ()


def _op(name, arity, dtype, triton, cpp, aten=()):
    if isinstance(aten, str):
        aten = tuple(aten.split())
    return OpDef(name, arity, dtype, triton, cpp, aten)


OP_TABLE: tuple[OpDef, ...] = (
    # unary ------------------------------------------------------------------------------------
    _op("neg", 1, "same", "-{0}", "-{0}", "neg"),
    _op("abs", 1, "same", "tl.abs({0})", "std::abs({0})", "abs"),
    _op("exp", 1, "float", "tl.exp({0})", "std::exp({0})", "exp"),
    _op("exp2", 1, "float", "tl.exp2({0})", "std::exp2({0})", "exp2"),
    _op("log", 1, "float", "tl.log({0})", "std::log({0})", "log"),
    _op("log2", 1, "float", "tl.log2({0})", "std::log2({0})", "log2"),
    _op("log1p", 1, "float", "triton_helpers.log1p({0})", "std::log1p({0})", "log1p"),
    _op("expm1", 1, "float", "triton_helpers.expm1({0})", "std::expm1({0})", "expm1"),
    _op("sqrt", 1, "float", "tl.sqrt({0})", "std::sqrt({0})", "sqrt"),
    _op("rsqrt", 1, "float", "tl.rsqrt({0})", "1 / std::sqrt({0})", "rsqrt"),
    _op("reciprocal", 1, "float", "1 / {0}", "1 / {0}", "reciprocal"),
    _op("sin", 1, "float", "tl.sin({0})", "std::sin({0})", "sin"),
    _op("cos", 1, "float", "tl.cos({0})", "std::cos({0})", "cos"),
    _op("tanh", 1, "float", "triton_helpers.tanh({0})", "std::tanh({0})", "tanh"),
    _op("sigmoid", 1, "float", "tl.sigmoid({0})", "1 / (1 + std::exp(-{0}))", "sigmoid"),
    _op("erf", 1, "float", "tl.erf({0})", "std::erf({0})", "erf"),
    _op("sign", 1, "same", "triton_helpers.sign({0})", "tiny_sign({0})", "sign"),
    # a NaN passes through relu, as in eager
    _op("relu", 1, "same", "triton_helpers.maximum({0}, 0)", "({0} < 0 ? 0 : {0})", "relu"),
    _op("floor", 1, "same", "tl.floor({0})", "std::floor({0})", "floor"),
    _op("ceil", 1, "same", "tl.ceil({0})", "std::ceil({0})", "ceil"),
    # logical_not/and/or: lowering.register_logical casts the operands to bool first
    _op("logical_not", 1, "bool", "{0} == 0", "!{0}"),
    _op("bitwise_not", 1, "same", "~{0}", "~{0}"),  # aten.bitwise_not on bool is logical_not
    # binary -----------------------------------------------------------------------------------
    _op("add", 2, "same", "{0} + {1}", "{0} + {1}"),  # aten.add/sub/rsub take an alpha
    _op("sub", 2, "same", "{0} - {1}", "{0} - {1}"),
    _op("mul", 2, "same", "{0} * {1}", "{0} * {1}", "mul"),
    _op("truediv", 2, "float", "{0} / {1}", "{0} / {1}"),  # aten.div takes a rounding_mode
    # integer division; lowerings pass it non-negative operands, where truncation is floor
    _op("floordiv", 2, "same", "{0} // {1}", "tiny_floordiv({0}, {1})"),
    _op("pow", 2, "same", "triton_helpers.pow({0}, {1})", "std::pow({0}, {1})"),
    _op("maximum", 2, "same", "triton_helpers.maximum({0}, {1})", "tiny_max({0}, {1})", "maximum"),
    _op("minimum", 2, "same", "triton_helpers.minimum({0}, {1})", "tiny_min({0}, {1})", "minimum"),
    _op("eq", 2, "bool", "{0} == {1}", "{0} == {1}", "eq"),
    _op("ne", 2, "bool", "{0} != {1}", "{0} != {1}", "ne"),
    _op("lt", 2, "bool", "{0} < {1}", "{0} < {1}", "lt"),
    _op("le", 2, "bool", "{0} <= {1}", "{0} <= {1}", "le"),
    _op("gt", 2, "bool", "{0} > {1}", "{0} > {1}", "gt"),
    _op("ge", 2, "bool", "{0} >= {1}", "{0} >= {1}", "ge"),
    _op("logical_and", 2, "bool", "{0} & {1}", "{0} && {1}"),
    _op("logical_or", 2, "bool", "{0} | {1}", "{0} || {1}"),
    _op("bitwise_and", 2, "same", "{0} & {1}", "{0} & {1}", "bitwise_and"),
    _op("bitwise_or", 2, "same", "{0} | {1}", "{0} | {1}", "bitwise_or"),
    # ternary ----------------------------------------------------------------------------------
    _op("where", 3, "same", "tl.where({0}, {1}, {2})", "{0} ? {1} : {2}"),
)

#: name -> OpDef
OPS: dict[str, OpDef] = {op.name: op for op in OP_TABLE}
if len(OPS) != len(OP_TABLE):
    raise RuntimeError("ops_table.OP_TABLE names an op twice")

#: reduction types every kernel backend implements (``ops.reduction(..., reduction_type, ...)``)
REDUCTION_TYPES: tuple[str, ...] = ("sum", "prod", "max", "min")


def formats(backend: str) -> dict[str, str]:
    """op name -> format string for ``backend`` ("triton" or "cpp"): a fresh dict a backend owns."""
    return {op.name: getattr(op, backend) for op in OP_TABLE}


def missing_ops(op_formats) -> list[str]:
    """The ops of the table that a backend's ``op_formats`` lacks (sorted)."""
    return sorted(set(OPS) - set(op_formats))
