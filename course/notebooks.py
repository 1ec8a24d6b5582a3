"""Build the course notebooks from their jupytext sources, and check the pairs are in sync.

Each chapter's source of truth is ``notebooks/NN_topic.py`` (jupytext percent format: easy to
diff and review). ``build`` executes it in solutions mode and writes ``NN_topic.ipynb`` with
its outputs, which nbval later compares against; ``check`` fails when an ``.ipynb``'s cells no
longer match its ``.py`` (someone edited one side only).

    python -m course.notebooks build            # all chapters
    python -m course.notebooks build 03 07      # some chapters
    python -m course.notebooks check
    python -m course.notebooks run 00 --mode exercises   # what "Run All" does with the stubs
    python -m course.notebooks run 03 --show             # ... and print every cell's output
    python -m course.notebooks run 03 --save out/        # ... and write the executed notebook to out/
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import sys
import time
from pathlib import Path

from course.loader import ROOT

NOTEBOOKS = ROOT / "notebooks"
FORMATS = "ipynb,py:percent"


def sources(selected: list[str] | None = None) -> list[Path]:
    paths = sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    if selected:
        wanted = {s.zfill(2) for s in selected}
        paths = [p for p in paths if p.name[:2] in wanted]
    return paths


def kernel_env() -> dict[str, str]:
    """What a notebook's kernel needs in its environment to print the same outputs on every run:
    set order (string hashing), and matplotlib's SVG date and ids. A build sets it, and so does the
    nbval check (conftest.py), so that the check runs the notebook as it was built."""
    return {"PYTHONHASHSEED": "0", "SOURCE_DATE_EPOCH": "0", "MPLCONFIGDIR": str(NOTEBOOKS / "data" / "mplconfig")}


def _cells(notebook) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


def execute(path: Path, course_mode: str = "solutions", timeout: int = 900, kernel_manager=None):
    """Run a notebook source top to bottom in ``course_mode``; return the executed notebook.

    ``exercises`` mode is what a learner's "Run All" does: unfinished exercises fall back to the
    package's implementation (see :mod:`course.fallbacks`), so every chapter runs through.
    Raises nbclient's ``CellExecutionError`` (naming the cell) if a cell fails.
    """
    import jupytext
    from nbclient import NotebookClient

    notebook = jupytext.read(path)
    notebook.metadata["jupytext"] = {"formats": FORMATS}
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    env = {"TINY_COURSE_MODE": course_mode, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           **kernel_env()}
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}})
        if kernel_manager is not None:  # a kernel someone else started (e.g. a JupyterLab server's)
            client.km = kernel_manager
        client.execute()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return notebook


def build(path: Path, timeout: int = 900) -> float:
    """Execute one notebook source in solutions mode and write its ``.ipynb``; returns seconds taken."""
    import nbformat

    start = time.perf_counter()
    notebook = execute(path, "solutions", timeout)
    seen: dict[str, int] = {}
    for cell in notebook.cells:  # execution counts, timing metadata and random ids only add diff noise
        cell.metadata.pop("execution", None)
        cell.id = _stable_id(cell.source, seen)
        if cell.cell_type == "code":
            cell.outputs = _merge_streams(cell.outputs)
    nbformat.write(notebook, path.with_suffix(".ipynb"))
    return time.perf_counter() - start


def _merge_streams(outputs: list) -> list:
    """Join neighbouring stdout (or stderr) chunks: how the kernel happened to flush its output
    should not show up as a diff."""
    merged = []
    for out in outputs:
        if merged and out.output_type == "stream" and merged[-1].output_type == "stream" \
                and merged[-1].name == out.name:
            merged[-1].text += out.text
        else:
            merged.append(out)
    return merged


def _stable_id(source: str, seen: dict[str, int]) -> str:
    """A cell id from the cell's source (and how often that source came before): a rebuild gives
    unchanged cells the ids they had, so the ``.ipynb`` diff shows only what changed."""
    digest = hashlib.sha1(source.encode()).hexdigest()[:10]
    seen[digest] = seen.get(digest, 0) + 1
    return digest if seen[digest] == 1 else f"{digest}-{seen[digest]}"


def out_of_sync(paths: list[Path] | None = None) -> list[str]:
    """Chapters whose ``.ipynb`` is missing or whose cells differ from the ``.py`` source."""
    import jupytext

    problems = []
    for path in paths or sources():
        ipynb = path.with_suffix(".ipynb")
        if not ipynb.exists():
            problems.append(f"{ipynb.name} missing")
        elif _cells(jupytext.read(path)) != _cells(jupytext.read(ipynb)):
            problems.append(f"{ipynb.name} differs from {path.name}")
        elif not any(c.get("outputs") for c in jupytext.read(ipynb).cells if c.cell_type == "code"):
            problems.append(f"{ipynb.name} has no outputs")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("build", "check", "run"))
    parser.add_argument("--mode", default="exercises", choices=("exercises", "solutions"),
                        help="course mode for `run` (default: exercises, as a learner's Run All)")
    parser.add_argument("--allow-text-graphs", action="store_true",
                        help="build without Graphviz (graph pictures then stored as DOT text)")
    parser.add_argument("--show", action="store_true",
                        help="with `run`: print each code cell and its text outputs (pictures as a note)")
    parser.add_argument("--save", metavar="DIR",
                        help="with `run`: write each executed notebook (outputs included) to DIR/NN_topic.ipynb")
    parser.add_argument("chapters", nargs="*", help="two-digit chapter numbers (default: all)")
    args = parser.parse_args(argv)
    paths = sources(args.chapters)
    if not paths:
        print(f"no notebook sources match {args.chapters}")
        return 1
    if args.command == "run":
        return run_all(paths, args.mode, show=args.show, save=Path(args.save) if args.save else None)
    if args.command == "build":
        if shutil.which("dot") is None and not args.allow_text_graphs:
            print("building needs Graphviz's `dot`, so that graph pictures are stored as SVG, not DOT text: "
                  "apt-get install -y graphviz (or brew/conda install graphviz); --allow-text-graphs builds anyway")
            return 1
        for path in paths:
            seconds = build(path)
            print(f"built {path.with_suffix('.ipynb').relative_to(ROOT)} in {seconds:.1f}s")
        return 0
    bad = out_of_sync(paths)
    for problem in bad:
        print(problem)
    if bad:
        print("fix: python -m course.notebooks build " + " ".join(sorted({p[:2] for p in bad})))
        return 1
    print(f"{len(paths)} notebooks in sync with their sources")
    return 0


def show_outputs(notebook) -> str:
    """The executed notebook as text: each code cell, then its printed output, results and errors."""
    parts = []
    for number, cell in enumerate(c for c in notebook.cells if c.cell_type == "code"):
        parts.append(f"---- [{number + 1}] " + "-" * 60 + "\n" + cell.source.strip())
        for out in cell.outputs:
            if out.output_type == "stream":
                parts.append(out.text.rstrip())
            elif out.output_type in ("execute_result", "display_data"):
                data = out.get("data", {})
                if "text/plain" in data and not any(k.startswith("image/") for k in data):
                    parts.append(data["text/plain"].rstrip())
                else:
                    kinds = ", ".join(sorted(k for k in data if k != "text/plain"))
                    parts.append(f"[a picture ({kinds}): open the saved notebook (--save DIR) in JupyterLab or VS Code]")
            elif out.output_type == "error":
                parts.append(f"{out.ename}: {out.evalue}")
    return "\n".join(parts)


def run_all(paths: list[Path], course_mode: str, show: bool = False, save: Path | None = None) -> int:
    """Execute each notebook; print the unfinished-exercise notes it showed (``show``: every output too;
    ``save``: write the executed notebooks there, the sources and stored notebooks stay untouched)."""
    import nbformat
    from nbclient.exceptions import CellExecutionError

    failed = 0
    for path in paths:
        start = time.perf_counter()
        try:
            notebook = execute(path, course_mode)
        except CellExecutionError as error:
            failed += 1
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()
            print(f"FAIL {path.name} ({course_mode} mode):\n" + "\n".join(text[:12] + ["..."] + text[-8:]))
            continue
        if show:
            print(show_outputs(notebook))
        if save is not None:
            save.mkdir(parents=True, exist_ok=True)
            nbformat.write(notebook, save / path.with_suffix(".ipynb").name)
            print(f"wrote {save / path.with_suffix('.ipynb').name} (open it to see the outputs, pictures included)")
        notes = sorted({line for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs
                        if out.output_type == "stream" for line in out.text.splitlines() if " not done yet: " in line})
        print(f"ok   {path.name} ({course_mode} mode) in {time.perf_counter() - start:.0f}s, "
              f"{len(notes)} exercise(s) standing in")
        for note in notes:
            print(f"       {note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
