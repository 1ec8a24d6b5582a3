"""Load a chapter's exercise module, from ``solutions/`` or ``exercises/`` by one switch.

Notebooks load with ``unfinished="package"``: the chapter then reads through ("Run All") before
every exercise is done. Each stub (a function whose body raises ``NotImplementedError("Exercise
N.M: ...")``) is wrapped as the module is executed: the learner's code runs first, and only when
it raises the stub's own error does the cell print one line ("Exercise 3.2 not done yet: ...")
and call the package's counterpart from :mod:`course.fallbacks` -- never the solution file. The
graded tests load with the default ``unfinished="raise"``, so an unfinished exercise fails there.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
MODE_ENV = "TINY_COURSE_MODE"
MODES = ("exercises", "solutions")
UNFINISHED = ("raise", "package")
STUB = re.compile(r"^Exercise (\d+\.\d+)\b")
_DECORATOR = "__course_unfinished__"


def mode() -> str:
    """The active mode: ``exercises`` (the learner's files, the default) or ``solutions``."""
    value = os.environ.get(MODE_ENV, "exercises").strip().lower()
    if value not in MODES:
        raise ValueError(
            f"{MODE_ENV}={value!r} is not a course mode; set it to 'exercises' or 'solutions'"
        )
    return value


def chapter_file(chapter: str, which: str | None = None) -> Path:
    """The file for ``chapter`` ("ch03" or "3") in ``solutions/`` or ``exercises/``."""
    which = which or mode()
    tag = chapter if chapter.startswith("ch") else f"ch{int(chapter):02d}"
    matches = sorted((ROOT / which).glob(f"{tag}_*.py"))
    if len(matches) != 1:
        found = ", ".join(p.name for p in matches) or "none"
        raise FileNotFoundError(
            f"expected exactly one {which}/{tag}_*.py, found {found}; "
            "run `python -m course.exercises` to regenerate the exercises"
        )
    return matches[0]


def load(chapter: str, which: str | None = None, unfinished: str = "raise") -> ModuleType:
    """Import the chapter's module afresh (so edits to an exercise file are picked up on re-run).

    ``unfinished="package"`` (what the notebooks use) makes an unfinished exercise fall back to the
    package's own implementation with a one-line note; ``"raise"`` (the default, what the graded
    tests use) leaves the stubs raising.
    """
    if unfinished not in UNFINISHED:
        raise ValueError(f"unfinished={unfinished!r}: use 'raise' (graded tests) or 'package' (notebooks)")
    path = chapter_file(chapter, which)
    name = f"course_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    if unfinished == "package" and path.parent.name == "exercises":
        import course.fallbacks  # noqa: F401  (snapshots the package's handlers before any are swapped)

        _announced.clear()  # a fresh load says again which exercises stand in
        _exec_with_fallbacks(module, path, path.stem[:4])
    elif path.parent.name == "exercises":
        _exec_recording_stubs(module, path)
    else:
        spec.loader.exec_module(module)
    return module


# ---- which stubs actually ran ------------------------------------------------------------------

#: the tasks ("3.2") whose stub raised its own NotImplementedError since :func:`reset_raised_stubs`.
#: The graded report calls a task "not done yet" only when its stub ran and raised: a stub that is
#: commented out, or left as a dead line after the learner's ``return``, never raises, so a wrong
#: answer written above it is graded FAIL with its failure.
raised_stubs: set[str] = set()
_RECORD = "__course_stub_raised__"


def reset_raised_stubs() -> None:
    raised_stubs.clear()


def _stub_raised(task: str, error: BaseException) -> BaseException:
    """Called by a stub's ``raise`` (rewritten at load): note that the stub ran, then raise its error."""
    raised_stubs.add(task)
    return error


class _RecordStubs(ast.NodeTransformer):
    """``raise NotImplementedError("Exercise 3.2: ...")`` -> ``raise __course_stub_raised__("3.2", <same>)``."""

    def visit_Raise(self, node: ast.Raise) -> ast.Raise:
        task = stub_task(node)
        if task and node.exc is not None:
            node.exc = ast.copy_location(
                ast.Call(ast.Name(_RECORD, ast.Load()), [ast.Constant(task), node.exc], []), node.exc)
        return node


def _exec_recording_stubs(module: ModuleType, path: Path) -> None:
    """Execute the exercise file with each stub's raise noting that it ran (see :data:`raised_stubs`)."""
    tree = _RecordStubs().visit(ast.parse(path.read_text(), str(path)))
    ast.fix_missing_locations(tree)
    module.__dict__[_RECORD] = _stub_raised
    exec(compile(tree, str(path), "exec"), module.__dict__)  # noqa: S102 - the learner's own file


# ---- unfinished exercises in notebooks ---------------------------------------------------------


def stub_task(node: ast.AST) -> str | None:
    """The task ("3.2") if ``node`` contains ``raise NotImplementedError("Exercise 3.2: ...")``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Raise) and isinstance(sub.exc, ast.Call) \
                and getattr(sub.exc.func, "id", None) == "NotImplementedError" and sub.exc.args \
                and isinstance(sub.exc.args[0], ast.Constant) and isinstance(sub.exc.args[0].value, str):
            match = STUB.match(sub.exc.args[0].value)
            if match:
                return match.group(1)
    return None


def stubs(tree: ast.Module) -> dict[str, tuple[str, ast.FunctionDef]]:
    """``{qualname: (task, def)}`` for the module-level functions and methods that hold a stub."""
    found = {}
    for node in tree.body:
        defs = [(node.name, node)] if isinstance(node, ast.FunctionDef) else \
            [(f"{node.name}.{m.name}", m) for m in node.body if isinstance(m, ast.FunctionDef)] \
            if isinstance(node, ast.ClassDef) else []
        for qualname, fn in defs:
            task = stub_task(fn)
            if task:
                found[qualname] = (task, fn)
    return found


def _exec_with_fallbacks(module: ModuleType, path: Path, chapter: str) -> None:
    """Execute the exercise file with every stub decorated by :func:`_unfinished` (decorating at
    definition time also covers the tables and classes that hold the function)."""
    tree = ast.parse(path.read_text(), str(path))
    for qualname, (task, fn) in stubs(tree).items():
        call = ast.Call(ast.Name(_DECORATOR, ast.Load()),
                        [ast.Constant(chapter), ast.Constant(qualname), ast.Constant(task)], [])
        fn.decorator_list.insert(0, ast.copy_location(call, fn))
    ast.fix_missing_locations(tree)
    module.__dict__[_DECORATOR] = _unfinished
    module.__dict__[_PLAIN_STUBS] = {name: (chapter, task) for name, (task, fn) in stubs(tree).items()
                                     if "." not in name and _only_a_stub(fn)}
    exec(compile(tree, str(path), "exec"), module.__dict__)
    module.__class__ = _LearnerModule


_PLAIN_STUBS = "__course_plain_stubs__"


def _only_a_stub(fn: ast.FunctionDef) -> bool:
    """The stub's ``raise`` is a statement of the function's own body: no code path avoids it."""
    return any(isinstance(stmt, ast.Raise) and stub_task(stmt) for stmt in fn.body)


class _LearnerModule(ModuleType):
    """A chapter module whose untouched stubs, read from a notebook cell (``ch.where_rewrite``),
    are the package's function itself: a compiler can then trace it (a try/except wrapper around
    a raising stub would break its graph). The cell says so in one line."""

    def __getattribute__(self, name: str):
        plain = ModuleType.__getattribute__(self, "__dict__").get(_PLAIN_STUBS, {})
        if name in plain:
            from course import fallbacks

            chapter, task = plain[name]
            package, where = fallbacks.resolve(chapter, name, module=self)
            _announce(task, where)
            return package
        return ModuleType.__getattribute__(self, name)


def is_stub_error(error: BaseException) -> bool:
    return isinstance(error, NotImplementedError) and bool(error.args) \
        and isinstance(error.args[0], str) and bool(STUB.match(error.args[0]))


_announced: set[tuple[str, Any]] = set()


def _announce(task: str, where: str) -> None:
    """Print the one-line note, once per task and notebook cell (and load)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        cell = shell.execution_count if shell is not None else None
    except ImportError:
        cell = None
    if (task, cell) not in _announced:
        _announced.add((task, cell))
        print(f"Exercise {task} not done yet: using {where}")


def _unfinished(chapter: str, qualname: str, task: str) -> Callable[[Callable], Callable]:
    """Decorator: run the learner's function; on its stub's NotImplementedError run the package's."""
    from course import fallbacks

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                result = fn(*args, **kwargs)
            except NotImplementedError as error:
                if not is_stub_error(error):
                    raise
                package, where = fallbacks.resolve(chapter, qualname, error, sys.modules.get(fn.__module__))
                _announce(task, where)
                return package(*args, **kwargs)
            if callable(result) and getattr(result, "__qualname__", "").startswith(f"{fn.__qualname__}.<locals>."):
                package, where = fallbacks.resolve(chapter, qualname)
                return _inner(result, lambda: package(*args, **kwargs), where)
            return result

        wrapper.__course_task__ = task
        return wrapper

    return deco


def _inner(learner: Callable, package: Callable[[], Callable], where: str) -> Callable:
    """A function the learner's code returned (e.g. a ``wrapper`` closure) that may hold a stub too."""
    @functools.wraps(learner)
    def inner(*args, **kwargs):
        try:
            return learner(*args, **kwargs)
        except NotImplementedError as error:
            if not is_stub_error(error):
                raise
            _announce(STUB.match(error.args[0]).group(1), where)
            return package()(*args, **kwargs)

    return inner
