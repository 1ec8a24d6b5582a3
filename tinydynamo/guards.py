"""Guards: the facts a compiled graph assumed, checked before every cached call.

A :class:`Guard` has a kind (``TENSOR_MATCH``, ``TYPE_MATCH``, ``ID_MATCH``, ...), a
:class:`~tinydynamo.source.Source` (``L['x']``) and the expected value. Each kind lives in the
``GUARD_KINDS`` registry with two halves:

* ``code(guard, ref, scope)``: Python condition(s) over ``ref`` (the local variable holding the
  source's value); :class:`GuardBuilder` joins all of them into ONE generated function, so a
  cache hit costs a handful of attribute reads and comparisons, and nothing else;
* ``failure(guard, value)``: the reason in words when the guard fails, or ``None``. Only the
  slow path (a cache miss, for the recompile log) calls it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import operator
import struct
import weakref
from typing import Any, Callable, Iterator

import torch
from torch.nn.modules import module as module_mod

from tinydynamo import config, registry
from tinydynamo.registry import swap
from tinydynamo.source import AttrSource, GetItemSource, Source, SourceScope, source_reader


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """What TENSOR_MATCH pins down about a tensor. A dynamic dim (a symbol in the fake value) is
    ``None`` in ``size``/``stride``: its value is left to the SHAPE_ENV relations."""

    type: type
    dtype: torch.dtype
    device: torch.device
    size: tuple[int | None, ...]
    stride: tuple[int | None, ...]
    requires_grad: bool
    #: an empty tensor with the same dispatch keys, type, dtype, device and requires_grad: what
    #: torch's C++ tensor check (``TensorGuards``) compares a value with. ``None`` where no such
    #: template can be made (a tensor subclass, a conjugate or sparse tensor...): Python checks it.
    template: torch.Tensor | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, t: torch.Tensor, fake: torch.Tensor | None = None) -> "TensorMeta":
        size, stride = tuple(t.shape), tuple(t.stride())
        if fake is not None:  # keep only the static entries (a symbol the trace specialised is static)
            def symbolic(s) -> bool:
                return isinstance(s, torch.SymInt) and s.node.maybe_as_int() is None

            size = tuple(None if symbolic(s) else v for s, v in zip(fake.shape, size))
            stride = tuple(None if symbolic(s) else v for s, v in zip(fake.stride(), stride))
        return cls(type(t), t.dtype, t.device, size, stride, t.requires_grad, _template_of(t))


def _template_of(t: torch.Tensor) -> torch.Tensor | None:
    """An empty stand-in for ``t`` that torch's C++ tensor check sees as ``t`` (same dispatch keys,
    Python type, dtype, device, requires_grad), or ``None`` if this tensor needs the Python check.
    Sizes and strides are not taken from it: the check is given them as lists."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout is not torch.strided:
        return None
    with torch.inference_mode(t.is_inference()):
        e = torch.empty(0, dtype=t.dtype, device=t.device)
    if type(t) is torch.nn.Parameter:
        e = torch.nn.Parameter(e, requires_grad=t.requires_grad)
    elif t.requires_grad:
        e.requires_grad_(True)
    return e if torch._C._dispatch_keys(e) == torch._C._dispatch_keys(t) else None


@dataclasses.dataclass(frozen=True)
class Guard:
    kind: str
    source: Source | None  # None for global state (GRAD_MODE)
    expected: Any = None

    @property
    def name(self) -> str:
        return self.source.name() if self.source is not None else "<global state>"

    def readable(self) -> str:
        return GUARD_KINDS[self.kind].readable(self)

    def __str__(self) -> str:
        return f"{self.kind:<16} {self.readable()}"


@dataclasses.dataclass
class GuardKind:
    """One kind of guard: how to check it fast, and how to say why it failed."""

    code: Callable[[Guard, str, SourceScope], list[str]]
    failure: Callable[[Guard, Any], str | None]
    readable: Callable[[Guard], str]


GUARD_KINDS: dict[str, GuardKind] = {}


def register_guard_kind(kind: str, code, failure, readable) -> None:
    GUARD_KINDS[kind] = GuardKind(code, failure, readable)


@contextlib.contextmanager
def use_guard_kind(kind: str, code=None, failure=None, readable=None) -> Iterator[None]:
    """Temporarily replace parts of a guard kind (the course plugs a learner's guard in this way): a
    :func:`~tinydynamo.registry.swap` of ``GUARD_KINDS``."""
    saved = GUARD_KINDS[kind]
    with swap(GUARD_KINDS, {kind: GuardKind(code or saved.code, failure or saved.failure, readable or saved.readable)}):
        yield


def _tname(t: type) -> str:
    return t.__qualname__ if t.__module__ in ("builtins",) else f"{t.__module__}.{t.__qualname__}"


# ---- TENSOR_MATCH ----------------------------------------------------------------------------

def _tensor_code(g: Guard, ref: str, scope: SourceScope) -> list[str]:
    m: TensorMeta = g.expected
    return [
        f"type({ref}) is {scope.constant(m.type, 't')}",
        f"{ref}.dtype is {scope.constant(m.dtype, 'dt')}",
        _device_check(ref, m.device, scope),
        *_sizes_check(f"{ref}.shape", m.size),
        *_sizes_check(f"{ref}.stride()", m.stride),
        f"{ref}.requires_grad is {m.requires_grad!r}",
    ]


def _sizes_check(expr: str, sizes: tuple) -> list[str]:
    """``x.shape == (6, 8)``; with dynamic dims (None) the rank and each static entry only."""
    if None not in sizes:
        return [f"{expr} == {sizes!r}"]
    return [f"len({expr}) == {len(sizes)}"] + [f"{expr}[{i}] == {s}" for i, s in enumerate(sizes) if s is not None]


def _device_check(ref: str, device: torch.device, scope: SourceScope) -> str:
    """The cheapest exact device test: ``is_cpu`` for CPU, ``is_cuda`` + index for CUDA."""
    if device.type == "cpu":
        return f"{ref}.is_cpu"
    if device.type == "cuda" and device.index is not None:
        return f"{ref}.is_cuda and {ref}.get_device() == {device.index}"
    return f"{ref}.device == {scope.constant(device, 'dev')}"


def _tensor_failure(g: Guard, v: Any) -> str | None:
    m: TensorMeta = g.expected
    if type(v) is not m.type:
        return f"{g.name} type mismatch: expected {_tname(m.type)}, actual {_tname(type(v))}"
    if v.dtype != m.dtype:
        return f"tensor {g.name} dtype mismatch: expected {m.dtype}, actual {v.dtype}"
    if v.device != m.device:
        return f"tensor {g.name} device mismatch: expected {m.device}, actual {v.device}"
    if v.dim() != len(m.size):
        return f"tensor {g.name} rank mismatch: expected {len(m.size)}, actual {v.dim()}"
    for i, (e, a) in enumerate(zip(m.size, v.shape)):
        if e is not None and e != a:
            return f"tensor {g.name} size mismatch at index {i}: expected {e}, actual {a}"
    for i, (e, a) in enumerate(zip(m.stride, v.stride())):
        if e is not None and e != a:
            return f"tensor {g.name} stride mismatch at index {i}: expected {e}, actual {a}"
    if v.requires_grad != m.requires_grad:
        return f"tensor {g.name} requires_grad mismatch: expected {m.requires_grad}, actual {v.requires_grad}"
    if m.template is not None and torch._C._dispatch_keys(v) != torch._C._dispatch_keys(m.template):
        return (f"tensor {g.name} dispatch keys mismatch (an inference tensor, a conjugate view...): "
                f"expected {torch._C._dispatch_keys(m.template)}, actual {torch._C._dispatch_keys(v)}")
    return None


def _tensor_readable(g: Guard) -> str:
    m: TensorMeta = g.expected
    return (f"check_tensor({g.name}, {_tname(m.type)}, {m.dtype}, device={str(m.device)!r}, "
            f"requires_grad={m.requires_grad}, size={list(m.size)}, stride={list(m.stride)})")


register_guard_kind("TENSOR_MATCH", _tensor_code, _tensor_failure, _tensor_readable)

# ---- TYPE_MATCH / ID_MATCH / NN_MODULE ------------------------------------------------------

register_guard_kind(
    "TYPE_MATCH",
    lambda g, ref, scope: [f"type({ref}) is {scope.constant(g.expected, 't')}"],
    lambda g, v: None if type(v) is g.expected
    else f"{g.name} type mismatch: expected {_tname(g.expected)}, actual {_tname(type(v))}",
    lambda g: f"type({g.name}) is {_tname(g.expected)}",
)


def _short(obj: Any) -> str:
    text = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
    return f"<{text} at {hex(id(obj))}>"


register_guard_kind(
    "ID_MATCH",
    lambda g, ref, scope: [f"{ref} is {scope.constant(g.expected, 'obj')}"],
    lambda g, v: None if v is g.expected
    else f"{g.name} is a different object: expected {_short(g.expected)}, actual {_short(v)}",
    lambda g: f"{g.name} is {_short(g.expected)}",
)

def _deref(expected: Any) -> Any:
    """A guard's expected object, kept as a weak reference where it is one (a module: compiled code must
    not keep the user's modules alive; once the module is gone the guard fails)."""
    return expected() if isinstance(expected, weakref.ref) else expected


class ModuleRef(weakref.ref):
    """An NN_MODULE guard's expected module: a weak reference (compiled code must not keep the
    user's modules alive; once the module is gone the guard fails) that keeps the module's name
    (``<Linear at 0x...>``) for failure messages, whether or not the module has been freed."""

    __slots__ = ("description", "module_type")

    def __new__(cls, module):
        ref = super().__new__(cls, module)
        ref.description = _short(module)
        ref.module_type = type(module)
        return ref


#: ``frame_state`` key: the sources at which a frame met another module of the same class
UNSPECIALIZED_MODULES = "unspecialized_modules"


def note_replaced_modules(check_fn: "CheckFunction", L: dict, G: dict, frame_state: dict) -> None:
    """After a miss: the sources of NN_MODULE guards that now hold another module of the same class.

    A frame compiled for one module is pinned to it; a module made anew for every call
    (``deepcopy(self.net)``, a model built inside the step) or a second instance passed to the same
    function would compile again at every call and, for the first kind, soon reach the recompile
    limit. From the next compile on such a source is guarded by its type, and one entry serves every
    module of that class (as TorchDynamo's inlined modules do)."""
    for g in check_fn.guards:
        if g.kind != "NN_MODULE" or not isinstance(g.expected, ModuleRef):
            continue
        try:
            value = check_fn.scope.evaluate(g.source, L, G)
        except Exception:  # noqa: BLE001 - not readable now: another kind of miss
            continue
        if value is not g.expected() and type(value) is g.expected.module_type:
            frame_state.setdefault(UNSPECIALIZED_MODULES, set()).add(g.source.name())


def is_unspecialized_module(source, frame_state: dict | None) -> bool:
    """Whether the module at ``source`` (or at a source it is read through) is guarded by type, not
    identity. Its parameters are graph inputs read from their sources at every call, its plain
    attributes are guarded by value and its submodules by type: nothing compiled depends on which
    object it is."""
    names = frame_state.get(UNSPECIALIZED_MODULES) if frame_state else None
    while names and source is not None:
        if source.name() in names:
            return True
        source = getattr(source, "base", None)
    return False


def _expected_module(g) -> str:
    return g.expected.description if isinstance(g.expected, ModuleRef) else _short(_deref(g.expected))


register_guard_kind(
    "NN_MODULE",
    lambda g, ref, scope: ([f"{ref} is {scope.constant(g.expected, 'mod')}()"] if isinstance(g.expected, weakref.ref)
                           else [f"{ref} is {scope.constant(g.expected, 'mod')}"]),
    lambda g, v: None if v is _deref(g.expected)
    else f"module {g.name} was replaced: expected {_expected_module(g)}, actual {_short(v)}",
    lambda g: f"{g.name} is {_expected_module(g)}  # the module (and so its parameters' owner)",
)

# ---- CONSTANT_MATCH --------------------------------------------------------------------------


def float_bits(x: float) -> int:
    """The IEEE-754 bits of a float: ``-0.0`` and ``0.0`` differ (``1 / x`` gives ``-inf`` and
    ``inf``), and a NaN equals itself (``nan == nan`` is False). A float specialised into a graph is
    guarded by its bits wherever ``==`` would confuse them."""
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _needs_bits(x: float) -> bool:
    return x == 0.0 or x != x  # signed zeros and NaNs: == is not identity of the value


def same_constant(a: Any, b: Any) -> bool:
    """Whether a specialised constant ``b`` may stand for ``a``: the same type and value, with floats
    compared as their bits where ``==`` would mislead (signed zeros, NaNs)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return float_bits(a) == float_bits(b)
    if type(a) is complex:
        return float_bits(a.real) == float_bits(b.real) and float_bits(a.imag) == float_bits(b.imag)
    return a is b or a == b


def _const_code(g: Guard, ref: str, scope: SourceScope) -> list[str]:
    v = g.expected
    if v is None or v is True or v is False or v is Ellipsis:
        return [f"{ref} is {v!r}"]
    exact = _exact_const_code(v, ref, scope)
    if type(v) in _IMMUTABLE_CONSTANTS:
        # the object the trace read (a module's ``eps``, a stride entry) is usually still the one
        # there: one identity test, and the exact test only for another object (an immutable
        # object is equal to itself in every way the exact test looks at, bits included)
        return [f"{ref} is {scope.constant(v, 'c')} or {' and '.join(exact)}"]
    return exact


_IMMUTABLE_CONSTANTS = (int, float, str, bytes, complex)


def _exact_const_code(v: Any, ref: str, scope: SourceScope) -> list[str]:
    """The exact test of a constant: its type, then its value (bits where ``==`` would mislead)."""
    if type(v) is float and _needs_bits(v):
        return [f"type({ref}) is float", f"{scope.constant(float_bits, 'fn')}({ref}) == {float_bits(v)}"]
    if type(v) is complex and (_needs_bits(v.real) or _needs_bits(v.imag)):
        return [f"type({ref}) is complex",
                f"{scope.constant(same_constant, 'fn')}({ref}, {scope.constant(v, 'c')})"]
    if type(v) in (int, float, str, bytes, complex):
        return [f"type({ref}) is {type(v).__name__}", f"{ref} == {v!r}"]
    return [f"type({ref}) is {scope.constant(type(v), 't')}", f"{ref} == {scope.constant(v, 'c')}"]


def _const_failure(g: Guard, v: Any) -> str | None:
    e = g.expected
    if not same_constant(e, v):
        return f"{g.name} == {e!r} failed: actual {v!r}"
    return None


register_guard_kind("CONSTANT_MATCH", _const_code, _const_failure, lambda g: f"{g.name} == {g.expected!r}")

# ---- SEQUENCE_LENGTH / DICT_KEYS ---------------------------------------------------------------

register_guard_kind(
    "SEQUENCE_LENGTH",
    lambda g, ref, scope: [f"type({ref}) is {g.expected[0].__name__}", f"len({ref}) == {g.expected[1]}"],
    lambda g, v: (f"{g.name} type mismatch: expected {g.expected[0].__name__}, actual {_tname(type(v))}"
                  if type(v) is not g.expected[0] else
                  None if len(v) == g.expected[1] else f"len({g.name}) == {g.expected[1]} failed: actual {len(v)}"),
    lambda g: f"type({g.name}) is {g.expected[0].__name__} and len({g.name}) == {g.expected[1]}",
)

# ---- TUPLE_MATCH: a tuple of constants, one guard (made from SEQUENCE_LENGTH + CONSTANT_MATCHes) -


def _tuple_code(g: Guard, ref: str, scope: SourceScope) -> list[str]:
    """The tuple object the trace read (a convolution's ``stride``) is usually still the one there:
    one identity test; another tuple must be equal with every element of the same type (``(1, 1)``
    is not ``(True, 1)``)."""
    value = g.expected
    types = tuple(map(type, value))
    types = _TYPE_TUPLES.setdefault(types, types)  # one constant per pattern, (int, int)
    return [f"{ref} is {scope.constant(value, 'c')} or type({ref}) is tuple and {ref} == {value!r}"
            f" and tuple(map(type, {ref})) == {scope.constant(types, 'c')}"]


_TYPE_TUPLES: dict[tuple, tuple] = {}


register_guard_kind(
    "TUPLE_MATCH",
    _tuple_code,
    lambda g, v: None if type(v) is tuple and v == g.expected and tuple(map(type, v)) == tuple(map(type, g.expected))
    else f"{g.name} == {g.expected!r} failed: actual {v!r}",
    lambda g: f"{g.name} == {g.expected!r}",
)

#: constants a TUPLE_MATCH compares with ``==`` and their types (no floats: -0.0 == 0.0, nan != nan)
_PLAIN_CONSTANTS = (int, bool, str, bytes, type(None))


def frame_value_reader(scope: SourceScope, L: dict, G: dict) -> Callable[[Source], Any]:
    """``source -> the value it had in the traced frame`` (each evaluated once): what the passes
    over the finished guard list (:func:`share_aliased_objects`, :func:`merge_constant_tuples`) look at."""
    namespace = {**scope.names, "L": L, "G": G}
    values: dict[str, Any] = {}

    def value_of(source: Source) -> Any:
        key = source.name()
        if key not in values:
            values[key] = eval(source.code(), namespace)
        return values[key]

    return value_of


def merge_constant_tuples(guards: list[Guard], value_of: Callable[[Source], Any]) -> list[Guard]:
    """A tuple whose length and every element are guarded as constants (a convolution's
    ``stride``, ``padding``, ``dilation``: three guards each) becomes one ``TUPLE_MATCH``: on a
    cached call the module still holds the same tuple object, and one identity test covers it."""
    elements: dict[str, dict[int, Guard]] = {}
    for g in guards:
        if g.kind == "CONSTANT_MATCH" and isinstance(g.source, GetItemSource) and type(g.source.index) is int \
                and type(g.expected) in _PLAIN_CONSTANTS:
            elements.setdefault(g.source.base.name(), {})[g.source.index] = g
    merged: dict[int, Guard] = {}  # id(SEQUENCE_LENGTH guard) -> its TUPLE_MATCH
    dropped: set[int] = set()
    for g in guards:
        if g.kind != "SEQUENCE_LENGTH" or g.expected[0] is not tuple:
            continue
        items = elements.get(g.source.name(), {})
        if sorted(items) != list(range(g.expected[1])):  # an element not read, or not a plain constant
            continue
        try:
            value = value_of(g.source)  # the object itself: the identity fast path
        except Exception:
            continue
        if type(value) is not tuple or tuple(items[i].expected for i in range(len(value))) != value:
            continue
        merged[id(g)] = Guard("TUPLE_MATCH", g.source, value)
        dropped.update(id(e) for e in items.values())
    return [merged.get(id(g), g) for g in guards if id(g) not in dropped]


register_guard_kind(
    "LENGTH",
    lambda g, ref, scope: [f"len({ref}) == {g.expected}"],
    lambda g, v: None if len(v) == g.expected else f"len({g.name}) == {g.expected} failed: actual {len(v)}",
    lambda g: f"len({g.name}) == {g.expected}",
)


def _dict_keys_code(g: Guard, ref: str, scope: SourceScope) -> list[str]:
    dict_type, keys = g.expected
    t = "dict" if dict_type is dict else scope.constant(dict_type, "t")
    return [f"type({ref}) is {t}", f"list({ref}) == {list(keys)!r}"]


def _dict_keys_failure(g: Guard, v: Any) -> str | None:
    dict_type, keys = g.expected
    if type(v) is not dict_type:
        return f"{g.name} type mismatch: expected {_tname(dict_type)}, actual {_tname(type(v))}"
    if list(v) != list(keys):
        return f"{g.name} keys changed: expected {list(keys)}, actual {list(v)}"
    return None


register_guard_kind("DICT_KEYS", _dict_keys_code, _dict_keys_failure,
                    lambda g: f"list({g.name}.keys()) == {list(g.expected[1])!r}")

# ---- HASATTR / DICT_CONTAINS: presence and ABSENCE of an attribute or key ----------------------
# ``getattr(obj, "flag", False)`` on an absent attribute, or a method found on the class (an
# instance attribute of that name would shadow it), depends on something NOT being there.


register_guard_kind(
    "HASATTR",
    lambda g, ref, scope: [f"hasattr({ref}, {g.expected[0]!r}) is {g.expected[1]!r}"],
    lambda g, v: None if hasattr(v, g.expected[0]) == g.expected[1]
    else f"{g.name}.{g.expected[0]} {'was deleted' if g.expected[1] else 'now exists'} "
         f"(expected {'present' if g.expected[1] else 'absent'})",
    lambda g: f"hasattr({g.name}, {g.expected[0]!r}) is {g.expected[1]}",
)

register_guard_kind(
    "DICT_CONTAINS",
    lambda g, ref, scope: [f"{g.expected[0]!r} {'in' if g.expected[1] else 'not in'} {ref}"],
    lambda g, v: None if (g.expected[0] in v) == g.expected[1]
    else f"{g.expected[0]!r} {'is no longer' if g.expected[1] else 'is now'} in {g.name} "
         f"(expected {'present' if g.expected[1] else 'absent'})",
    lambda g: f"({g.expected[0]!r} in {g.name}) is {g.expected[1]}",
)

# ---- ALIAS_MATCH: two sources are (or are not) the same object --------------------------------


def _alias_code(g: Guard, ref: str, scope: SourceScope, other_ref: str | None = None) -> list[str]:
    other, same = g.expected
    return [f"{ref} {'is' if same else 'is not'} {other_ref or other.code()}"]


register_guard_kind(
    "ALIAS_MATCH",
    _alias_code,
    lambda g, v: f"aliasing changed: {g.name} {'is' if g.expected[1] else 'is not'} {g.expected[0].name()} "
                 "no longer holds",
    lambda g: f"{g.name} {'is' if g.expected[1] else 'is not'} {g.expected[0].name()}",
)

# ---- GRAD_MODE (global state) -------------------------------------------------------------------

register_guard_kind(
    "GRAD_MODE",
    lambda g, ref, scope: [f"{scope.constant(torch.is_grad_enabled, 'fn')}() is {g.expected!r}"],
    lambda g, v: None if torch.is_grad_enabled() == g.expected
    else f"grad mode changed: expected {'enabled' if g.expected else 'disabled'}, actual "
         f"{'enabled' if torch.is_grad_enabled() else 'disabled'}",
    lambda g: f"torch.is_grad_enabled() is {g.expected}",
)


register_guard_kind(
    "DEFAULT_DTYPE",
    lambda g, ref, scope: [f"{scope.constant(torch.get_default_dtype, 'fn')}() is {scope.constant(g.expected, 'dt')}"],
    lambda g, v: None if torch.get_default_dtype() == g.expected
    else f"default dtype changed: expected {g.expected}, actual {torch.get_default_dtype()}",
    lambda g: f"torch.get_default_dtype() is {g.expected}",
)


# ---- REGISTRY_GENERATION: compiled with the registries' entries of now --------------------------
# An entry that serves any module of a class (guarded by type) is not reused after a registry
# swap began or ended (a learner's decomposition or rule swapped in): a compile under the learner's
# entry must not answer for another model after it, nor an earlier compile inside it.

register_guard_kind(
    "REGISTRY_GENERATION",
    lambda g, ref, scope: [f"{scope.constant(registry, 'registry')}.generation == {g.expected!r}"],
    lambda g, v: None if registry.generation == g.expected
    else f"a registry swap began or ended since the compile (generation {g.expected}, now {registry.generation})",
    lambda g: f"tinydynamo.registry.generation == {g.expected}",
)


# ---- SHAPE_ENV: a relation over input sizes (dynamic shapes, see tinydynamo.symbolic_shapes) ----
# ``2 <= L['x'].size()[1]``, ``L['y'].size()[0] == L['x'].size()[0]``: what torch's ShapeEnv
# recorded while the trace ran on symbolic sizes. One guard per relation (its own line in the logs).

register_guard_kind(
    "SHAPE_ENV",
    lambda g, ref, scope: [f"({g.expected})"],
    lambda g, v: None if v else f"shape guard failed: {g.expected}",  # v: the relation's value
    lambda g: g.expected,
)


# ---- STORAGE_OVERLAP: which tensor inputs share memory (for graphs that write to an input) ----
# A functional graph takes its inputs as independent values; a write to one is then not seen
# through another that shares its memory. TorchDynamo guards duplicate inputs and storage
# overlap; here: the partition of the tensor inputs by storage, as it was at compile time.


def storage_groups(*tensors) -> tuple[int, ...]:
    """``(0, 1, 0)``: the first and third tensors share a storage, the second is alone."""
    ids: dict[int, int] = {}
    return tuple(ids.setdefault(t.untyped_storage().data_ptr() or -i - 1, len(ids)) for i, t in enumerate(tensors))


def _overlap_failure(g: Guard, v: Any) -> str | None:
    sources, expected = g.expected
    return f"tensor inputs {', '.join(s.name() for s in sources)} share memory differently: storage " \
           f"groups {expected} at compile time, now {v}"


register_guard_kind(
    "STORAGE_OVERLAP",
    lambda g, ref, scope: [f"{scope.constant(storage_groups, 'fn')}({', '.join(s.code() for s in g.expected[0])})"
                           f" == {g.expected[1]!r}"],
    _overlap_failure,
    lambda g: f"storage_groups({', '.join(s.name() for s in g.expected[0])}) == {g.expected[1]!r}",
)


# ---- NO_HOOKS: a traced module call assumed no hooks (they would run around forward) ----------
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _global_hook_dicts() -> list:
    return [getattr(module_mod, name) for name in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                                   "_global_backward_hooks", "_global_backward_pre_hooks")
            if hasattr(module_mod, name)]


def _no_hooks_code(g: Guard, ref: str, scope: SourceScope) -> list[str]:
    return [f"not {ref}.{name}" for name in _HOOK_DICTS]


register_guard_kind(
    "NO_HOOKS",
    _no_hooks_code,
    lambda g, v: None if not any(getattr(v, name, None) for name in _HOOK_DICTS)
    else f"module {g.name} has hooks now (registered after it was compiled)",
    lambda g: f"{g.name} has no forward/backward hooks",
)

#: each of a module's four hook dicts, read from its instance dict by a C call (the batched NO_HOOKS check)
_hook_dict_getters = tuple(operator.itemgetter(name) for name in _HOOK_DICTS)


register_guard_kind(  # the module-global hook dicts are mutated in place: hold them as constants
    "NO_GLOBAL_HOOKS",
    lambda g, ref, scope: [f"not {scope.constant(d, 'hooks')}" for d in _global_hook_dicts()],
    lambda g, v: None if not any(_global_hook_dicts())
    else "a global module hook was registered (torch.nn.modules.module.register_module_forward_hook...)",
    lambda g: "no global module hooks",
)


def _tensor_guards(metas: list[TensorMeta]) -> "torch._C._dynamo.guards.TensorGuards":
    """torch's C++ tensor check over many tensors at once (what TorchDynamo's TENSOR_MATCH runs): type,
    dispatch keys, dtype, device, requires_grad, and sizes/strides where they are static (``None``:
    left to the SHAPE_ENV relations). One call checks a whole model's parameters in microseconds,
    where a Python condition per attribute costs about a microsecond per tensor."""
    return torch._C._dynamo.guards.TensorGuards(
        *[m.template for m in metas],
        dynamic_dims_sizes=[list(m.size) for m in metas],
        dynamic_dims_strides=[list(m.stride) for m in metas],
    )


def _cpp_checkable(guards: list[Guard]) -> list[Guard]:
    """The TENSOR_MATCH guards that one C++ call checks (none if the kind's code was swapped, or if
    there are fewer than ``config.cpp_tensor_guards_min``)."""
    if GUARD_KINDS["TENSOR_MATCH"].code is not _tensor_code or config.cpp_tensor_guards_min is None:
        return []
    plain = [g for g in guards if g.kind == "TENSOR_MATCH" and g.expected.template is not None]
    return plain if len(plain) >= config.cpp_tensor_guards_min else []


def _hooks_batchable(guards: list[Guard]) -> list[Guard]:
    """The NO_HOOKS guards checked together in C (none if the kind's code was swapped, or below
    ``config.cpp_tensor_guards_min``: small examples keep their readable per-module conditions)."""
    if GUARD_KINDS["NO_HOOKS"].code is not _no_hooks_code or config.cpp_tensor_guards_min is None:
        return []
    hooks = [g for g in guards if g.kind == "NO_HOOKS"]
    return hooks if len(hooks) >= config.cpp_tensor_guards_min else []


def generate_check_code(guards: list[Guard], scope: SourceScope) -> str:
    """The source of ``___check_guards(L, G)``: every guard's conditions, cheapest path first.

    Each source is read once into a local (``___v0 = L['x']``); a nested source reuses its
    parent's local (``L['self'].fc1`` -> ``___v1``, then ``___v1.weight``). Each guard becomes
    ``if not (<its conditions joined by and>): return False``. A source that no longer exists
    (a shorter list, a missing key or attribute) raises inside: that is a miss too.

    Plain tensors (a model's parameters, mostly) are the exception: their TENSOR_MATCH conditions
    are checked together, last, by one call of torch's C++ ``TensorGuards``, which is what
    TorchDynamo runs for them too. Per tensor that is a fraction of a microsecond instead of six
    Python comparisons, and a ResNet's 300 tensors stop dominating the cached call. A tensor that
    needs more than that check (a subclass) keeps its Python conditions. Likewise the modules'
    NO_HOOKS: ``any(map(itemgetter('_forward_hooks'), dicts)) or ...`` over the tuple of every
    module's ``__dict__`` (read already by its ``'forward' not in m.__dict__`` guard), one loop in C
    per kind of hook (cheaper than one loop building a tuple of the four per module), instead of
    four attribute reads and tests in Python per module.
    """
    body: list[str] = []
    # each source read once, a nested one through its parent's local; module members through dicts
    ref_of = source_reader(body, "___v", through_dicts=True)

    batched: list[tuple[str, Guard]] = []  # tensors checked by one C++ call at the end
    fast = {id(g) for g in _cpp_checkable(guards)}
    no_hooks: list[tuple[str, Guard]] = []  # modules whose hook dicts are checked by C-level loops
    hooks_batched = {id(g) for g in _hooks_batchable(guards)}
    for g in guards:
        ref = ref_of(g.source) if g.source is not None else "None"
        if id(g) in fast:
            batched.append((ref, g))
            continue
        if id(g) in hooks_batched:
            no_hooks.append((ref, g))
            continue
        if g.kind == "ALIAS_MATCH" and GUARD_KINDS[g.kind].code is _alias_code:  # the other source read once too
            conds = _alias_code(g, ref, scope, ref_of(g.expected[0]))
        else:
            conds = GUARD_KINDS[g.kind].code(g, ref, scope)
        body.append(f"# {g.kind}: {g.readable()}")
        body.append(f"if not ({' and '.join(conds)}):")
        body.append("    return False")
    if no_hooks:
        # each module's __dict__: most are read already (its DICT_CONTAINS 'forward' guard)
        dicts = [ref_of(AttrSource(g.source, "__dict__")) for _, g in no_hooks]
        body.append(f"# NO_HOOKS of {len(no_hooks)} modules in C-level loops (any hook dict not empty): "
                    + ", ".join(g.name for _, g in no_hooks[:4]) + (", ..." if len(no_hooks) > 4 else ""))
        body.append(f"___module_dicts = ({', '.join(dicts)},)")
        passes = [f"any(map({scope.constant(getter, 'fn')}, ___module_dicts))" for getter in _hook_dict_getters]
        body.append(f"if {' or '.join(passes)}:")
        body.append("    return False")
    if batched:
        check = scope.constant(_tensor_guards([g.expected for _, g in batched]), "tensor_guards")
        body.append(f"# TENSOR_MATCH of {len(batched)} tensors in one C++ call: "
                    + ", ".join(g.name for _, g in batched[:4]) + (", ..." if len(batched) > 4 else ""))
        body.append(f"if not {check}.check({', '.join(ref for ref, _ in batched)}):")
        body.append("    return False")
    body.append("return True")
    lines = ["def ___check_guards(L, G):", "    try:"]
    lines += [f"        {line}" for line in body]
    lines += ["    except Exception:", "        return False"]
    return "\n".join(lines) + "\n"


_codegen = {"generate": generate_check_code}


@contextlib.contextmanager
def use_check_codegen(fn: Callable[[list[Guard], SourceScope], str]) -> Iterator[None]:
    """Temporarily generate check functions with ``fn`` (the course plugs a learner's version in)."""
    with swap(_codegen, {"generate": fn}):
        yield


class CheckFunction:
    """The compiled guards of one cache entry: ``check(L, G) -> bool``, plus the slow ``failure_reason``
    (PyTorch: ``CheckFunctionManager``'s ``check_fn`` / guard manager)."""

    def __init__(self, guards: list[Guard], scope: SourceScope):
        self.guards = list(guards)
        self.scope = scope
        self.code = self._generate()
        namespace = dict(scope.names)
        exec(compile(self.code, "<tinydynamo guards>", "exec"), namespace)
        self.check: Callable[[dict, dict], bool] = namespace["___check_guards"]

    def _generate(self) -> str:
        return _codegen["generate"](self.guards, self.scope)

    def __call__(self, L: dict, G: dict) -> bool:
        try:
            return self.check(L, G)
        except Exception:  # a check generated without its own try (the course's exercise 3.3)
            return False

    def failure_reason(self, L: dict, G: dict) -> str | None:
        """The first failing guard, in words (``None`` if all pass)."""
        for g in self.guards:
            if g.source is None:
                value = None
            else:
                try:
                    value = self.scope.evaluate(g.source, L, G)
                except Exception as e:
                    return f"{g.name} could not be read: {type(e).__name__}: {e}"
            if g.kind == "ALIAS_MATCH":  # needs two values: ask its own condition
                other = self.scope.evaluate(g.expected[0], L, G)
                reason = None if (value is other) == g.expected[1] else GUARD_KINDS[g.kind].failure(g, value)
            elif g.kind == "SHAPE_ENV":  # a relation over several sources
                try:
                    holds = eval(g.expected, {**self.scope.names, "L": L, "G": G})
                except Exception as e:  # e.g. a modulo by a size that is now 0
                    return f"shape guard {g.expected} raised {type(e).__name__}: {e}"
                reason = GUARD_KINDS[g.kind].failure(g, holds)
            elif g.kind == "STORAGE_OVERLAP":  # over several sources
                groups = storage_groups(*[self.scope.evaluate(src, L, G) for src in g.expected[0]])
                reason = None if groups == g.expected[1] else GUARD_KINDS[g.kind].failure(g, groups)
            else:
                reason = GUARD_KINDS[g.kind].failure(g, value)
            if reason:
                return reason
        return None

    def __str__(self) -> str:
        return self.code


def _guard_key(kind: str, source: Source | None, expected: Any) -> tuple:
    """What makes two guards the same guard (a trace installs many twice)."""
    key = (kind, source.name() if source is not None else "")
    if kind in ("HASATTR", "DICT_CONTAINS"):  # one per (object, name)
        key += (expected[0],)
    elif kind == "ID_MATCH":  # two classes of one name (local classes) are two guards
        key += (id(expected),)
    elif kind == "SHAPE_ENV":  # one per relation
        key += (expected,)
    return key


#: values whose identity says nothing (equal ones are often one object) or that are guarded otherwise
_NOT_SHARED = (type(None), bool, int, float, complex, str, bytes, tuple, frozenset, torch.Tensor,
               torch.dtype, torch.device)


def share_aliased_objects(guards: list[Guard], value_of: Callable[[Source], Any]) -> list[Guard]:
    """Guards on one object reached by several paths, made once (``L['self'].encoder.config`` and
    ``L['self'].encoder.layer[3].attention.config`` are one config object in a Hugging Face model).

    Every source is rewritten through the first path that reached its object: the guards under
    the second path move under the first and merge with the ones already there, and one
    ``ALIAS_MATCH`` (``second is first``) keeps what made that valid. Reading an attribute of one
    object twice gives the same value, so the check is as strict as before; a model whose 24
    attention modules each read ``config._attn_implementation`` checks it once. Only objects
    with an identity of their own count (modules, configs, classes, functions): equal ints,
    strings or tuples are often one object by chance, and tensors have ALIAS_MATCH already."""
    first: dict[int, Source] = {}  # id(object) -> the first source that reached it (values stay alive in value_of)
    canonical: dict[str, Source] = {}  # source name -> the source to read instead
    aliases: list[Guard] = []

    def through_canonical_bases(source: Source) -> Source:
        base = getattr(source, "base", None)
        return source if base is None else dataclasses.replace(source, base=canonical_base(base))

    def canonical_base(source: Source) -> Source:
        """``source`` as a base of other sources: the first path to its object."""
        key = source.name()
        if key not in canonical:
            moved = canonical[key] = through_canonical_bases(source)
            try:
                value = value_of(moved)
            except Exception:  # not readable now (a guard that expects it missing)
                return moved
            if not isinstance(value, _NOT_SHARED):
                seen = first.setdefault(id(value), moved)
                if seen.name() != moved.name():
                    aliases.append(Guard("ALIAS_MATCH", moved, (seen, True)))
                    canonical[key] = seen
        return canonical[key]

    out: dict[tuple, Guard] = {}
    for g in guards:
        if g.kind == "TENSOR_MATCH":  # a tensor is not shared (ALIAS_MATCH covers two paths to one)
            g = dataclasses.replace(g, source=through_canonical_bases(g.source))
        elif g.kind == "ALIAS_MATCH":
            source, (other, same) = through_canonical_bases(g.source), g.expected
            other = through_canonical_bases(other)
            # two paths to one tensor that became one path: nothing left to check
            g = None if same and source.name() == other.name() else Guard(g.kind, source, (other, same))
        elif g.source is not None and g.kind not in ("STORAGE_OVERLAP", "SHAPE_ENV"):
            g = dataclasses.replace(g, source=canonical_base(g.source))
        for kept in ([g] if g is not None else []) + aliases:  # a new ALIAS_MATCH right after the guard that needed it
            out.setdefault(_guard_key(kept.kind, kept.source, kept.expected), kept)
        aliases.clear()
    return list(out.values())


class GuardBuilder:
    """Collects the guards a trace installs (deduplicated, in order) and builds the CheckFunction."""

    def __init__(self, scope: SourceScope):
        self.scope = scope
        self.guards: dict[tuple, Guard] = {}

    def add(self, kind: str, source: Source | None, expected: Any = None) -> None:
        if kind not in GUARD_KINDS:
            raise ValueError(f"unknown guard kind {kind!r}; registered: {sorted(GUARD_KINDS)}")
        self.guards.setdefault(_guard_key(kind, source, expected), Guard(kind, source, expected))

    def replace(self, kind: str, source: Source, expected: Any) -> None:
        """Change what an installed guard expects (in place: its position in the check stays)."""
        key = (kind, source.name())
        self.guards[key] = Guard(kind, source, expected)

    def build(self, frame_values: tuple[dict, dict] | None = None) -> CheckFunction:
        """The check function; given the frame's ``(L, G)``, guards on an object reached by several
        paths are made once (:func:`share_aliased_objects`) and a tuple of constants is one guard
        (:func:`merge_constant_tuples`)."""
        guards = list(self.guards.values())
        if frame_values is not None:
            value_of = frame_value_reader(self.scope, *frame_values)
            if config.share_aliased_guards:
                guards = share_aliased_objects(guards, value_of)
            guards = merge_constant_tuples(guards, value_of)
        return CheckFunction(guards, self.scope)
