"""Generate ``exercises/chNN_*.py`` from ``solutions/chNN_*.py``, or check they are in sync.

A solution block looks like::

    def count_calls(code):
        # BEGIN SOLUTION (Exercise 1.2: count the CALL instructions in `code`)
        return sum(...)
        # END SOLUTION

and becomes, in the exercise file::

    def count_calls(code):
        raise NotImplementedError("Exercise 1.2: count the CALL instructions in `code`. Stuck? course.hint('1.2')")

The marker's text is the exercise's *spec*: what to build, how it is checked, which notebook
section to read. It must not spell out the answer; step-by-step help lives in the hints
(``course/hints.py``), which the learner asks for.

Usage: ``python -m course.exercises`` (write) or ``python -m course.exercises --check``.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from course.loader import ROOT

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION \((?P<what>Exercise (?P<task>\d+\.\d+): .+)\)\s*$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
HEADER = "# GENERATED from solutions/{name} by `python -m course.exercises`: edit the marked parts.\n"


class MarkerError(ValueError):
    pass


def strip_solutions(text: str, name: str = "<solution>") -> str:
    """Replace every solution block with a ``raise NotImplementedError`` carrying its instruction."""
    out: list[str] = []
    inside = None
    for lineno, line in enumerate(text.splitlines(keepends=True), 1):
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise MarkerError(f"{name}:{lineno}: BEGIN SOLUTION inside another block (line {inside})")
            inside = lineno
            what = f"{begin['what']}. Stuck? course.hint('{begin['task']}')"
            what = what.replace("\\", "\\\\").replace('"', '\\"')
            out.append(f'{begin["indent"]}raise NotImplementedError("{what}")\n')
        elif END.match(line):
            if not inside:
                raise MarkerError(f"{name}:{lineno}: END SOLUTION without BEGIN SOLUTION")
            inside = None
        elif "SOLUTION" in line and line.lstrip().startswith("#"):
            raise MarkerError(
                f"{name}:{lineno}: malformed marker {line.strip()!r}; write "
                "'# BEGIN SOLUTION (Exercise N.M: what to do)' and '# END SOLUTION'"
            )
        elif not inside:
            out.append(line)
    if inside:
        raise MarkerError(f"{name}:{inside}: BEGIN SOLUTION is never closed by END SOLUTION")
    return HEADER.format(name=name) + "".join(out)


def expected_exercises(root: Path = ROOT) -> dict[Path, str]:
    return {
        root / "exercises" / src.name: strip_solutions(src.read_text(), src.name)
        for src in sorted((root / "solutions").glob("ch*_*.py"))
    }


def out_of_sync(root: Path = ROOT) -> list[str]:
    """Names of exercise files that differ from what the solutions generate (or are stale)."""
    expected = expected_exercises(root)
    problems = [p.name for p, text in expected.items() if not p.exists() or p.read_text() != text]
    stale = [p.name for p in (root / "exercises").glob("ch*_*.py") if p not in expected]
    return problems + [f"{name} (no matching solution)" for name in stale]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if exercises/ is out of sync")
    args = parser.parse_args(argv)
    if args.check:
        bad = out_of_sync()
        if bad:
            print("exercises out of sync with solutions: " + ", ".join(bad))
            print("fix: python -m course.exercises")
            return 1
        print("exercises in sync with solutions")
        return 0
    (ROOT / "exercises").mkdir(exist_ok=True)
    for path, text in expected_exercises().items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
