"""Pytest plumbing shared by all tests; stays torch-free so the bytecode tests run on any Python.

``--course-mode`` selects the learner's exercises or the reference solutions for graded tests
(default: the ``TINY_COURSE_MODE`` environment variable, else exercises, as for the notebooks;
the test command passes ``--course-mode=solutions``). Task markers ``chNN_M`` name chapter NN, task M.
"""
from __future__ import annotations

import os
import re

import pytest

_TASK_EXPRESSION = re.compile(r"^\s*ch\d\d_\d+(\s+or\s+ch\d\d_\d+)*\s*$")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # the bytecode tests run on Pythons without torch
        return False
    return torch.cuda.is_available()


# Without CUDA, Triton kernels can only run in Triton's interpreter, and TRITON_INTERPRET is read
# when `triton.language` is first imported (its own @triton.jit helpers are decorated then). Any
# test may import triton first (torch.compile does), so switch it on before any test runs.
if "TRITON_INTERPRET" not in os.environ and not _cuda_available():
    os.environ["TRITON_INTERPRET"] = "1"

# Every kernel tininductor reuses for a group of the same structure (another layer's) is generated
# anyway and compared with the one reused (tininductor.config.check_kernel_reuse).
os.environ.setdefault("TINY_CHECK_KERNEL_REUSE", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--course-mode",
        choices=("exercises", "solutions"),
        default=None,
        help="load graded modules from exercises/ or solutions/ (default: $TINY_COURSE_MODE, else exercises)",
    )
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_configure(config):
    chosen = config.getoption("--course-mode") or os.environ.get("TINY_COURSE_MODE") or "exercises"
    os.environ["TINY_COURSE_MODE"] = chosen
    if getattr(config.option, "nbval", False) or getattr(config.option, "nbval_lax", False):
        from course.notebooks import kernel_env

        os.environ.update(kernel_env())  # nbval's kernels inherit it: they run as the build did
    for chapter in range(20):  # every chapter the course has, and room for more
        for task in range(1, 10):
            config.addinivalue_line("markers", f"ch{chapter:02d}_{task}: graded task {task} of chapter {chapter}")
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "slow: longer runs, skipped unless --runslow")


def pytest_collection_modifyitems(config, items):
    import pytest

    if not config.getoption("--runslow"):
        skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip_slow)
    if any("gpu" in item.keywords for item in items):
        import torch

        if not torch.cuda.is_available():
            skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
            for item in items:
                if "gpu" in item.keywords:
                    item.add_marker(skip_gpu)


def pytest_ignore_collect(collection_path, config):
    """``pytest -m ch03_2`` (task markers only): collect just those chapters' graded test files.

    Without this, pytest imports every test module (torch, the compiler, every chapter) only to
    deselect all but a handful of tests; with it, grading one task takes seconds.
    """
    expression = config.getoption("markexpr", "") or ""
    if not _TASK_EXPRESSION.match(expression) or collection_path.is_dir():
        return None
    chapters = set(re.findall(r"ch\d\d", expression))
    graded = collection_path.parent.name == "graded" and collection_path.parent.parent.name == "tests"
    if graded and collection_path.name.startswith("test_") and collection_path.name.split("_")[1] in chapters:
        return None
    return True


def _graded_task(item) -> str | None:
    """``"2.1"`` for a test marked ``ch02_1``, else None."""
    for mark in item.iter_markers():
        match = re.fullmatch(r"ch(\d\d)_(\d+)", mark.name)
        if match:
            return f"{int(match[1])}.{int(match[2])}"
    return None


def _wrap_report(item, call, report):
    task = _graded_task(item)
    if task is None or not report.failed or call.excinfo is None:
        return
    from course.testing import explain_failure

    first = explain_failure(task, call.excinfo.value)
    if first:  # the line the score table and pytest's summary show first; the full report follows
        report.longrepr = f"{first}\n\n{report.longrepr}"


try:
    import pytest as _pytest

    def pytest_runtest_setup(item):
        """Each graded test starts with no stub seen raising (see course.loader.raised_stubs)."""
        if _graded_task(item) is not None:
            from course.loader import reset_raised_stubs

            reset_raised_stubs()

    @_pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        """Graded tests: an unfinished stub reads as the exercise's own text; known symptoms get a hint."""
        outcome = yield
        _wrap_report(item, call, outcome.get_result())
except ImportError:  # pragma: no cover - pytest is always there when conftest runs
    pass


@pytest.fixture(autouse=True)
def _triton_backend_on_cuda(request):
    """A test parametrized with ``backend="triton"`` makes its tensors on the GPU where there is one:
    Triton's interpreter (CPU tensors) cannot share a process with real CUDA kernels, so on a GPU
    machine the same test runs the real Triton path instead, with TF32 off."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None or callspec.params.get("backend") != "triton" or not _cuda_available():
        yield
        return
    import torch  # only here: this file stays torch-free for the bytecode tests

    tf32 = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.set_default_device("cuda")
    # fp32 means fp32, as on the CPU: TF32 convolutions round differently in another layout
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_default_device(None)
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32
