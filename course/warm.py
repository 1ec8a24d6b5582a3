"""A warm grading process: torch and the compiler imported once, then forked for each grading run.

Importing torch and the compiler is most of a cold ``python -m course.grade ch03.2``: seconds of
CPU, and many more on a machine busy with other work, while the tests of one task take well under
a second. So a grading run from a terminal also starts, in the background, a process that imports
what the graded tests import and then waits on a Unix socket. The next run hands it its arguments,
working folder, environment and its own stdin/stdout/stderr; the process forks a child that runs
exactly what a cold run runs (``course.grade.main``: a fresh pytest session that reads the test
files, the conftest and your exercise file anew) with the output going straight to your terminal,
and sends back the exit status.

The warm process serves one checkout, Python and environment (the socket's name is a hash of them),
runs nothing but imports before it forks (a parent that ran torch ops would hand its children
thread pools that do not survive a fork), and exits when a module it imported from outside the
standard library and site-packages (the course, tinydynamo, tininductor) changes on disk (checked at
each request: that run then grades cold and starts a fresh one), when its checkout is gone, or after
``IDLE_SECONDS`` without a request.
It is used when stdout is a terminal or ``TINY_COURSE_WARM=1``; ``TINY_COURSE_WARM=0`` turns it off.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

from course.loader import ROOT

ENV_SWITCH = "TINY_COURSE_WARM"
IDLE_SECONDS = 20 * 60
CHECK_SECONDS = 30  # how often an idle warm process looks for changed code
#: the environment that decides what the warm process imported (its Python path, torch's and Triton's
#: switches); a run with other values gets a process of its own
KEY_ENV_PREFIXES = ("PYTHON", "TORCH", "TRITON", "TINY", "CUDA", "OMP", "MKL", "LD_")
#: modules the graded tests reach only while they run (a compile makes a ShapeEnv, which imports torch._dynamo;
#: torch.compile's first call imports distributed tensor's context parallelism, 0.35 s; generated Triton
#: kernels run in the interpreter import Triton's code generator, 0.3 s, and sympy's combinatorics, 0.15 s)
LATE_IMPORTS = ("torch._dynamo", "torch.fx.experimental.proxy_tensor", "torch._functorch.aot_autograd",
                "tinydynamo.symbolic_convert", "tinydynamo.eval_frame", "tinydynamo.tracer", "sympy",
                "torch.distributed.tensor.experimental", "torch._dynamo.backends.debugging", "torch.export._trace",
                "triton.compiler.code_generator", "sympy.combinatorics", "tininductor.codegen.triton",
                "tininductor.codegen.cpp", "pdb")

#: True in a child of the warm process (it grades; it must not ask the warm process again)
in_child = False


def wanted() -> bool:
    """Grade through the warm process? In a terminal by default; ``TINY_COURSE_WARM`` 1/0 forces it."""
    switch = os.environ.get(ENV_SWITCH, "").strip()
    if in_child or switch == "0":
        return False
    return switch == "1" or sys.stdout.isatty()


def socket_path() -> Path:
    """One socket per user, checkout, Python, Python path and relevant environment."""
    env = sorted((k, v) for k, v in os.environ.items()
                 if k.startswith(KEY_ENV_PREFIXES) and k not in (ENV_SWITCH, "TINY_COURSE_MODE"))
    key = json.dumps([str(ROOT), sys.executable, sys.path, env])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"tiny-course-grade-{os.getuid()}-{digest}.sock"


# ---- the client: a grading run -----------------------------------------------------------------


def grade(argv: list[str]) -> int | None:
    """Run ``course.grade`` with ``argv`` in the warm process; its exit status, or None when there is
    none to use (then the caller grades cold, and a warm process is started for the next run)."""
    path = socket_path()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(str(path))
    except OSError:  # none yet, or one that died: start one for the next run
        client.close()
        start(path)
        return None
    with client:
        request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode() + b"\n"
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            socket.send_fds(client, [request], [0, 1, 2])
            reader = client.makefile("rb")
            first = reader.readline().decode().split()
            if first[:1] != ["PID"]:  # "STALE": the process exited, its modules changed on disk
                start(path)
                return None
            child = int(first[1])
            try:
                last = reader.readline().decode().split()
            except KeyboardInterrupt:  # Ctrl-C reaches this process only: pass it on, then wait
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGINT)
                last = reader.readline().decode().split()
        except OSError:
            return None
    if last[:1] != ["EXIT"]:  # the child died without a status (never seen): grade cold
        return None
    return int(last[1])


def start(path: Path) -> None:
    """Start the warm process for ``path`` in the background (it outlives this run)."""
    with contextlib.suppress(OSError):
        subprocess.Popen([sys.executable, "-m", "course.warm", str(path)], cwd=os.getcwd(),
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)


# ---- the server: the warm process --------------------------------------------------------------


def warm_imports() -> None:
    """Import what the graded tests import (their modules' imports, pytest and its plugins), never
    running an op. Triton reads TRITON_INTERPRET when first imported: set it as the conftest does."""
    if "TRITON_INTERPRET" not in os.environ:
        try:
            import torch
            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        if not cuda:
            os.environ["TRITON_INTERPRET"] = "1"
    from importlib.metadata import entry_points

    names = ["pytest", "torch", "torch.fx", "hypothesis", "course.testing", "course.grade", *LATE_IMPORTS]
    names += [e.value.split(":")[0] for e in entry_points(group="pytest11")]  # pytest loads them each session
    for test_file in sorted((ROOT / "tests" / "graded").glob("test_ch*.py")):
        names += _imports_of(test_file)
    for name in dict.fromkeys(names):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing optional module: the child imports (and reports) it
            pass
    _collect_hypothesis_constants()


#: Hypothesis draws examples from the constants in the source of every non-library module loaded (the
#: compiler's and the course's, thousands of files): its first draw in a process scans them (0.4 s);
#: the warm process scans once, so a graded run scans only the modules it loads itself
HYPOTHESIS_CONSTANTS = ("hypothesis.internal.conjecture.providers", "_get_local_constants")


def _collect_hypothesis_constants() -> None:
    module, function = HYPOTHESIS_CONSTANTS
    try:
        with warnings.catch_warnings():  # "slow code in plugin": its pytest plugin is imported, not yet configured
            warnings.simplefilter("ignore")
            getattr(importlib.import_module(module), function)()
    except Exception:  # noqa: BLE001 - another Hypothesis version: each run scans for itself, as without this
        pass


def _imports_of(path: Path) -> list[str]:
    """The modules a file imports at its top level."""
    names = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def _watched() -> dict[str, float]:
    """mtime of every imported module file outside the standard library and site-packages."""
    skip = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    found = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file:
            continue
        real = os.path.realpath(file)
        if not any(real.startswith(s + os.sep) for s in skip) and os.path.exists(real):
            found[real] = os.stat(real).st_mtime
    return found


def _changed(watched: dict[str, float]) -> bool:
    for file, mtime in watched.items():
        try:
            if os.stat(file).st_mtime != mtime:
                return True
        except OSError:
            return True
    return False


def _bind(path: Path) -> socket.socket | None:
    """Listen on ``path``; None when another live warm process already does."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o077)  # only this user may connect
    try:
        server.bind(str(path))
    except OSError:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            probe.close()
            return None  # alive
        except OSError:  # a socket file left by a process that died
            path.unlink(missing_ok=True)
            server.bind(str(path))
    finally:
        os.umask(old_umask)
    server.listen(8)
    return server


def serve(path: Path) -> None:
    """Bind first (a run that comes while the imports load waits for them), import, then fork per run."""
    import gc

    server = _bind(path)
    if server is None:
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` it: the finally below removes the socket
    listening = True

    def stop_listening() -> None:  # before a stale process answers: the fresh one the run starts may bind
        nonlocal listening
        if listening:
            listening = False
            server.close()
            path.unlink(missing_ok=True)

    try:
        warm_imports()
        watched = _watched()
        gc.collect()
        gc.freeze()  # the imported objects are never collected: the children's collections skip them
        server.settimeout(CHECK_SECONDS)
        idle = 0.0
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:  # quit once idle long enough, or as soon as the code or the checkout changes
                idle += CHECK_SECONDS
                if idle >= IDLE_SECONDS or _changed(watched) or not (ROOT / "course").is_dir():
                    return
                continue
            idle = 0.0
            with conn:
                conn.settimeout(None)
                if _changed(watched):
                    stop_listening()
                    conn.sendall(b"STALE\n")
                    return
                _serve_one(conn)
    finally:
        stop_listening()


def _serve_one(conn: socket.socket) -> None:
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return
    request = json.loads(message.decode())
    pid = os.fork()
    if pid == 0:
        _child(request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"PID {pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    conn.sendall(f"EXIT {code if code >= 0 else 128 - code}\n".encode())


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become the grading run the client would have been, run it, exit."""
    global in_child
    code = 1
    try:
        in_child = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [sys.argv[0], *request["argv"]]
        sys.stdout.reconfigure(line_buffering=os.isatty(1))
        from course import grade  # here, not at the top: course.grade imports this module

        try:
            code = grade.main(request["argv"])
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if not isinstance(done.code, (int, type(None))):
                print(done.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - report it on the client's stderr, as a cold run would
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":
    from course import warm  # this file as course.warm, not __main__: course.grade reads warm.in_child

    warm.serve(Path(sys.argv[1]))
