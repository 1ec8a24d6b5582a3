#!/usr/bin/env bash
# Run the torch-free bytecode-layer tests, and the torch-free graded tests of the bytecode
# chapter (tests/graded/test_ch01_bytecode.py, on the reference solutions), under the other
# CPython versions found on this machine (3.12, 3.13), each in its own small venv with only
# pytest and bytecode. `python -m course.grade --mutants` uses these venvs too, for wrong
# answers that only show on another version.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {  # the first candidate for version $1 that really runs (pyenv shims may not)
    local candidate
    for candidate in "$HOME"/.pyenv/versions/"$1".*/bin/python "$(command -v "python$1" || true)"; do
        if [ -x "$candidate" ] && "$candidate" -c "pass" 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
}

status=0
for version in 3.12 3.13; do
    python=$(find_python "$version")
    if [ -z "$python" ]; then
        echo "python$version: not found, skipped"
        continue
    fi
    venv=".venv-py${version/./}"
    if [ ! -x "$venv/bin/pytest" ]; then
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install -q pytest bytecode
    fi
    echo "== bytecode tests on $("$venv/bin/python" --version)"
    "$venv/bin/python" -m pytest tests/test_bytecode.py -q -p no:cacheprovider || status=1
    echo "== graded bytecode tests (chapter 1, solutions) on $("$venv/bin/python" --version)"
    "$venv/bin/python" -m pytest tests/graded/test_ch01_bytecode.py -q -p no:cacheprovider \
        --course-mode=solutions || status=1
done
exit $status
