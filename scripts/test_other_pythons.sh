#!/usr/bin/env bash
# Run the torch-free bytecode-layer tests under the other CPython versions found on this
# machine (3.12, 3.13), each in its own small venv with only pytest and bytecode.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for version in 3.12 3.13; do
    python=$(command -v "python$version" || ls -d "$HOME"/.pyenv/versions/"$version".*/bin/python 2>/dev/null | tail -n 1 || true)
    if [ -z "$python" ]; then
        echo "python$version: not found, skipped"
        continue
    fi
    venv=".venv-py${version/./}"
    [ -x "$venv/bin/pytest" ] || { "$python" -m venv "$venv" && "$venv/bin/python" -m pip install -q pytest bytecode; }
    echo "== bytecode tests on $("$venv/bin/python" --version)"
    "$venv/bin/python" -m pytest tests/test_bytecode.py -q -p no:cacheprovider || status=1
done
exit $status
