"""Grade the exercises: run the graded tests and print a score table per chapter and task.

    python -m course.grade                      # your exercises, all chapters
    python -m course.grade ch03                 # one chapter
    python -m course.grade --mode solutions     # the reference answers

``--require pass`` / ``--require fail`` make the exit status say whether *every* graded test
passed (solutions) or *every* one failed (stubs); CI uses both, so no graded test can pass
by accident on an unsolved exercise.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import io
import os
import re
import sys

import pytest

from course.loader import ROOT

TASK_PREFIX = "ch"
TASK_MARKER = re.compile(r"^ch\d\d_\d+$")


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

    def pytest_collection_modifyitems(self, items):
        for item in items:
            self.tasks[item.nodeid] = task_of(item) or "untagged"

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            passed = report.outcome == "passed"
            message = "" if passed else _first_line(report)
            self.results.append(Result(self.tasks.get(report.nodeid, "untagged"), report.nodeid, passed, message))


def _first_line(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    for line in text.splitlines():
        line = line.strip()
        if line:
            for prefix in ("course.testing.Mismatch: ", "AssertionError: ", "E   "):
                line = line.removeprefix(prefix)
            return line
    return "failed"


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
        if len(failure) > width:
            failure = failure[: width - 3] + "..."
        status = "PASS" if passed == len(group) else "FAIL"
        rows.append(f"{chapter:<8}{task:<9}{passed:>3}/{len(group):<3}  {status:<6}  {failure}")
    rows.append("-" * (32 + width))
    for chapter, (passed, total) in sorted(chapters.items()):
        rows.append(f"{chapter:<8}{'total':<9}{passed:>3}/{total:<3}  {100 * passed // max(total, 1):>3}%")
    passed = sum(r.passed for r in results)
    rows.append(f"{'all':<8}{'':<9}{passed:>3}/{len(results):<3}  {100 * passed // max(len(results), 1):>3}%")
    return "\n".join(rows)


def run(mode: str, chapters: list[str], quiet: bool = True) -> list[Result]:
    os.environ["TINY_COURSE_MODE"] = mode
    files = sorted((ROOT / "tests" / "graded").glob("test_ch*.py"))
    if chapters:
        tags = {c if c.startswith(TASK_PREFIX) else f"ch{int(c):02d}" for c in chapters}
        files = [f for f in files if f.name.split("_")[1] in tags]
    if not files:
        raise SystemExit(f"no graded tests found for {chapters or 'any chapter'} under tests/graded/")
    collector = Collector()
    args = [str(f) for f in files] + [f"--course-mode={mode}", "-p", "no:cacheprovider", "--rootdir", str(ROOT)]
    args += ["-q", "--tb=short"]
    if quiet:  # the table is the report; pytest's own output is noise here
        with contextlib.redirect_stdout(io.StringIO()):
            pytest.main(args, plugins=[collector])
    else:
        pytest.main(args, plugins=[collector])
    return collector.results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Print the score table of the graded exercises.")
    parser.add_argument("chapters", nargs="*", help="chapters to grade, e.g. ch03 or 3 (default: all)")
    parser.add_argument("--mode", choices=("exercises", "solutions"), default="exercises")
    parser.add_argument("--require", choices=("pass", "fail"), help="exit 1 unless every graded test passes / fails")
    parser.add_argument("--verbose", action="store_true", help="show pytest's own output too")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    results = run(args.mode, args.chapters, quiet=not args.verbose)
    print(f"graded tests, mode={args.mode}")
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


if __name__ == "__main__":
    sys.exit(main())
