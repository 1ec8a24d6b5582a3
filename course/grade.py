"""Grade the exercises: run the graded tests and print a score table per chapter and task.

    python -m course.grade                      # your exercises, all chapters
    python -m course.grade ch03                 # one chapter
    python -m course.grade ch02.1               # one task (also 2.1 or ch02_1): seconds, not minutes
    python -m course.grade --mode solutions     # the reference answers
    python -m course.grade --mutants [ch03]     # prove the graded tests reject known wrong answers
    python -m course.grade ch06.1 --hint [2]    # a hint, level 1 (a nudge) or more (the idea)

From a terminal, grading runs in a child of a warm process that has imported torch and the compiler
once (course.warm): the first run starts it, later runs take about a second instead of the imports'
several. ``TINY_COURSE_WARM=0`` grades without it, ``TINY_COURSE_WARM=1`` with it outside a terminal.

``--require pass`` / ``--require fail`` make the exit status say whether *every* graded test
passed (solutions) or *every* one failed (stubs); CI uses both, so no graded test can pass
by accident on an unsolved exercise.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import gc
import io
import os
import re
import sys

from course import warm
from course.loader import ROOT

TASK_PREFIX = "ch"
#: wrong answers each task's graded tests must reject, at least (course/mutants/)
MIN_MUTANTS = 4
#: pytest plugins that grading does not use (notebooks, async tests, hypothesis' reporting, junit,
#: doctests, the unraisable-exception and thread-exception hooks, ...)
UNUSED_PLUGINS = ("nbval", "anyio", "platformdirs", "hypothesispytest", "unraisableexception", "threadexception",
                  "junitxml", "doctest", "pastebin", "legacypath", "setuponly", "setupplan", "faulthandler",
                  "subtests")
GRADING_GC_THRESHOLDS = (10_000, 50, 100)
TASK_MARKER = re.compile(r"^ch\d\d_\d+$")
TASK_SPEC = re.compile(r"^(?:ch)?(?P<chapter>\d{1,2})(?:[._](?P<task>\d+))?$")


def parse_selection(spec: str) -> tuple[str, str | None]:
    """``"ch02.1"``, ``"2.1"``, ``"ch02_1"`` -> ``("ch02", "ch02_1")``; ``"ch03"``, ``"3"`` -> ``("ch03", None)``."""
    match = TASK_SPEC.match(spec.strip().lower())
    if not match:
        raise SystemExit(f"{spec!r} is not a chapter or task; write ch03 (a chapter) or ch03.2 (a task)")
    chapter = f"ch{int(match['chapter']):02d}"
    return chapter, (f"{chapter}_{int(match['task'])}" if match["task"] else None)


def all_tasks() -> list[str]:
    """Every task ("2.1") that has a solution block, in order."""
    found = set()
    for path in sorted((ROOT / "solutions").glob("ch*_*.py")):
        found |= set(re.findall(r"# BEGIN SOLUTION \(Exercise (\d+\.\d+):", path.read_text()))
    return sorted(found, key=lambda t: tuple(int(p) for p in t.split(".")))


def task_of(item) -> str | None:
    """The task a test is marked with (``chNN_M``), or None."""
    names = [m.name for m in item.iter_markers() if TASK_MARKER.match(m.name)]
    return names[0] if names else None


@dataclasses.dataclass
class Result:
    task: str
    test: str
    passed: bool
    message: str = ""


class Collector:
    """A pytest plugin that records each graded test's task, outcome and first failure line."""

    def __init__(self) -> None:
        self.results: list[Result] = []
        self.tasks: dict[str, str] = {}
        self.inputs: dict[str, str] = {}  # a parametrized test's arguments, e.g. "shape=(2, 0)"

    def pytest_collection_modifyitems(self, items):
        for item in items:
            self.tasks[item.nodeid] = task_of(item) or "untagged"
            params = getattr(getattr(item, "callspec", None), "params", {})
            self.inputs[item.nodeid] = ", ".join(f"{k}={_short(v)}" for k, v in params.items())

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            passed = report.outcome == "passed"
            message = "" if passed else _first_line(report, self.inputs.get(report.nodeid, ""))
            self.results.append(Result(self.tasks.get(report.nodeid, "untagged"), report.nodeid, passed, message))
        elif report.when == "teardown" and report.failed:  # e.g. global state left changed
            earlier = next((r for r in self.results if r.test == report.nodeid), None)
            if earlier is None:
                self.results.append(Result(self.tasks.get(report.nodeid, "untagged"), report.nodeid, False,
                                           _first_line(report, self.inputs.get(report.nodeid, ""))))
            elif earlier.passed:
                earlier.passed, earlier.message = False, _first_line(report, self.inputs.get(report.nodeid, ""))


def _short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_line(report, inputs: str = "") -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    for line in text.splitlines():
        line = line.strip()
        if line:
            if line.startswith("course.testing.Mismatch: ") or " not done yet: " in line:
                return line.removeprefix("course.testing.Mismatch: ")  # a graded check: it names its input
            for prefix in ("AssertionError: ", "E   "):
                line = line.removeprefix(prefix)
            return line + _where_it_raised(report, inputs)
    return "failed"


def _where_it_raised(report, inputs: str) -> str:
    """For an error raised inside the learner's code (not by a graded check): the graded test's line that
    called it and the test's parameters, so the message still names the input, e.g.
    `` (raised by `ch.sum_to_size(grad, shape)`, inputs grad_shape=(2, 0), shape=(1,))``."""
    entries = getattr(getattr(report.longrepr, "reprtraceback", None), "reprentries", [])
    calls = [e.lines[0].strip() for e in entries
             if getattr(e, "reprfileloc", None) is not None and e.lines
             and "tests/graded/" in str(e.reprfileloc.path).replace("\\", "/")]
    parts = ([f"raised by `{calls[-1]}`"] if calls else []) + ([f"inputs {inputs}"] if inputs else [])
    return f" ({', '.join(parts)})" if parts else ""


def table(results: list[Result], width: int = 70) -> str:
    by_task: dict[str, list[Result]] = collections.defaultdict(list)
    for result in results:
        by_task[result.task].append(result)
    rows = [f"{'chapter':<8}{'task':<9}{'score':>7}  {'status':<6}  detail", "-" * (32 + width)]
    chapters: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for task in sorted(by_task):
        group = by_task[task]
        passed = sum(r.passed for r in group)
        chapter = task.split("_")[0]
        chapters[chapter][0] += passed
        chapters[chapter][1] += len(group)
        failure = next((r.message for r in group if not r.passed), "")
        if failure and "Stuck?" not in failure:
            failure += f"  (stuck? python -m course.grade {task.replace('_', '.')} --hint)"
        status = "PASS" if passed == len(group) else "TODO" if " not done yet: " in failure else "FAIL"
        rows.append(f"{chapter:<8}{task:<9}{passed:>3}/{len(group):<3}  {status:<6}  {failure}")
    rows.append("-" * (32 + width))
    for chapter, (passed, total) in sorted(chapters.items()):
        rows.append(f"{chapter:<8}{'total':<9}{passed:>3}/{total:<3}  {100 * passed // max(total, 1):>3}%")
    passed = sum(r.passed for r in results)
    rows.append(f"{'all':<8}{'':<9}{passed:>3}/{len(results):<3}  {100 * passed // max(len(results), 1):>3}%")
    return "\n".join(rows)


def run(mode: str, chapters: list[str], quiet: bool = True) -> list[Result]:
    """Run the graded tests of ``chapters`` (chapters "ch03" or tasks "ch03.2"; all when empty)."""
    os.environ["TINY_COURSE_MODE"] = mode
    files = sorted((ROOT / "tests" / "graded").glob("test_ch*.py"))
    selected = [parse_selection(c) for c in chapters]
    markers = [task for _, task in selected if task]
    if selected:
        whole = {chapter for chapter, task in selected if task is None}
        tags = {chapter for chapter, _ in selected}
        files = [f for f in files if f.name.split("_")[1] in tags]
        if whole:  # a whole chapter asked for: run its file (and the other chapters' files) in full
            markers = []
    if not files:
        raise SystemExit(f"no graded tests found for {chapters or 'any chapter'} under tests/graded/")
    collector = Collector()
    args = [str(f) for f in files] + [f"--course-mode={mode}", "-p", "no:cacheprovider", "--rootdir", str(ROOT)]
    # graded tests check with course.testing's expect_* (never a bare assert), so pytest need not
    # rewrite asserts; the plugins below grade nothing here and cost imports or, for the unraisable-
    # exception one, full garbage collections at exit
    args += ["--assert=plain"] + [arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}")]
    if markers:
        args += ["-m", " or ".join(markers)]
    args += ["-q", "--tb=short"]
    # importing torch and the compiler allocates millions of objects that live until exit; with the
    # default thresholds the cyclic collector walks them again and again (about 15% of a task's time)
    import pytest  # here, not at the top: a run the warm process grades never needs it (0.2 s of every run)

    thresholds = gc.get_threshold()
    gc.set_threshold(*GRADING_GC_THRESHOLDS)
    try:
        if quiet:  # the table is the report; pytest's own output is noise here
            with contextlib.redirect_stdout(io.StringIO()):
                pytest.main(args, plugins=[collector])
        else:
            pytest.main(args, plugins=[collector])
    finally:
        gc.set_threshold(*thresholds)
    return collector.results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Print the score table of the graded exercises.")
    parser.add_argument("chapters", nargs="*", help="chapters or tasks to grade, e.g. ch03, 3, ch03.2 (default: all)")
    parser.add_argument("--mode", choices=("exercises", "solutions"), default="exercises")
    parser.add_argument("--require", choices=("pass", "fail"), help="exit 1 unless every graded test passes / fails")
    parser.add_argument("--verbose", action="store_true", help="show pytest's own output too")
    parser.add_argument("--mutants", action="store_true",
                        help="apply each known wrong answer (course/mutants/) to the solutions and check that "
                             "the task's graded tests reject it; exit 1 if any survives")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (with --mutants)")
    parser.add_argument("--hint", nargs="?", type=int, const=1, metavar="LEVEL",
                        help="print a hint for the task instead of grading (level 1: a nudge; 2: the idea; "
                             "3 where there is one: the pitfall the tests check)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.hint is not None:
        return hint_main(args.chapters, args.hint)
    if args.mutants:
        return mutants_main(args.chapters, args.jobs)
    if warm.wanted():  # the same run, forked from a process that has imported torch and the compiler
        code = warm.grade(argv)
        if code is not None:
            return code
    sys.path.insert(0, str(ROOT))
    results = run(args.mode, args.chapters, quiet=not args.verbose)
    print(f"graded tests, mode={args.mode}")
    if args.require == "fail":
        print("every graded test must fail on the stubs: expected (the exercises are not done yet)")
    print(table(results))
    if not results:
        print("no graded test ran")
        return 1
    if args.require == "pass":
        bad = [r.test for r in results if not r.passed]
        if bad:
            print("FAILED on the solutions (every graded test must pass):\n  " + "\n  ".join(bad))
            return 1
    if args.require == "fail":
        bad = [r.test for r in results if r.passed]
        if bad:
            print("PASSED on the stubs (every graded test must fail on an unsolved exercise):\n  " + "\n  ".join(bad))
            return 1
    return 0


def hint_main(selection: list[str], level: int) -> int:
    """``ch06.1 --hint [LEVEL]``: one hint, from a nudge towards the idea (never the code)."""
    from course.hints import hint_text

    tasks = [task for _, task in map(parse_selection, selection) if task]
    if len(tasks) != 1:
        raise SystemExit("--hint needs one task, e.g. python -m course.grade ch06.1 --hint")
    chapter, number = tasks[0][2:].split("_")
    print(hint_text(f"{int(chapter)}.{number}", level).replace(
        f"(more: course.hint('{int(chapter)}.{number}', level={level + 1}))",
        f"(more: python -m course.grade {tasks[0].replace('_', '.')} --hint {level + 1})"))
    return 0


def mutants_main(selection: list[str], jobs: int) -> int:
    """``--mutants``: run the mutants of the selected chapters (or one task) and print the table."""
    from course.mutants import CHAPTERS, MutantError, apply, mutants_of
    from course.mutants.runner import report, run_mutants

    chosen = [parse_selection(s) for s in selection]
    chapters = sorted({c for c, _ in chosen}) or CHAPTERS
    task = next((t for _, t in chosen if t), None)
    only = f"{int(task[2:4])}.{task.split('_')[1]}" if task else None
    problems = []
    for chapter in chapters:  # every task of the chapter has >= MIN_MUTANTS mutants, and each still applies
        text = next((ROOT / "solutions").glob(f"{chapter}_*.py")).read_text()
        listed = mutants_of(chapter)
        for t in all_tasks():
            if t.startswith(f"{int(chapter[2:])}.") and sum(m.task == t for m in listed) < MIN_MUTANTS:
                problems.append(f"Exercise {t} has {sum(m.task == t for m in listed)} mutants; write at least {MIN_MUTANTS}")
        for m in listed:
            try:
                apply(m, text)
            except MutantError as error:
                problems.append(str(error))
    if problems:
        print("mutant list problems:\n  " + "\n  ".join(problems))
        return 1
    print(f"mutation test of the graded tests: chapters {', '.join(chapters)}" + (f", task {only}" if only else ""))
    outcomes = run_mutants(chapters, jobs=jobs, only_task=only)
    print(report(outcomes))
    return 0 if outcomes and all(o.status in ("killed", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
