"""Write ``ch01_listings_<version>.json``: real ``dis`` output and tinydynamo's normalised
listing of every function in ``ch01_examples.py``, for each CPython this machine has.

    python notebooks/data/make_ch01_listings.py            # every interpreter found (3.11-3.13)
    python notebooks/data/make_ch01_listings.py --here     # only the running interpreter

Chapter 1's notebook runs on one Python but shows all three versions' bytecode, so it reads
these files; tests/test_tracer.py checks that a fresh run on each available interpreter
reproduces them (they are generated, never edited by hand).
"""
from __future__ import annotations

import glob
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
VERSIONS = ("3.11", "3.12", "3.13")


def listing_path(version: str) -> str:
    return os.path.join(HERE, f"ch01_listings_py{version.replace('.', '')}.json")


def find_interpreter(version: str) -> str | None:
    """A working python executable for ``version`` (~/.pyenv, then PATH), or None."""
    if sys.version.startswith(version + "."):
        return sys.executable
    candidates = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python")))[::-1]
    candidates += [p for p in [shutil.which(f"python{version}")] if p]
    for python in candidates:  # a pyenv shim may exist on PATH yet refuse to run
        check = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True)
        if check.returncode == 0 and check.stdout.strip() == version:
            return python
    return None


def _sanitise(text: str) -> str:
    """Drop what differs between machines: object addresses and the examples file's path."""
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)
    return text.replace(os.path.join(HERE, "ch01_examples.py"), "ch01_examples.py")


def listings_here() -> dict:
    """Listings for the running interpreter (imports only tinydynamo.bytecode: no torch needed)."""
    import dis

    sys.path.insert(0, ROOT)
    from tinydynamo.bytecode import format_instructions

    spec = importlib.util.spec_from_file_location("ch01_examples", os.path.join(HERE, "ch01_examples.py"))
    examples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(examples)
    out = {"version": "%d.%d.%d" % sys.version_info[:3], "functions": {}}
    for name, fn in vars(examples).items():
        if callable(fn) and getattr(fn, "__module__", None) == "ch01_examples":
            raw = io.StringIO()
            dis.dis(fn, file=raw)
            normalised = format_instructions(fn, show_lines=False)
            for const in fn.__code__.co_consts:  # 3.11's comprehensions are nested code objects
                if hasattr(const, "co_code"):
                    normalised += f"\n  -- nested code object {const.co_name}:\n"
                    normalised += format_instructions(const, show_lines=False)
            out["functions"][name] = {"dis": _sanitise(raw.getvalue()), "normalised": _sanitise(normalised)}
    return out


def main(argv: list[str]) -> int:
    if "--here" in argv:
        data = listings_here()
        with open(listing_path("%d.%d" % sys.version_info[:2]), "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.write("\n")
        print(f"wrote listings for Python {data['version']}")
        return 0
    status = 0
    for version in VERSIONS:
        python = find_interpreter(version)
        if python is None:
            print(f"python{version}: not found, listings kept as they are")
            continue
        status |= subprocess.call([python, os.path.abspath(__file__), "--here"])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
