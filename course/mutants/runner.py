"""Run each mutant's task tests against a mutated copy of the solutions; count killed and survived.

Speed: importing torch and the compiler takes seconds, a task's tests usually less. So one parent
process imports them once and forks a child per mutant: the child points the course loader at a
temporary solutions folder holding the mutated file and runs pytest on that task's tests only.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from course.loader import ROOT
from course.mutants import CHAPTERS, Mutant, apply, mutants_of
from course.warm import warm_imports


@dataclasses.dataclass
class Outcome:
    mutant: Mutant
    status: str  # "killed", "survived", "error"
    detail: str = ""
    seconds: float = 0.0


def _test_file(chapter: str) -> Path:
    return next((ROOT / "tests" / "graded").glob(f"test_{chapter}_*.py"))


def _child(mutant: Mutant, workdir: Path, result_file: Path, timeout: int) -> int:
    """In the forked child: install the mutated solutions, run the task's tests, write the outcome."""
    import pytest

    import course.loader
    from course.grade import Collector

    signal.alarm(timeout)
    sys.dont_write_bytecode = True
    os.environ["TINY_COURSE_MODE"] = "solutions"
    course.loader.ROOT = workdir
    expected = workdir / "solutions"
    found = course.loader.chapter_file(mutant.chapter, "solutions")
    if found.parent != expected:
        result_file.write_text(json.dumps({"error": f"loader did not pick up the mutated file: {found}"}))
        return 3
    log = os.open(workdir / "pytest.log", os.O_WRONLY | os.O_CREAT)
    os.dup2(log, 1)
    os.dup2(log, 2)
    collector = Collector()
    args = [str(_test_file(mutant.chapter)), "-m", mutant.marker, "--course-mode=solutions", "-x", "-q",
            "-p", "no:cacheprovider", "--rootdir", str(ROOT), "--tb=line", "-W", "ignore"]
    code = pytest.main(args, plugins=[collector])
    failed = [r for r in collector.results if not r.passed]
    result_file.write_text(json.dumps({
        "ran": len(collector.results), "failed": len(failed), "code": int(code),
        "first": (failed[0].test.split("::")[-1] + ": " + failed[0].message) if failed else "",
    }))
    return 0


COPIED = ("course", "conftest.py", "pyproject.toml")  # so that course.loader.ROOT resolves to the copy


def _make_workdir(base: Path, index: int, mutant: Mutant) -> Path:
    work = base / f"m{index}"
    (work / "solutions").mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name in COPIED:
            if entry.is_dir():
                shutil.copytree(entry, work / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(entry, work / entry.name)
        elif entry.name not in ("solutions", ".git") and not entry.name.startswith(".venv"):
            (work / entry.name).symlink_to(entry)
    for src in (ROOT / "solutions").glob("ch*_*.py"):
        text = src.read_text()
        if src.name.startswith(mutant.chapter + "_"):
            text = apply(mutant, text)
        (work / "solutions" / src.name).write_text(text)
    return work


def run_mutants(chapters: list[str], jobs: int = 1, timeout: int = 120, only_task: str | None = None,
                progress=print) -> list[Outcome]:
    """Run every mutant of ``chapters`` (all by default); return their outcomes in order."""
    chapters = chapters or CHAPTERS
    todo = [m for c in chapters for m in mutants_of(c) if only_task is None or m.task == only_task]
    warm_imports()
    outcomes: list[Outcome | None] = [None] * len(todo)
    running: dict[int, tuple[int, Path, float]] = {}
    base = Path(tempfile.mkdtemp(prefix="course-mutants-"))
    try:
        next_index = 0
        while next_index < len(todo) or running:
            while next_index < len(todo) and len(running) < max(jobs, 1):
                mutant = todo[next_index]
                work = _make_workdir(base, next_index, mutant)
                result = work / "result.json"
                sys.stdout.flush()
                sys.stderr.flush()
                if mutant.python:
                    outcomes[next_index] = _run_other_python(mutant, work, timeout)
                    o = outcomes[next_index]
                    progress(f"  {o.status:<8} {mutant.task:<5} {mutant.description} (python {mutant.python})"
                             + (f"  [{o.detail}]" if o.status != "killed" else ""))
                    next_index += 1
                    continue
                pid = os.fork()
                if pid == 0:  # the child
                    code = 4
                    try:
                        code = _child(mutant, work, result, timeout)
                    except BaseException as error:  # noqa: BLE001 - report anything, then leave
                        try:
                            result.write_text(json.dumps({"error": f"{type(error).__name__}: {error}"}))
                        except OSError:
                            pass
                    finally:
                        os._exit(code)
                running[pid] = (next_index, work, time.perf_counter())
                next_index += 1
            if not running:
                continue
            pid, status = os.wait()
            index, work, started = running.pop(pid)
            outcome = _outcome(todo[index], work, status, time.perf_counter() - started, timeout)
            outcomes[index] = outcome
            likely = outcome.detail.split("[likely: ", 1)[1].split("]", 1)[0] if "[likely: " in outcome.detail else ""
            progress(f"  {outcome.status:<8} {outcome.mutant.task:<5} {outcome.mutant.description}"
                     + (f"  [{outcome.detail}]" if outcome.status != "killed" else f"  (hint: {likely})" if likely else ""))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return [o for o in outcomes if o is not None]


def other_python(version: str) -> Path | None:
    """The venv interpreter for ``version`` that scripts/test_other_pythons.sh sets up, if there is one."""
    candidate = ROOT / f".venv-py{version.replace('.', '')}" / "bin" / "python"
    return candidate if candidate.exists() else None


def _run_other_python(mutant: Mutant, work: Path, timeout: int) -> Outcome:
    """Run the task's torch-free graded tests under another CPython (a mistake only visible there)."""
    python = other_python(mutant.python)
    if python is None:
        return Outcome(mutant, "skipped", f"needs python {mutant.python} in .venv-py{mutant.python.replace('.', '')}: "
                                          "scripts/test_other_pythons.sh creates it where that Python exists")
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(work), "TINY_COURSE_MODE": "solutions"}
    try:
        done = subprocess.run([str(python), "-m", "pytest", str(work / "tests" / "graded" / _test_file(mutant.chapter).name),
                               "-m", mutant.marker, "--course-mode=solutions", "-x", "-q", "-p", "no:cacheprovider",
                               "--rootdir", str(work), "-W", "ignore"],
                              cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Outcome(mutant, "killed", f"timed out after {timeout} s", time.perf_counter() - started)
    seconds = time.perf_counter() - started
    tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
    if done.returncode == 1:
        return Outcome(mutant, "killed", tail[0], seconds)
    if done.returncode == 0 and " passed" in tail[0]:
        return Outcome(mutant, "survived", tail[0], seconds)
    return Outcome(mutant, "error", f"pytest exit {done.returncode}: {tail[0]}", seconds)


def _outcome(mutant: Mutant, work: Path, status: int, seconds: float, timeout: int) -> Outcome:
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
        return Outcome(mutant, "killed", f"timed out after {timeout} s", seconds)
    result_file = work / "result.json"
    if not result_file.exists():
        tail = (work / "pytest.log").read_text()[-2000:] if (work / "pytest.log").exists() else ""
        return Outcome(mutant, "error", f"child exited with status {status}: {tail}", seconds)
    result = json.loads(result_file.read_text())
    if "error" in result:
        return Outcome(mutant, "error", result["error"], seconds)
    if result["ran"] == 0:
        return Outcome(mutant, "error", f"no test of {mutant.marker} ran", seconds)
    if result["failed"]:
        return _check_hint(Outcome(mutant, "killed", result["first"], seconds))
    return Outcome(mutant, "survived", f"{result['ran']} tests passed", seconds)


def _check_hint(outcome: Outcome) -> Outcome:
    """A killed mutant whose failure shows a hint must show the one for its kind of mistake
    (``Mutant.symptom``), and one that declares a symptom must show it: else status "misled"."""
    from course.hints import SYMPTOMS

    fired = [s.key for s in SYMPTOMS if f"[likely: {s.advice}]" in outcome.detail]
    wanted = outcome.mutant.symptom
    if fired and fired[0] != wanted:
        return Outcome(outcome.mutant, "misled", f"its failure shows the hint for {fired[0]!r}, a different mistake "
                                                 f"(expected {wanted!r}): {outcome.detail}", outcome.seconds)
    if wanted and not fired:
        return Outcome(outcome.mutant, "misled", f"its failure should show the {wanted!r} hint: {outcome.detail}",
                       outcome.seconds)
    return outcome


def report(outcomes: list[Outcome]) -> str:
    """Per chapter: mutants, killed, survived (and errors), then every survivor."""
    rows = [f"{'chapter':<8}{'tasks':>6}{'mutants':>9}{'killed':>8}{'survived':>10}{'misled':>8}{'errors':>8}"
            f"{'skipped':>9}{'seconds':>9}"]
    by_chapter: dict[str, list[Outcome]] = collections.defaultdict(list)
    for o in outcomes:
        by_chapter[o.mutant.chapter].append(o)
    for chapter, group in sorted(by_chapter.items()):
        count = collections.Counter(o.status for o in group)
        tasks = len({o.mutant.task for o in group})
        rows.append(f"{chapter:<8}{tasks:>6}{len(group):>9}{count['killed']:>8}{count['survived']:>10}"
                    f"{count['misled']:>8}{count['error']:>8}{count['skipped']:>9}{sum(o.seconds for o in group):>9.1f}")
    count = collections.Counter(o.status for o in outcomes)
    rows.append(f"{'all':<8}{len({o.mutant.task for o in outcomes}):>6}{len(outcomes):>9}{count['killed']:>8}"
                f"{count['survived']:>10}{count['misled']:>8}{count['error']:>8}{count['skipped']:>9}"
                f"{sum(o.seconds for o in outcomes):>9.1f}")
    bad = [o for o in outcomes if o.status != "killed"]
    if bad:
        rows.append("")
        rows.append("not killed (survived: a wrong answer the graded tests accept; error: the run failed; "
                    "skipped: the Python it needs is not installed; misled: rejected, but with a hint for "
                    "another mistake, or without the hint for its own):")
        rows += [f"  {o.status}: {o.mutant.task} {o.mutant.description}: {o.detail}" for o in bad]
    return "\n".join(rows)
