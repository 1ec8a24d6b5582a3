"""Run PyTorch's own test/dynamo files against tinydynamo and print the pass counts next to torch's.

The files live in ``shared/torch_dynamo_tests`` (PyTorch's, BSD licence) and are run from there,
never copied: ``python -m tests.dynamo_suite.run [files...] [--dir DIR] [--timeout S] [--torch]``.
Each file runs in its own pytest subprocess, with a per-file timeout, under the plugin
:mod:`tests.dynamo_suite.shim` (which routes ``torch.compile`` / ``torch._dynamo.optimize`` to
tinydynamo). torch's counts come from the folder's README baseline table (torch 2.13), or from
running the same files with the real ``torch._dynamo`` (``--torch``).

Per file: tests collected, tinydynamo's passes, torch's passes, and tinydynamo's passes among the
tests torch passes (those in ``torch_baseline_failures.txt`` fail on torch too). ``--clusters N``
prints the N most common first lines of tinydynamo's failures: the families to fix.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT.parent.parent / "shared" / "torch_dynamo_tests" if (ROOT.parent.parent / "shared").is_dir() \
    else ROOT.parent / "shared" / "torch_dynamo_tests"
FILES = ["test_sources.py", "test_python_autograd.py", "test_global.py", "test_exceptions.py",
         "test_functions.py", "test_generator.py", "test_misc_subset.py", "test_repros_subset.py"]


def find_dir(given: str | None) -> Path:
    for d in ([Path(given)] if given else []) + [Path(os.environ.get("TORCH_DYNAMO_TESTS", "")),
                                                   DEFAULT_DIR, ROOT / "shared" / "torch_dynamo_tests",
                                                   Path("/work/shared/torch_dynamo_tests")]:
        if str(d) and (d / "test_functions.py").is_file():
            return d.resolve()
    sys.exit("PyTorch's dynamo test files not found: pass --dir shared/torch_dynamo_tests")


def run_file(directory: Path, name: str, timeout: float, tiny: bool) -> dict:
    """Run one file with pytest in a subprocess: {test id: outcome} (+ '__error__' on a crash or timeout)."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "out.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", name, f"--junitxml={xml}"]
        if tiny:
            cmd[4:4] = ["-p", "tests.dynamo_suite.shim"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        start = time.time()
        try:
            subprocess.run(cmd, check=False, cwd=directory, env=env, timeout=timeout, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return {"__error__": f"timed out after {timeout:.0f} s", "__wall__": time.time() - start}
        if not xml.exists():
            return {"__error__": "no result (pytest crashed)", "__wall__": time.time() - start}
        return {**parse_junit(xml), "__wall__": time.time() - start}


def parse_junit(xml: Path) -> dict:
    """{'file::Class::test': (outcome, first line of the message)}; outcome passed/failed/skipped."""
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        test_id = f"{parts[0]}.py::{'::'.join(parts[1:] + [case.get('name')])}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", (child.get("message") or "").strip().splitlines()[0:1]
                message = message[0] if message else ""
            elif child.tag == "skipped":
                outcome = "skipped"  # skip and xfail
        results[test_id] = (outcome, message)
    return results


def baseline(directory: Path) -> tuple[dict[str, int], set[str]]:
    """torch's passes per file (the README's table) and the ids torch fails."""
    passes = {}
    for line in (directory / "README.md").read_text().splitlines():
        m = re.match(r"\|\s*(test_\w+\.py)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|", line)
        if m:
            passes[m.group(1)] = int(m.group(3))
    failing = set()
    for line in (directory / "torch_baseline_failures.txt").read_text().splitlines():
        if line.startswith("test_") and "::" in line:
            failing.add(line.split("|")[0].strip())
    return passes, failing


def cluster(message: str) -> str:
    """A failure message with its specifics (names, numbers, quoted text) cut, for counting families."""
    message = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message)
    message = re.sub(r"\b0x[0-9a-f]+\b|\b\d+(\.\d+)?\b", "N", message)
    return message[:150]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", default=FILES)
    parser.add_argument("--dir", help="the folder holding PyTorch's test/dynamo files")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per file")
    parser.add_argument("--torch", action="store_true", help="also run the files with torch._dynamo")
    parser.add_argument("--clusters", type=int, default=0, help="print the N largest failure families")
    parser.add_argument("--failures", action="store_true", help="list every failing test id")
    args = parser.parse_args(argv)
    directory = find_dir(args.dir)
    torch_passes, torch_failing = baseline(directory)
    head = f"{'file':24} {'tests':>5} {'tiny':>5} {'torch':>5} {'tiny∩torch':>10} {'wall s':>7}  note"
    print(head)
    print("-" * len(head), flush=True)
    total = collections.Counter()
    families = collections.Counter()
    failed_ids = []
    for name in args.files:
        tiny = run_file(directory, name, args.timeout, tiny=True)
        note = tiny.pop("__error__", "")
        wall = tiny.pop("__wall__")
        if args.torch:
            ran = run_file(directory, name, args.timeout, tiny=False)
            ran.pop("__wall__")
            theirs = sum(o == "passed" for o, _ in ran.values() if isinstance(o, str))
        else:
            theirs = torch_passes.get(name, 0)
        passed = {t for t, (o, _) in tiny.items() if o == "passed"}
        both = {t for t in passed if t not in torch_failing}
        for t, (o, msg) in tiny.items():
            if o == "failed" and t not in torch_failing:
                families[cluster(msg)] += 1
                failed_ids.append(f"{t}  |  {msg[:160]}")
        row = (len(tiny), len(passed), theirs, len(both))
        total.update(dict(zip(("tests", "tiny", "torch", "both"), row)))
        print(f"{name:24} {row[0]:5} {row[1]:5} {row[2]:5} {row[3]:10} {wall:7.1f}  {note}", flush=True)
    print("-" * len(head))
    print(f"{'total':24} {total['tests']:5} {total['tiny']:5} {total['torch']:5} {total['both']:10}")
    if args.clusters:
        print(f"\nlargest failure families (tests torch passes), of {sum(families.values())}:")
        for msg, n in families.most_common(args.clusters):
            print(f"{n:4}  {msg}")
    if args.failures:
        print("\n".join(["", "failing (torch passes):"] + failed_ids))


if __name__ == "__main__":
    main()
