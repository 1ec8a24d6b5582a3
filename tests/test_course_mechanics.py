"""The course machinery: stub generation, sync checks, the dependency lists, the loader switch."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib

import pytest
import torch

from course import exercises, loader, notebooks
from course.loader import ROOT

SOLUTION = '''\
def f(x):
    """Doc."""
    # BEGIN SOLUTION (Exercise 2.1: return "x" + 1)
    y = x + 1
    return y
    # END SOLUTION


def g():
    return 0
'''


def test_strip_solutions_replaces_blocks_with_numbered_stubs():
    text = exercises.strip_solutions(SOLUTION, "ch02_demo.py")
    namespace: dict = {}
    exec(text, namespace)
    with pytest.raises(NotImplementedError, match=r'^Exercise 2\.1: return "x" \+ 1\. Stuck\? course\.hint\(.2\.1.\)$'):
        namespace["f"](1)
    assert namespace["g"]() == 0
    assert "y = x + 1" not in text


@pytest.mark.parametrize(
    "bad, problem",
    [
        ("# BEGIN SOLUTION (Exercise 1.1: a)\nx = 1\n", "never closed"),
        ("x = 1\n# END SOLUTION\n", "without BEGIN"),
        ("# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n", "malformed marker"),
        ("# BEGIN SOLUTION (Exercise 1.1: a)\n# BEGIN SOLUTION (Exercise 1.2: b)\n", "inside another"),
    ],
)
def test_malformed_markers_are_reported_with_line_and_fix(bad, problem):
    with pytest.raises(exercises.MarkerError, match=problem):
        exercises.strip_solutions(bad, "ch01_x.py")


def test_exercises_are_in_sync_with_solutions():
    assert exercises.out_of_sync() == [], "run: python -m course.exercises"


def test_every_solution_has_exercise_blocks_numbered_for_its_chapter():
    for path in sorted((ROOT / "solutions").glob("ch*_*.py")):
        text = path.read_text()
        numbers = re.findall(r"# BEGIN SOLUTION \(Exercise (\d+)\.(\d+):", text)
        assert numbers, f"{path.name} has no exercise blocks"
        chapter = int(path.name[2:4])
        assert {int(c) for c, _ in numbers} == {chapter}, f"{path.name}: exercise numbers must start with {chapter}."
        # one exercise may span several blocks (say, two methods), but the tasks run 1..N without gaps
        tasks = sorted({int(t) for _, t in numbers})
        assert tasks == list(range(1, len(tasks) + 1)), f"{path.name}: exercises numbered {tasks}"


def test_notebooks_are_in_sync_with_their_sources():
    pytest.importorskip("jupytext", reason="jupytext is part of the course setup; not on every GPU image")
    assert notebooks.out_of_sync() == [], "run: python -m course.notebooks build"


def test_loader_switch_selects_solutions_or_exercises(monkeypatch):
    paths = sorted((ROOT / "solutions").glob("ch*_*.py"))
    if not paths:
        pytest.skip("no chapters yet")
    chapter = paths[0].name[:4]
    monkeypatch.setenv(loader.MODE_ENV, "solutions")
    assert loader.chapter_file(chapter).parent.name == "solutions"
    monkeypatch.setenv(loader.MODE_ENV, "exercises")
    assert loader.chapter_file(chapter).parent.name == "exercises"
    monkeypatch.setenv(loader.MODE_ENV, "answers")
    with pytest.raises(ValueError, match="exercises' or 'solutions"):
        loader.mode()


def _pyproject_requirements() -> dict[str, str]:
    from packaging.requirements import Requirement

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    requirements = data["project"]["dependencies"] + data["project"]["optional-dependencies"]["models"]
    return {Requirement(r).name.lower(): str(Requirement(r).specifier) for r in requirements}


def _conda_requirements() -> dict[str, str]:
    conda_to_pypi = {"pytorch": "torch", "python-graphviz": "graphviz"}
    not_python_packages = {"python", "pip", "graphviz"}  # conda's graphviz is the `dot` binary
    not_python_packages.add("torchvision")  # pip gets it by `make setup` (TORCHVISION_SPEC, --no-deps)
    found = {}
    text = (ROOT / "environment.yml").read_text()
    for line in text.split("\ndependencies:\n", 1)[1].splitlines():
        match = re.match(r"^  - ([A-Za-z0-9_.-]+)\s*([<>=!~][^#\s]*)?\s*(#.*)?$", line)
        if match and match[1] not in not_python_packages:
            from packaging.specifiers import SpecifierSet

            found[conda_to_pypi.get(match[1], match[1]).lower()] = str(SpecifierSet(match[2] or ""))
    return found


def test_environment_yml_lists_the_same_packages_as_pyproject():
    assert _conda_requirements() == _pyproject_requirements()


def test_every_task_has_mutants_that_apply_and_hints():
    """The mutation test's inputs: >= 4 wrong answers per task, each applying to its solution; >= 2 hint levels."""
    from course.grade import MIN_MUTANTS, all_tasks
    from course.hints import HINTS, hint_text
    from course.loader import ROOT
    from course.mutants import CHAPTERS, apply, mutants_of

    tasks = all_tasks()
    assert len(tasks) >= 46
    by_task: dict = {}
    for chapter in CHAPTERS:
        text = next((ROOT / "solutions").glob(f"{chapter}_*.py")).read_text()
        for mutant in mutants_of(chapter):
            assert mutant.chapter == chapter, mutant
            assert apply(mutant, text) != text, mutant
            by_task.setdefault(mutant.task, []).append(mutant)
    assert MIN_MUTANTS >= 4
    assert {t: len(by_task.get(t, [])) for t in tasks if len(by_task.get(t, [])) < MIN_MUTANTS} == {}
    assert sorted(HINTS) == sorted(tasks)
    assert all(len(levels) >= 2 for levels in HINTS.values())
    assert hint_text("ch02.1", 2).startswith("Hint 2/2 for Exercise 2.1: ")


def test_stubs_are_specs_not_answers():
    """A stub's text shares no long stretch of code with its reference answer (hints hold the steps)."""
    import difflib
    import re

    from course.loader import ROOT

    for path in sorted((ROOT / "solutions").glob("ch*_*.py")):
        blocks = re.findall(r"# BEGIN SOLUTION \((Exercise [^:]+): ([^\n]*)\)\n(.*?)# END SOLUTION", path.read_text(), re.S)
        for task, spec, body in blocks:
            code = "\n".join(line.strip() for line in body.splitlines() if not line.strip().startswith("#"))
            match = difflib.SequenceMatcher(None, spec, code, autojunk=False).find_longest_match(0, len(spec), 0, len(code))
            shared = spec[match.a:match.a + match.size]
            assert match.size < 25, f"{path.name} {task}: the spec spells out code of the answer: {shared!r}"


def test_no_exercise_imports_the_function_it_asks_for():
    """A stub whose file imports the package's function of the same name is answered by one call to it."""
    import ast

    from course.loader import stubs

    for path in sorted((ROOT / "exercises").glob("ch*_*.py")):
        tree = ast.parse(path.read_text())
        asked = {qualname.split(".")[-1]: task for qualname, (task, _) in stubs(tree).items()}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                given = [(alias.name, task) for alias in node.names for name, task in asked.items() if alias.name == name]
                assert not given, (f"{path.name} imports {given[0][0]} from {node.module}: Exercise {given[0][1]} asks the "
                                   "learner to write it; keep the package's version out of the exercise file")


def test_every_hint_for_a_symptom_is_demonstrated_by_a_mutant_of_its_kind():
    """Each symptom hint is attached to the tasks whose failures it explains and to >= 1 mutant of that kind
    (``python -m course.grade --mutants`` then checks it fires for those and for no other mutant)."""
    from course.hints import SYMPTOMS, symptom_hint
    from course.mutants import CHAPTERS, mutants_of

    declared = {m.symptom: m for c in CHAPTERS for m in mutants_of(c) if m.symptom}
    assert sorted(declared) == sorted(s.key for s in SYMPTOMS), "every symptom needs a mutant that shows it"
    for symptom in SYMPTOMS:
        assert declared[symptom.key].task in symptom.tasks, (symptom.key, declared[symptom.key])
    shape = "Mismatch: output: shape (3,) vs expected (3, 1)"
    assert symptom_hint(shape, "2.1") is None  # no "check which dims you reduce" for a stack handler's shape error
    left = "Mismatch: BINARY_OP (line 44, offset 16) changed the stack depth by +0, expected -1: 1 value(s) too many left on the stack"
    assert "popped" in symptom_hint(left, "2.1") and symptom_hint(left, "6.1") is None
    jump = "Mismatch: FOR_ITER (line 3, offset 10) jumped to instruction 14, but its target is instruction 13"
    assert "inst.target" in symptom_hint(jump, "2.4")
    assert symptom_hint("IndexError: pop from empty list", "2.4") is None


def test_nbval_runs_a_notebook_in_the_environment_it_was_built_in(tmp_path):
    """A build runs kernels with a fixed string hash seed (set order) and matplotlib config; the nbval
    check must too, or a cell printing a set passes on the build machine and fails in CI at random."""
    import nbformat

    cell = nbformat.v4.new_code_cell("import os\nprint({k: os.environ.get(k) for k in sorted(KEYS)})")
    wanted = notebooks.kernel_env()
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{dict(sorted(wanted.items()))}\n")]
    setup = nbformat.v4.new_code_cell(f"KEYS = {sorted(wanted)!r}")
    setup.execution_count, cell.execution_count = 1, 2
    path = tmp_path / "env.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[setup, cell]), path)
    env = {k: v for k, v in os.environ.items() if k not in wanted}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "--nbval", "--nbval-current-env", str(path)],
                          cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def _graded_module(name: str):
    """A graded test file loaded as a module (its written-down reference values and helpers)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "graded" / f"{name}.py")
    graded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(graded)
    return graded


def test_graded_torch_references_written_down_are_what_torch_reports():
    """Chapter 4's graded tests compare with (graphs, breaks) of torch._dynamo.explain written down for their
    own functions (a TorchDynamo trace per grading run costs a second): they must be what torch says."""
    graded = _graded_module("test_ch04_graph_breaks")
    assert graded.TORCH_EXPLAIN
    for name, counts in graded.TORCH_EXPLAIN.items():
        for x in (torch.randn(5), torch.ones(3), -torch.ones(4)):  # either side of each branch
            assert graded.torch_explain_counts(getattr(graded, name), x) == counts, (name, x)


def test_graded_kernel_counts_written_down_are_what_the_package_scheduler_makes():
    """Chapter 7's graded tests compare kernel counts with ones written down for their own functions: they
    must be what the package's scheduler makes (kernel_count), at the sizes the tests use and others."""
    graded = _graded_module("test_ch07_loop_ir")
    assert graded.KERNELS
    for name, count in graded.KERNELS.items():
        for rows, cols in ((12, 12), (6, 8), (3, 5)):
            args = [graded.randn(rows, cols), graded.randn(cols)]
            assert graded.kernel_count(getattr(graded, name), args) == count, (name, rows, cols)
