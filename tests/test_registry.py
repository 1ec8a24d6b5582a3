"""The registries: one keying rule for tininductor's op tables, one swap for every registry."""
import pytest
import torch

from tininductor import lowering, vjp_rules
from tininductor.decompositions import DECOMPOSITIONS, decompose
from tininductor.registry import OpRegistry, lookup, overload_table
from tinydynamo import eval_frame, guards, symbolic_convert
from tinydynamo.registry import swap

aten = torch.ops.aten


def _packet_fn(*a):
    return "packet"


def _overload_fn(*a):
    return "overload"


# ------------------------------------------------------------------ the keying rule
def test_packet_registration_is_found_by_an_overload_lookup():
    reg = OpRegistry("test")
    reg.register(aten.add)(_packet_fn)
    assert list(reg) == [aten.add]  # stored as registered
    for name in aten.add.overloads():
        overload = getattr(aten.add, name)
        assert overload in reg and reg[overload] is _packet_fn and reg.get(overload) is _packet_fn
    assert aten.mul.Tensor not in reg and reg.get(aten.mul.Tensor) is None
    with pytest.raises(KeyError):
        reg[aten.mul.Tensor]


def test_an_overload_registration_wins_over_its_packet():
    reg = OpRegistry("test")
    reg.register(aten.add.Tensor)(_overload_fn)
    reg.register(aten.add)(_packet_fn)  # registered after: still loses for add.Tensor
    assert reg[aten.add.Tensor] is _overload_fn
    assert reg[aten.add.Scalar] is _packet_fn
    table = reg.overload_table()
    assert table[aten.add.Tensor] is _overload_fn and table[aten.add.Scalar] is _packet_fn


def test_the_rule_reads_a_plain_dict_too():
    """A learner's ``{**REGISTRY, op: fn}`` is a plain dict: the module-level functions read it alike."""
    table = {aten.add: _packet_fn, aten.add.Tensor: _overload_fn}
    assert lookup(table, aten.add.Tensor) is _overload_fn
    assert lookup(table, aten.add.Scalar) is _packet_fn
    assert lookup(table, aten.mul.Tensor, "none") == "none"
    assert overload_table(table)[aten.add.Tensor] is _overload_fn


def test_register_refuses_what_is_not_an_aten_op():
    with pytest.raises(TypeError, match="torch.ops.aten.add"):
        OpRegistry("test").register("add")


def test_make_fx_gets_an_overload_keyed_table():
    table = DECOMPOSITIONS.overload_table()
    assert table and all(isinstance(op, torch._ops.OpOverload) for op in table)
    for key, fn in DECOMPOSITIONS.items():  # every registered key reaches make_fx as its overloads
        overloads = [getattr(key, n) for n in key.overloads()] if isinstance(key, torch._ops.OpOverloadPacket) else [key]
        assert all(table[o] is DECOMPOSITIONS[o] for o in overloads)
    # and tracing still decomposes through it: addmm (registered) becomes mm + add
    gm = decompose(lambda b, x, w: torch.addmm(b, x, w), [torch.randn(3), torch.randn(2, 4), torch.randn(4, 3)])
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.addmm.default not in targets and aten.mm.default in targets


def test_the_three_op_tables_share_the_rule():
    """Drift test: decompositions, lowerings and VJP rules are all OpRegistry, read by one rule."""
    for reg in (DECOMPOSITIONS, lowering.lowerings, vjp_rules.VJP_RULES):
        assert type(reg) is OpRegistry
        assert all(isinstance(k, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) for k in reg), reg.name
    # the public readers go through it: an overload swapped in wins over the packet's entry
    assert aten.mul in lowering.lowerings and aten.mul in vjp_rules.VJP_RULES
    with lowering.lowerings.swap({aten.mul.Tensor: _overload_fn}), vjp_rules.VJP_RULES.swap({aten.mul.Tensor: _overload_fn}):
        assert lowering.lookup(aten.mul.Tensor) is _overload_fn
        assert vjp_rules.get_vjp(aten.mul.Tensor) is _overload_fn
        assert lowering.lookup(aten.mul.Scalar) is not _overload_fn
    assert lowering.lookup(aten.mul.Tensor) is not _overload_fn
    assert vjp_rules.get_vjp(aten.mul.Tensor) is not _overload_fn


# ------------------------------------------------------------------ the swap
def test_swap_restores_on_exit_including_absence():
    reg = {"a": 1, "b": 2}
    with swap(reg, {"a": 10, "c": 30}) as inside:
        assert inside is reg and reg == {"a": 10, "b": 2, "c": 30}
        reg["d"] = 4  # registered inside the block under another key: kept
    assert reg == {"a": 1, "b": 2, "d": 4}


def test_swap_restores_on_exception():
    reg = OpRegistry("test")
    reg.register(aten.add)(_packet_fn)
    with pytest.raises(RuntimeError, match="boom"):
        with reg.swap({aten.add: _overload_fn, aten.add.Tensor: _overload_fn}):
            assert reg[aten.add.Scalar] is _overload_fn
            raise RuntimeError("boom")
    assert dict(reg) == {aten.add: _packet_fn}  # the absent overload entry is gone again


def test_swap_of_an_overload_keeps_the_packet_entry_and_adds_no_other():
    """Swap compares keys exactly: the packet fallback must not turn into a stored overload entry."""
    reg = OpRegistry("test")
    reg.register(aten.add)(_packet_fn)
    with reg.swap({aten.add.Tensor: _overload_fn}):
        assert reg[aten.add.Tensor] is _overload_fn and reg[aten.add.Scalar] is _packet_fn
    assert dict(reg) == {aten.add: _packet_fn}


def test_swap_refuses_what_is_not_a_dict():
    with pytest.raises(TypeError, match="registry dict"):
        with swap([1, 2], {0: 3}):
            pass


@pytest.mark.parametrize("use, registry, key", [
    (lambda fn: symbolic_convert.use_handlers(NOT_AN_OPCODE=fn), symbolic_convert.OPCODE_HANDLERS, "NOT_AN_OPCODE"),
    (lambda fn: symbolic_convert.use_handlers(BINARY_OP=fn), symbolic_convert.OPCODE_HANDLERS, "BINARY_OP"),
    (lambda fn: guards.use_check_codegen(fn), guards._codegen, "generate"),
    (lambda fn: eval_frame.use_cache_lookup(fn), eval_frame._lookup, "fn"),
])
def test_the_use_helpers_are_swaps(use, registry, key):
    """Every ``use_*`` helper of the course restores its registry like :func:`swap`, on error too."""
    before = dict(registry)
    with pytest.raises(RuntimeError):
        with use(_overload_fn):
            assert registry[key] is _overload_fn
            raise RuntimeError
    assert registry == before


def test_use_guard_kind_replaces_part_of_a_kind_and_restores_it():
    before = guards.GUARD_KINDS["CONSTANT_MATCH"]
    with guards.use_guard_kind("CONSTANT_MATCH", code=_overload_fn):
        now = guards.GUARD_KINDS["CONSTANT_MATCH"]
        assert now.code is _overload_fn and now.failure is before.failure
    assert guards.GUARD_KINDS["CONSTANT_MATCH"] is before


# ------------------------------------------------------------------ drift
REGISTRIES = "OPCODE_HANDLERS|GUARD_KINDS|_codegen|_lookup|lowerings|DECOMPOSITIONS|VJP_RULES|BUILTIN_HANDLERS"


def test_registries_are_written_only_by_registration_or_swap():
    """An entry is registered at import (``register_*``, module-level code) or swapped with
    :func:`swap`: no code that runs later (a function body, a test) writes a registry by hand,
    where a restore could be forgotten or an absent key put back as present."""
    import ast
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    write = re.compile(rf"\b({REGISTRIES})(\[[^]]+\]\s*=[^=]|\.(update|pop|setdefault|clear)\()|setitem\([^,]*\b({REGISTRIES})\b")
    # the registration decorators (run at import) and swap itself
    allowed = {"register_opcode", "register_guard_kind", "_handler", "swap"}
    found = []
    for folder in ("tinydynamo", "tininductor", "course", "solutions", "exercises", "tests", "notebooks"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.name == "test_registry.py":
                continue
            text = path.read_text()
            if not write.search(text):
                continue
            tree = ast.parse(text)  # top-level functions and methods (a nested one is checked with its parent)
            defs = [n for top in tree.body for n in ([top] + (top.body if isinstance(top, ast.ClassDef) else []))]
            for fn in defs:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name not in allowed:
                    body = "\n".join(text.splitlines()[fn.lineno - 1:fn.end_lineno])
                    if write.search(body):
                        found.append(f"{path.relative_to(root)}:{fn.name}")
    assert found == [], f"registries written by hand (use tinydynamo.registry.swap): {found}"
