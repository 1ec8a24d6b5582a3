"""The per-chapter index (``python -m course.index``): every task's files, found from the files."""
from course import index


def test_every_task_has_its_solution_stub_tests_hints_and_mutants(capsys):
    assert index.main(["--check"]) == 0, capsys.readouterr().err
    assert index.chapters()[:2] == ["ch00", "ch01"]


def test_a_task_row_names_the_files_that_hold_it():
    tasks = {t.task: t for t in index.index("ch03")}
    t = tasks["3.2"]
    assert t.function == "tensor_match_failure"
    assert t.files["solution"].startswith("solutions/ch03_guards_and_cache.py:")
    assert t.files["exercise"].startswith("exercises/ch03_guards_and_cache.py:")
    assert "tests/graded/test_ch03_guards_and_cache.py" in t.files["graded tests"]
    assert "tinydynamo.guards._tensor_failure" in t.files["fallback"]
    assert not t.missing()


def test_a_missing_piece_is_reported(monkeypatch, capsys):
    monkeypatch.setattr(index, "HINTS", {})
    assert index.main(["ch03", "--check"]) == 1
    assert "3.1 (hints)" in capsys.readouterr().err
