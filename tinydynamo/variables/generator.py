"""A generator object made in the frame, run lazily as Python runs it (TorchDynamo's LocalGeneratorObjectVariable).

Calling a generator function inside a traced frame does not run its body: it makes a generator
whose body runs, in a nested translator sharing the frame's graph, only when someone asks for
a value (``next(gen)``, a ``for`` loop, ``gen.send(v)``), and stops at each ``yield``. So an
infinite generator is fine as long as the caller stops asking, the side effects of the body
happen in the order Python would do them, and ``send`` / ``throw`` / ``close`` reach the body:

* ``send(v)`` makes ``v`` the value of the ``yield`` expression the body is suspended at;
* ``throw(E)`` raises ``E`` at that ``yield`` (the body's ``try`` blocks may catch it);
* ``close()`` throws ``GeneratorExit``: a body that yields again is a RuntimeError.

Rebuilding one after the graph (it is returned, or alive at a graph break) runs its remaining
body to the end at trace time and rebuilds an iterator over the values: allowed only when that
rest of the body changes nothing outside itself (no side effect, no in-place tensor op), else
the frame cannot be compiled that way (a clean ``Unsupported``).

Layer: beside objects, above iter (a generator is a lazy iterator) and exceptions.
"""
from __future__ import annotations

import dis
import types

from tinydynamo import config
from tinydynamo.exc import ObservedException, Unsupported, raise_observed, unimplemented
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.exceptions import ExceptionVariable
from tinydynamo.variables.iter import LazyIteratorVariable
from tinydynamo.variables.lists import ListIteratorVariable
from tinydynamo.variables.misc import GetAttrVariable

#: the generator methods traced (attribute reads of these give a bound method)
GENERATOR_METHODS = ("send", "throw", "close", "__next__", "__iter__")


def exception_of(tx, value) -> ObservedException:
    """The exception ``gen.throw(value)`` raises: an exception class, or an exception raised in the frame."""
    exc = getattr(value, "exc", None)
    if isinstance(exc, ObservedException):
        return exc
    if value.is_python_constant():
        cls = value.as_python_constant()
        if isinstance(cls, type) and issubclass(cls, BaseException):
            return ObservedException(cls)
    unimplemented(f"throwing {value} into a generator (an exception class or a caught exception is needed)")


class LocalGeneratorObjectVariable(LazyIteratorVariable):
    """A generator object created by calling a generator function in the frame; ``tracer`` runs its body."""

    def __init__(self, tracer, name: str):
        super().__init__(iter(()), name)
        self.gen = self  # lazy: its items are not known up front (see ``materialize``)
        self.tracer = tracer
        tracer.generator = self
        self.started = self.finished = self.running = False
        self.steps = 0  # instructions of the body run so far (a graph break checks it did not move)
        self.return_value = None  # the body's return value (``yield from`` evaluates to it)
        self.output = tracer.output
        self.output.generators.append(self)

    def python_type(self):
        return types.GeneratorType

    # ---- running the body -----------------------------------------------------------------------------
    def resume(self, sent=None, exc: ObservedException | None = None):
        """Run the body until its next ``yield`` (that value) or its end (None; ``return_value`` is set).
        ``sent`` is the value of the suspended ``yield``; ``exc`` is raised there instead."""
        if self.running:
            raise_observed(ValueError, "generator already executing")
        if self.finished:
            if exc is not None:
                raise exc
            return None
        tx = self.tracer
        if not self.started:
            if sent is not None and not (sent.is_python_constant() and sent.as_python_constant() is None):
                raise_observed(TypeError, "can't send non-None value to a just-started generator")
            self.started = True
            if exc is not None:  # thrown in before the body started: it never runs
                self.finished = True
                raise exc
        elif exc is not None:
            if not self._throw_at_yield(exc):
                return self._yielded()
        else:
            tx.push(sent if sent is not None else ConstantVariable(None))
        return self._run()

    def _throw_at_yield(self, exc: ObservedException) -> bool:
        """Raise ``exc`` at the suspended ``yield`` (delegated first to a ``yield from`` sub-iterator).
        False when a sub-generator yielded instead (``tx.yielded`` holds it)."""
        tx = self.tracer
        sub = tx.yield_from
        if sub is not None:
            if not isinstance(sub, LocalGeneratorObjectVariable):
                unimplemented(f"throwing into a generator suspended in `yield from` {sub}")
            try:
                value = sub.resume(exc=exc)
            except ObservedException as e:
                exc = e  # the sub-generator did not handle it: raised in this body, at the yield
            else:
                if value is not None:
                    tx.yielded = value
                    return False
                tx.finish_yield_from(sub.return_value)  # the sub-generator returned: `yield from` is done
                return True
        tx.yield_from = None
        self.running = True
        try:
            handled = tx.handle_observed_exception(tx.yield_inst, exc)
        finally:
            self.running = False
        if not handled:
            self.finished = True
            raise exc
        return True

    def _run(self):
        tx = self.tracer
        tx.yielded = None
        self.running = True
        try:
            while tx.return_value is None and tx.yielded is None:
                self.steps += 1
                tx.step()
        except ObservedException as e:
            self.finished = True
            if issubclass(e.exc_type, StopIteration):  # PEP 479: a StopIteration leaving the body
                raise ObservedException(RuntimeError, "generator raised StopIteration") from e
            raise
        except Unsupported:
            self.finished = True
            raise
        finally:
            self.running = False
        return self._yielded()

    def _yielded(self):
        tx = self.tracer
        if tx.yielded is not None:
            value, tx.yielded = tx.yielded, None
            return value
        self.finished = True
        self.return_value = tx.return_value
        return None

    # ---- the iterator protocol (FOR_ITER, next(), list(), ...) ------------------------------------------
    def next_item(self):
        if self.gen is None:  # materialized: an iterator over the values computed then
            return ListIteratorVariable.next_item(self)
        item = self.resume()
        if item is not None:
            self.items.append(item)
            self.index = len(self.items)
        return item

    def close(self):
        if not self.started or self.finished:
            self.started = self.finished = True
            return ConstantVariable(None)
        sub = self.tracer.yield_from
        if isinstance(sub, LocalGeneratorObjectVariable):
            self.tracer.yield_from = None
            sub.close()
        try:
            value = self.resume(exc=ObservedException(GeneratorExit))
        except ObservedException as e:
            if issubclass(e.exc_type, (GeneratorExit, StopIteration)):
                return ConstantVariable(None)
            raise
        if value is not None:
            raise_observed(RuntimeError, "generator ignored GeneratorExit")
        return ConstantVariable(None)

    def cleanup_pending(self) -> bool:
        """Suspended inside a ``try`` / ``with`` (here or in a ``yield from`` sub-generator): closing it,
        as CPython does when it is freed, would run code (``finally``, ``except GeneratorExit``)."""
        if not self.started or self.finished or self.gen is None or self.tracer.yield_inst is None:
            return False
        sub = self.tracer.yield_from
        if isinstance(sub, LocalGeneratorObjectVariable) and sub.cleanup_pending():
            return True
        offset = self.tracer.yield_inst.offset
        return any(e.start <= offset < e.end for e in dis.Bytecode(self.tracer.code).exception_entries)

    def var_getattr(self, tx, name):
        if name in GENERATOR_METHODS:
            return GetAttrVariable(self, name)
        if name in ("gi_running", "gi_suspended"):
            return ConstantVariable(self.running if name == "gi_running" else self.started and not self.finished
                                    and not self.running)
        return super().var_getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if kwargs:
            unimplemented(f"generator.{name}() with keyword arguments")
        if name == "__iter__" and not args:
            return self
        if name == "__next__" and not args:
            return self._value_or_stop(self.next_item())
        if name == "send" and len(args) == 1:
            return self._value_or_stop(self.resume(sent=args[0]))
        if name == "throw" and len(args) == 1:
            return self._value_or_stop(self.resume(exc=exception_of(tx, args[0])))
        if name == "close" and not args:
            return self.close()
        return super().call_method(tx, name, args, kwargs)

    def _value_or_stop(self, value):
        if value is None:  # StopIteration(return value): ``e.value`` is what the body returned
            ret = self.return_value
            raise ExceptionVariable.create(StopIteration, [] if ret is None or ret.is_python_constant()
                                           and ret.as_python_constant() is None else [ret]).exc
        self.items.append(value)
        self.index = len(self.items)
        return value

    # ---- after the graph -------------------------------------------------------------------------------
    def materialize(self) -> None:
        """Run the rest of the body now and keep its values (to rebuild an iterator over them), if that
        rest changes nothing outside the generator; else Unsupported."""
        if self.gen is None:
            return
        effects = self.output.side_effects.effect_count
        nodes = len(self.output.graph.nodes)
        rest = []
        while True:
            item = self.resume()
            if item is None:
                break
            rest.append(item)
            if len(rest) > config.max_instructions:
                unimplemented(f"rebuilding the endless generator {self.name} after the graph")
        new_nodes = list(self.output.graph.nodes)[nodes:]
        if self.output.side_effects.effect_count != effects or any(n.meta.get("mutates_args") for n in new_nodes):
            unimplemented(f"cannot rebuild the generator {self.name} after the graph: the rest of its body "
                          "mutates state (it would run too early)")
        self.items, self.index, self.gen = rest, 0, None

    def unpack_var_sequence(self, tx):
        if self.gen is None:
            return ListIteratorVariable.unpack_var_sequence(self, tx)
        return super().unpack_var_sequence(tx)

    def reconstruct(self, codegen) -> str:
        self.materialize()  # one generator object, however many places hold it
        return codegen.shared(self, lambda: f"(___x for ___x in {ListIteratorVariable.iter_expr(self, codegen)})")

    def __repr__(self) -> str:
        return f"LocalGeneratorObjectVariable({self.name})"


def reaches(root, target, seen: set | None = None) -> bool:
    """Whether tracker ``target`` is ``root`` or reachable from it through trackers' attributes and
    containers (a generator returned inside a tuple, stored on an object, in a list...)."""
    seen = set() if seen is None else seen
    if root is target:
        return True
    if id(root) in seen:
        return False
    seen.add(id(root))
    if isinstance(root, (list, tuple)):
        return any(reaches(v, target, seen) for v in root)
    if isinstance(root, dict):
        return any(reaches(v, target, seen) for v in (*root.keys(), *root.values()))
    if hasattr(root, "__dict__") and type(root).__module__.startswith("tinydynamo.variables"):
        return any(reaches(v, target, seen) for k, v in vars(root).items() if k not in ("tracer", "output"))
    return False


def close_dead_generators(tx, return_value) -> None:
    """At the frame's return: a generator made in it, suspended inside a ``try`` / ``with`` and not
    returned or stored anywhere, is freed by CPython as the frame ends, which closes it (its
    ``finally`` runs). Do the same in the trace (for one made by the frame itself), so its effects
    are seen; one made by an inlined function is closed earlier by CPython, when that function
    returns: not modelled, the frame is not compiled."""
    escaping = [return_value, *tx.output.side_effects.pending.values()]
    for gen in list(tx.output.generators):
        if not gen.cleanup_pending() or reaches(escaping, gen):
            continue
        if gen.tracer.depth != tx.depth + 1:
            unimplemented(f"the generator {gen.name}, made in an inlined function and suspended in a "
                          "try/with block, is freed (and closed) when that function returns")
        gen.close()
