"""SideEffects: mutations of objects from outside the frame, recorded while tracing, replayed after the graph.

A traced function may change Python state that outlives it: ``xs.append(y)`` on an argument
list, ``cache["k"] = t`` on a global dict, ``self.count += 1``, ``global STEP; STEP = 3``. The
graph cannot hold such effects, and running them at trace time would do them once, when
compiling, instead of on every call. So, as TorchDynamo's ``side_effects.py`` does, the
OutputGraph owns a ``SideEffects`` tracker:

* while tracing, the VariableTracker of a mutated list/dict is changed in place, and attribute
  and global stores are kept here, so later reads in the same frame see the new state;
* one VariableTracker per real mutable object (``id_to_variable``), so two ways of reaching the
  same list (``self.items`` twice) share its pending contents;
* after the graph runs, the compiled frame replays the final state of everything mutated, in
  the order the objects were first changed (see :meth:`codegen_update_mutated`)::

      ___o = ___compiled_fn(L['x'])
      ___s0 = L['xs']
      ___s0[:] = [___o[0], ___o[1]]           # xs.append(y); xs.append(z)
      setattr(___s1, 'count', 4)              # self.count += 1
      ___s2.__dict__.pop('cache', None)       # del self.cache
      G['STEP'] = 3

Sources are read into temporaries (``___s0``) before any replayed store, so a store that
rebinds ``self.items`` cannot change which object a later line refers to.

At a graph break the translator rolls the instruction back (:meth:`checkpoint` /
:meth:`restore`): effects recorded by a half-traced call are undone, and the call then runs
natively, exactly once, after the effects recorded before it were replayed.
"""
from __future__ import annotations

from typing import Any

from tinydynamo.codegen import PyCodegen
from tinydynamo.exc import Unsupported, unimplemented
from tinydynamo.variables.base import DELETED, VariableTracker
from tinydynamo.variables.dicts import DictVariable, key_code
from tinydynamo.variables.tensor import TensorVariable


class SideEffects:
    def __init__(self, output):
        self.output = output
        self.id_to_variable: dict[int, VariableTracker] = {}  # real list/dict -> its one tracker
        self._keepalive: list[Any] = []  # the real objects behind those ids (ids stay unique)
        self.seen_objects: dict[int, tuple[Any, Any]] = {}  # id -> (user object, its first source)
        self._real: dict[int, Any] = {}  # id(tracker) -> the real list/dict
        # pending effects, in order of each target's first change:
        #   ("items", id(var)) -> var              a list/dict from outside whose contents changed
        #   ("attr", id(obj), name) -> (obj_var, name, value, obj)
        #   ("global", id(f_globals), name) -> (root, name, value)
        self.pending: dict[tuple, Any] = {}
        self._journal: list[tuple[VariableTracker, Any, int]] = []  # (var, old items, old version)
        self._journaled: set[int] = set()
        self._pending_saved: dict | None = None
        self.effect_count = 0  # effects recorded so far (a generator rebuilt after the graph checks none ran)
        # real objects the trace made itself (a deep copy folded at trace time): nothing outside the trace
        # holds them, so the trace changes them in place and nothing is replayed (see :meth:`track_private`)
        self._private: dict[int, Any] = {}

    # ---- one tracker per real object ---------------------------------------------------------------
    def track_object_existing(self, value: Any, source, build) -> VariableTracker:
        """The tracker of a real list/dict reached through ``source`` (built by ``build()`` once).

        Reached again through another source, it is the same tracker, so pending contents are
        seen; the second source gets an ALIAS_MATCH guard (the next call must alias the same way).
        """
        var = self.id_to_variable.get(id(value))
        if var is None:
            var = build()
            self.id_to_variable[id(value)] = var
            self._keepalive.append(value)
            self._real[id(var)] = value
        elif var.source is not None and source is not None and var.source.name() != source.name():
            self.output.add_guard("ALIAS_MATCH", source, (var.source, True))
        return var

    def real_object(self, var: VariableTracker) -> Any:
        """The real list/dict/set from outside the frame that ``var`` tracks, else None."""
        return self._real.get(id(var))

    def track_object_seen(self, value: Any, source) -> None:
        """A plain Python object reached through ``source`` (see :meth:`install_alias_guards`)."""
        if id(value) not in self.seen_objects:
            self.seen_objects[id(value)] = (value, source)

    def install_alias_guards(self) -> None:
        """The trace assumed that distinct objects stay distinct: a list appended to through ``a`` did
        not change ``b``. Guard that (``a is not b``) for every mutated object against the other
        objects of its type the frame read; an aliased call then recompiles instead of replaying a
        wrong trace. (Objects met as the same object already share one tracker + ALIAS_MATCH.)"""
        seen = [(value, var.source) for value, var in zip(self._keepalive, self.id_to_variable.values())]
        seen += list(self.seen_objects.values())
        targets = [(self._real.get(id(entry)), entry.source) for key, entry in self.pending.items() if key[0] == "items"]
        targets += [(entry[3], entry[0].source) for key, entry in self.pending.items()
                    if key[0] == "attr" and entry[0].source is not None]  # (a tensor the graph made is new)
        done = set()
        for value, source in targets:
            for other, other_source in seen:
                if other is value or type(other) is not type(value) or other_source is None:
                    continue
                pair = frozenset((source.name(), other_source.name()))
                if pair not in done:
                    done.add(pair)
                    self.output.add_guard("ALIAS_MATCH", source, (other_source, False))

    def track_private(self, value: Any) -> None:
        """``value`` was made at trace time by the trace itself (``copy.deepcopy`` of an object, folded):
        no other reference to it exists, so its attributes are set and deleted on it directly while
        tracing. It is rebuilt after the graph only if it could be (it cannot: it has no source), so an
        object that escapes the frame stays a graph break, as any sourceless object does."""
        self._private[id(value)] = value

    def is_private(self, value: Any) -> bool:
        return self._private.get(id(value)) is value

    # ---- recording -----------------------------------------------------------------------------------
    def mutation(self, var: VariableTracker) -> None:
        """Call before changing ``var.items`` in place: journals the old contents (for rollback)
        and, for a list/dict from outside the frame, schedules its new contents for replay."""
        if id(var) not in self._journaled:
            self._journaled.add(id(var))
            old = dict(var.items) if isinstance(var.items, dict) else list(var.items)
            self._journal.append((var, old, var.version))
        self.effect_count += 1
        var.version += 1
        if var.source is not None:
            self.pending.setdefault(("items", id(var)), var)

    def store_attr(self, obj_var: VariableTracker, obj: Any, name: str, value: VariableTracker) -> None:
        """``obj.name = value`` on a real object from outside the frame (reached via ``obj_var``)."""
        if obj_var.source is None and not isinstance(obj_var, TensorVariable):  # (a graph output otherwise)
            unimplemented(f"setting attribute {name!r} on {obj_var}, which has no source to replay it on")
        self._check_replayable(value, f"setting attribute {name!r}")
        self.effect_count += 1
        self.pending[("attr", id(obj), name)] = (obj_var, name, value, obj)

    def delete_attr(self, obj_var: VariableTracker, obj: Any, name: str) -> None:
        """``del obj.name`` on a real object from outside the frame: later reads in the frame find no
        instance attribute (:data:`DELETED`), and the deletion is replayed after the graph."""
        if obj_var.source is None:
            unimplemented(f"deleting attribute {name!r} of {obj_var}, which has no source to replay it on")
        self.effect_count += 1
        self.pending[("attr", id(obj), name)] = (obj_var, name, DELETED, obj)

    def load_attr(self, obj_var: VariableTracker, obj: Any, name: str) -> VariableTracker | None:
        """The value stored earlier in this frame by ``obj.name = ...``, if any (:data:`DELETED` after
        ``del obj.name``)."""
        entry = self.pending.get(("attr", id(obj), name))
        if entry is None:
            return None
        stored_on = entry[0].source
        if obj_var.source is not None and stored_on is not None and obj_var.source.name() != stored_on.name():
            self.output.add_guard("ALIAS_MATCH", obj_var.source, (stored_on, True))
        return entry[2]

    def store_global(self, f_globals: dict, name: str, value: VariableTracker) -> None:
        """``global name; name = value`` in the frame (or an inlined function of another module)."""
        self._check_replayable(value, f"assigning global {name!r}")
        root = self.output.scope.globals_root(f_globals)  # "G", or "___G1" for another module
        self.effect_count += 1
        self.pending[("global", id(f_globals), name)] = (root, name, value)

    def load_global(self, f_globals: dict, name: str) -> VariableTracker | None:
        entry = self.pending.get(("global", id(f_globals), name))
        return None if entry is None else entry[2]

    def _check_replayable(self, value: VariableTracker, what: str) -> None:
        """Fail at the store (a clean graph break there) if ``value`` could not be rebuilt after the graph."""
        try:
            value.reconstruct(PyCodegen(self.output))  # a scratch codegen: only asks "could you?"
        except Unsupported as e:
            unimplemented(f"{what}: the value cannot be rebuilt after the graph ({e.reason})")

    def is_empty(self) -> bool:
        return not self.pending

    # ---- rollback of a half-traced instruction at a graph break ---------------------------------------
    def checkpoint(self) -> None:
        """Start a new undo log (the translator calls it before each instruction that may break)."""
        self._journal.clear()
        self._journaled.clear()
        self._pending_saved = dict(self.pending)

    def restore(self) -> None:
        """Undo every change since :meth:`checkpoint`: the instruction will run natively instead."""
        for var, old, version in reversed(self._journal):
            var.items = old
            var.version = version
        self._journal.clear()
        self._journaled.clear()
        if self._pending_saved is not None:
            self.pending = self._pending_saved

    # ---- codegen -------------------------------------------------------------------------------------
    def codegen_update_mutated(self, codegen) -> list[str]:
        """Python lines that replay the pending effects after the graph ran (final states, in order)."""
        self.install_alias_guards()
        lines = []
        for key, entry in self.pending.items():
            if key[0] == "items":
                target = entry.reconstruct(codegen)
                if isinstance(entry, DictVariable):
                    lines.append(f"{target}.clear()")
                    if entry.items:
                        lines.append(f"{target}.update({entry.literal(codegen)})")
                elif isinstance(entry.items, dict):  # a set: its elements are the keys
                    new = ", ".join(key_code(codegen, k) for k in entry.items)
                    lines.append(f"{target}.clear()")
                    if entry.items:
                        lines.append(f"{target}.update(({new},))")
                else:
                    lines.append(f"{target}[:] = [{', '.join(v.reconstruct(codegen) for v in entry.items)}]")
            elif key[0] == "attr":
                obj_var, name, value, _ = entry
                if value is DELETED:  # (a pop: the attribute may not have existed before the frame set it)
                    lines.append(f"{obj_var.reconstruct(codegen)}.__dict__.pop({name!r}, None)")
                else:
                    lines.append(f"setattr({obj_var.reconstruct(codegen)}, {name!r}, {value.reconstruct(codegen)})")
            else:
                root, name, value = entry
                lines.append(f"{root}[{name!r}] = {value.reconstruct(codegen)}")
        return lines
