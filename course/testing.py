"""Assertions for graded tests whose failures read "yours vs expected", and say where they differ.

The score table (``python -m course.grade``) shows the first line of the failure, so the first
line says what differs and where; later lines give the detail (a diff, the bytecode, the graph).
Tensors are described by shape, dtype and device, and by the first element that differs.
"""
from __future__ import annotations

import contextlib
import difflib
import pprint
from typing import Any, Callable


class Mismatch(AssertionError):
    """A graded check failed: the learner's value differs from the reference."""


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "device")


def describe(value: Any, limit: int = 200) -> str:
    """A short description: tensors by type, shape, dtype, device (never their repr); others by repr."""
    if _is_tensor(value):
        kind = type(value).__name__
        grad = ", requires_grad=True" if getattr(value, "requires_grad", False) else ""
        return f"{kind}(shape={tuple(value.shape)}, dtype={value.dtype}, device={value.device}{grad})"
    if isinstance(value, (list, tuple)) and any(_is_tensor(v) for v in value):
        inner = ", ".join(describe(v, limit) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_difference(yours: Any, expected: Any, path: str = "") -> str | None:
    """Where two values first differ, e.g. ``[2]['x']: yours 3 vs expected 4`` (None if equal)."""
    if _is_tensor(yours) or _is_tensor(expected):
        return _tensor_difference(yours, expected, path)
    if isinstance(yours, dict) and isinstance(expected, dict):
        missing = [k for k in expected if k not in yours]
        extra = [k for k in yours if k not in expected]
        if missing or extra:
            parts = ([f"missing keys {missing!r}"] if missing else []) + ([f"unexpected keys {extra!r}"] if extra else [])
            return f"{path or 'dict'}: " + "; ".join(parts)
        for key in expected:
            found = first_difference(yours[key], expected[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(yours, (list, tuple)) and isinstance(expected, (list, tuple)) and type(yours) is type(expected):
        for i, (a, b) in enumerate(zip(yours, expected)):
            found = first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        if len(yours) != len(expected):
            return f"{path or 'sequence'}: length {len(yours)} vs expected {len(expected)}"
        return None
    if isinstance(yours, str) and isinstance(expected, str) and yours != expected:
        at = next((i for i, (a, b) in enumerate(zip(yours, expected)) if a != b), min(len(yours), len(expected)))
        line = yours.count("\n", 0, at) + 1
        return (f"{path or 'text'}: first difference at character {at} (line {line}): "
                f"yours {yours[max(at - 20, 0):at + 20]!r} vs expected {expected[max(at - 20, 0):at + 20]!r}")
    try:
        equal = bool(yours == expected)
    except Exception:  # noqa: BLE001 - values that cannot even be compared differ
        equal = False
    if equal and type(yours) is not type(expected) and isinstance(expected, (bool, int, float, str)):
        return f"{path or 'value'}: type {type(yours).__name__} vs expected {type(expected).__name__} ({yours!r})"
    if equal:
        return None
    return f"{path or 'value'}: yours {describe(yours)} vs expected {describe(expected)}"


def _tensor_difference(yours: Any, expected: Any, path: str, rtol: float | None = None,
                       atol: float | None = None) -> str | None:
    where = path or "tensor"
    if not (_is_tensor(yours) and _is_tensor(expected)):
        return f"{where}: yours {describe(yours)} vs expected {describe(expected)}"
    for attr in ("shape", "dtype", "device"):
        a, b = getattr(yours, attr), getattr(expected, attr)
        if a != b:
            return f"{where}: {attr} {tuple(a) if attr == 'shape' else a} vs expected {tuple(b) if attr == 'shape' else b}"
    import torch

    a, b = yours.detach().cpu(), expected.detach().cpu()
    if a.is_floating_point() or a.is_complex():
        default_rtol, default_atol = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
                                      torch.float64: (1e-7, 1e-7)}.get(a.dtype, (1.3e-6, 1e-5))
        rtol = default_rtol if rtol is None else rtol
        atol = default_atol if atol is None else atol
        a64, b64 = a.to(torch.complex128 if a.is_complex() else torch.float64), b.to(
            torch.complex128 if b.is_complex() else torch.float64)
        bad = ~((a64 - b64).abs() <= atol + rtol * b64.abs()) & ~(a64.isnan() & b64.isnan()) & ~(a64 == b64)
    else:
        bad = a != b
    if not bool(bad.any()):
        return None
    index = tuple(int(i) for i in bad.nonzero()[0]) if bad.dim() else ()
    count = int(bad.sum())
    return (f"{where} ({describe(yours)}): {count} of {a.numel()} elements differ; first at index {list(index)}: "
            f"yours {a[index].item()!r} vs expected {b[index].item()!r}")


def _diff(yours: Any, expected: Any) -> str:
    """A unified diff of the two values' text (strings as they are, others pretty-printed)."""
    def text(v):
        return v if isinstance(v, str) else pprint.pformat(v, width=100, sort_dicts=False)

    lines = difflib.unified_diff(text(expected).splitlines(), text(yours).splitlines(),
                                 "expected", "yours", lineterm="", n=2)
    return "\n".join(lines)


def expect_equal(yours: Any, expected: Any, what: str, context: str = "") -> None:
    """Fail with ``what: yours X vs expected Y`` and where they first differ, unless ``yours == expected``."""
    try:
        same = yours == expected
        same = bool(same)
    except Exception:  # noqa: BLE001 - e.g. comparing tensors: use the element-wise description
        same = first_difference(yours, expected) is None
    if same:
        return
    where = first_difference(yours, expected)
    short_y, short_e = describe(yours), describe(expected)
    message = f"{what}: yours {short_y} vs expected {short_e}"
    if where and where != f"value: yours {short_y} vs expected {short_e}":
        message += f"\n  first difference at {where}"
    long = not _is_tensor(yours) and (len(repr(yours)) > 60 or "\n" in str(yours))
    if long:
        message += "\n" + _diff(yours, expected)
    raise Mismatch(message + (f"\n{context}" if context else ""))


def expect_close(yours: Any, expected: Any, what: str, context: str = "", **tolerances) -> None:
    """Compare tensors (or nested tuples/lists of them) with ``torch.testing.assert_close``."""
    import torch

    try:
        torch.testing.assert_close(yours, expected, **tolerances)
    except (AssertionError, TypeError, ValueError) as error:
        where = _first_tensor_difference(yours, expected, "", tolerances.get("rtol"), tolerances.get("atol"))
        detail = str(error).strip().splitlines()
        first = next((line.strip() for line in detail if line.strip()), "values differ")
        message = f"{what}: {where}" if where else f"{what}: yours vs expected differ: {first}"
        message += f"\n  yours {describe(yours)}\n  expected {describe(expected)}"
        rest = "\n".join(line for line in detail if line.strip())
        raise Mismatch("\n".join(part for part in (message, rest, context) if part)) from None


def _first_tensor_difference(yours, expected, path, rtol, atol) -> str | None:
    if isinstance(yours, (list, tuple)) and isinstance(expected, (list, tuple)):
        if len(yours) != len(expected):
            return f"{path or 'sequence'}: {len(yours)} items vs expected {len(expected)}"
        for i, (a, b) in enumerate(zip(yours, expected)):
            found = _first_tensor_difference(a, b, f"{path}[{i}]", rtol, atol)
            if found:
                return found
        return None
    if _is_tensor(yours) or _is_tensor(expected):
        return _tensor_difference(yours, expected, path or "output", rtol, atol)
    return first_difference(yours, expected, path)


@contextlib.contextmanager
def calling(what: str):
    """Name the input when the learner's code raises: ``with calling("sum_to_size(grad (2, 3) -> (3,))"):``.

    A bare ``RuntimeError: view size is not compatible`` says nothing about which call failed;
    this turns it into ``sum_to_size(grad (2, 3) -> (3,)) raised RuntimeError: ...``. An
    unfinished stub's own error passes through unchanged (the report says "not done yet").
    """
    from course.loader import is_stub_error

    try:
        yield
    except Mismatch:
        raise
    except Exception as error:  # noqa: BLE001 - any error of the learner's code is reported with its input
        if is_stub_error(error):
            raise
        first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
        raise Mismatch(f"{what} raised {type(error).__name__}: {first}") from error


def expect_raises(exception: type[BaseException], call: Callable[[], Any], what: str, match: str | None = None):
    """Fail with ``what: expected <exception>, but it returned <value>`` (naming the input) unless ``call()``
    raises ``exception`` (whose message matches the regex ``match``, if given); return the error."""
    import re

    from course.loader import is_stub_error

    try:
        value = call()
    except exception as error:
        if is_stub_error(error):  # expect_raises(Exception, ...) must not count an unfinished stub as done
            raise
        if match is not None and not re.search(match, str(error)):
            raise Mismatch(f"{what}: raised {exception.__name__} as expected, but its message {str(error)!r} "
                           f"does not match {match!r}") from error
        return error
    except Exception as error:  # noqa: BLE001
        if is_stub_error(error):
            raise
        raise Mismatch(f"{what}: expected {exception.__name__}, got {type(error).__name__}: {error}") from error
    raise Mismatch(f"{what}: expected {exception.__name__}, but it returned {describe(value)}")


def expect_true(condition: bool, what: str, context: str = "") -> None:
    """Fail with ``what`` unless ``condition`` holds (for properties with no single expected value)."""
    if not condition:
        raise Mismatch(what + (f"\n{context}" if context else ""))


# ---- stack effects of symbolic opcode handlers (chapter 2) ----------------------------------------------
def stack_effect_checked(handlers: dict[str, Callable], effects: dict[str, Callable]) -> dict[str, Callable]:
    """Wrap opcode handlers so that each call checks its stack effect, as the translator needs it.

    ``effects[opname](tx, inst, jumped)`` returns the expected change of ``len(tx.stack)``.
    A handler that reads the top without popping it, or leaves an iterator behind, computes
    the right values in simple code and corrupts the stack of the code around it: this catches
    it at the instruction that did it. Also wraps RETURN_VALUE: the stack must be empty after it.
    """
    from tinydynamo.symbolic_convert import OPCODE_HANDLERS

    def wrap(opname, handler):
        def checked(tx, inst):
            before, ip = len(tx.stack), tx.ip
            handler(tx, inst)
            target = getattr(inst, "target", None)
            if target is not None and tx.ip not in (ip, target):
                raise Mismatch(
                    f"{opname} (line {inst.lineno}, offset {inst.offset}) jumped to instruction {tx.ip}, but its target "
                    f"is instruction {target} (and not jumping continues at {ip})")
            change = len(tx.stack) - before
            want = effects[opname](tx, inst, tx.ip != ip)
            if change != want:
                extra = change - want
                amount = f"{abs(extra)} value(s) too {'many' if extra > 0 else 'few'} left on the stack"
                raise Mismatch(
                    f"{opname} (line {inst.lineno}, offset {inst.offset}) changed the stack depth by {change:+d}, "
                    f"expected {want:+d}: {amount}")
        checked.__name__ = getattr(handler, "__name__", opname)
        return checked

    wrapped = {name: wrap(name, fn) if name in effects else fn for name, fn in handlers.items()}
    original_return = OPCODE_HANDLERS["RETURN_VALUE"]

    def return_value(tx, inst):
        original_return(tx, inst)
        if tx.stack:
            raise Mismatch(
                f"the stack holds {len(tx.stack)} value(s) at the return on line {inst.lineno}: "
                f"{[type(v).__name__ for v in tx.stack]}; some handler pushed more than it popped")

    wrapped.setdefault("RETURN_VALUE", return_value)
    return wrapped


# ---- what a failed graded test tells the learner -----------------------------------------------------
def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def unfinished_stub(task: str | None, error: BaseException | None = None) -> str | None:
    """"Exercise 2.1 not done yet: <its spec>" when the graded task's stub ran and raised its own error.

    Decided by running, never by reading the file: the stub's ``NotImplementedError("Exercise
    N.M: ...")`` is in the failure's chain, or the loader saw the task's stub raise during this test
    (:data:`course.loader.raised_stubs`; a stub run inside traced code may surface wrapped, its text
    lost). A stub that is commented out, or a dead line after the learner's ``return``, never raises:
    the learner's answer is then graded as it is, and a wrong one fails with its failure.
    """
    import re

    from course.loader import raised_stubs

    stub = re.compile(r"(Exercise (\d+\.\d+): .*?\. Stuck\? course\.hint\('[\d.]+'\))")
    for exc in _chain(error) if error is not None else ():
        found = stub.search(str(exc)) if isinstance(exc, NotImplementedError) else None
        if found and (task is None or found[2] == task or found[2] in raised_stubs):
            return f"Exercise {found[2]} not done yet: {found[1].split(': ', 1)[1]}"
    if task is None or task not in raised_stubs:
        return None
    spec = _stub_spec(task)
    return f"Exercise {task} not done yet: {spec or 'its stub raised NotImplementedError'}"


def _stub_spec(task: str) -> str | None:
    """The one-line spec in the task's stub (for the report's first line)."""
    import os
    import re

    from course.loader import chapter_file

    if os.environ.get("TINY_COURSE_MODE", "exercises") != "exercises":
        return None
    try:
        text = chapter_file(f"ch{int(task.split('.')[0]):02d}", "exercises").read_text()
    except (FileNotFoundError, OSError):
        return None
    found = re.search(rf'NotImplementedError\("(Exercise {re.escape(task)}: .*?)"\)', text)
    return found[1].split(": ", 1)[1] if found else None


def explain_failure(task: str | None, error: BaseException) -> str | None:
    """A first line for a failed graded test: the unfinished exercise, or the likely mistake; None to keep pytest's."""
    from course.hints import symptom_hint

    stub = unfinished_stub(task, error)
    if stub:
        return stub
    text = str(error)
    advice = symptom_hint(f"{type(error).__name__}: {text}", task)
    if advice:
        first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
        return f"{first}  [likely: {advice}]"
    return None
