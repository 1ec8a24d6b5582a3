"""The grader reports what running the learner's code shows: a stub that raised is "TODO", anything
else is graded as it is (a wrong answer above a commented-out stub is FAIL, with its failure)."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys

import pytest

from course.loader import ROOT

STUB = ('    raise NotImplementedError("Exercise 11.3: the bucket a length goes to; checked on lengths at, '
        'between and past the buckets (notebook 11, section 4c). Stuck? course.hint(\'11.3\')")\n')


def _course_copy(tmp_path, exercise_text: str):
    """A checkout whose exercises/ch11 holds ``exercise_text`` (course/ copied so ROOT resolves here)."""
    for entry in ROOT.iterdir():
        if entry.name in ("course", "conftest.py", "pyproject.toml"):
            copy = shutil.copytree if entry.is_dir() else shutil.copy
            copy(entry, tmp_path / entry.name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                                  if entry.is_dir() else {}))
        elif entry.name not in ("exercises", ".git") and not entry.name.startswith(".venv"):
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "exercises").mkdir()
    for path in (ROOT / "exercises").glob("ch*_*.py"):
        (tmp_path / "exercises" / path.name).write_text(path.read_text())
    (tmp_path / "exercises" / "ch11_end_to_end.py").write_text(exercise_text)
    return tmp_path


def _grade(root, task: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "course.grade", task], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


@pytest.mark.parametrize("edit", ["commented out", "dead line after the return"])
def test_a_wrong_answer_beside_a_leftover_stub_is_graded_fail(tmp_path, edit):
    text = (ROOT / "exercises" / "ch11_end_to_end.py").read_text()
    assert STUB in text, "the 11.3 stub changed: update STUB"
    wrong = "    return max(buckets)  # a wrong answer\n"
    if edit == "commented out":
        text = text.replace(STUB, wrong + "    # " + STUB.lstrip())
    else:
        text = text.replace(STUB, wrong + STUB)
    out = _grade(_course_copy(tmp_path, text), "ch11.3")
    row = next(line for line in out.splitlines() if line.startswith("ch11    ch11_3"))
    assert " FAIL " in row and "not done yet" not in row, out
    assert "bucket" in row, row  # the failure itself (which input, what was expected), not the stub's spec


def test_an_untouched_stub_is_graded_todo(tmp_path):
    out = _grade(_course_copy(tmp_path, (ROOT / "exercises" / "ch11_end_to_end.py").read_text()), "ch11.3")
    row = next(line for line in out.splitlines() if line.startswith("ch11    ch11_3"))
    assert " TODO " in row and "Exercise 11.3 not done yet" in row, out


def test_an_error_raised_by_the_answer_names_the_call_and_its_inputs(tmp_path):
    """An answer that crashes (not a graded check failing) is still reported with the input that made it crash."""
    text = (ROOT / "exercises" / "ch11_end_to_end.py").read_text()
    out = _grade(_course_copy(tmp_path, text.replace(STUB, "    return buckets[len(buckets)]  # crashes\n")), "ch11.3")
    row = next(line for line in out.splitlines() if line.startswith("ch11    ch11_3"))
    assert " FAIL " in row and "IndexError" in row, out
    assert "raised by `" in row and "ch." in row, row  # the graded test's line that called the answer


def test_the_warm_grading_process_grades_as_a_cold_run_and_restarts_when_the_code_changes(tmp_path):
    """With TINY_COURSE_WARM=1 the first run grades itself and starts the warm process; the next runs in
    a child of it (the exercise file sees another parent) with the same table; a changed course module
    makes the warm process quit, and that run grades itself again."""
    marker = tmp_path / "parents.txt"
    text = (ROOT / "exercises" / "ch11_end_to_end.py").read_text()
    future = "from __future__ import annotations\n"
    text = text.replace(future, future + f"import os as _os\nopen({str(marker)!r}, 'a').write(f'{{_os.getppid()}}\\n')\n")
    (tmp_path / "checkout").mkdir()
    root = _course_copy(tmp_path / "checkout", text)
    env = {**os.environ, "PYTHONPATH": str(root), "TINY_COURSE_WARM": "1"}

    def grade() -> tuple[str, int]:
        done = subprocess.run([sys.executable, "-m", "course.grade", "ch11.3"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)
        parents = marker.read_text().split()
        return done.stdout, int(parents[-1])

    servers = set()
    try:
        cold, parent = grade()
        assert parent == os.getpid(), "the first run grades in its own process"
        for _ in range(10):  # a run that comes before the warm process listens grades itself
            warm, parent = grade()
            if parent != os.getpid():
                break
        servers.add(parent)
        assert parent != os.getpid(), "no run was served by the warm process"
        assert warm == cold
        os.utime(root / "course" / "testing.py", (1, 1))  # the warm process imported it: no stale code served
        again, parent = grade()
        assert parent == os.getpid() and again == cold, "a run after a change grades in its own process"
        for _ in range(10):  # the fresh warm process it started: find it, to stop it
            _, parent = grade()
            if parent != os.getpid():
                servers.add(parent)
                break
    finally:
        for pid in servers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
