"""What a learner sees, checked rather than assumed: start JupyterLab as ``make course`` would, run a
chapter through the *server's* kernel (REST + the kernel's websocket, as the browser does), and
let a headless Chromium open chapter 0 in the lab and take a screenshot.

The screenshot skips when Chromium is not installed (Debian: ``apt-get install -y chromium``; CI installs it).
The screenshot is kept under ``$TINY_SCREENSHOT_DIR`` when that is set, to look at.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from course.loader import ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(port: int, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method="POST" if body is not None else "GET",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving a copy of the notebooks; yields its port."""
    root = tmp_path_factory.mktemp("lab")
    for name in ("00_why_compile.ipynb", "01_bytecode_and_frames.py"):
        shutil.copy(ROOT / "notebooks" / name, root / name)
    (root / "data").symlink_to(ROOT / "notebooks" / "data")
    settings = root.parent / f"{root.name}-settings"  # a learner's first-visit news prompt would cover the page
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "TINY_COURSE_MODE": "exercises", "JUPYTER_CONFIG_DIR": str(settings / "config"),
           "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(settings / "workspaces")}
    args = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={root}", "--LabApp.news_url=None"]
    if os.geteuid() == 0:
        args.append("--allow-root")  # what `make course` passes as root
    log_path = settings / "server.log"
    log = open(log_path, "w")
    server = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(120):
            try:
                _api(port, "/api/status")
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"JupyterLab exited: {log_path.read_text()[-2000:]}")
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not answer within 60 s")
        yield port, root
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def _execute(ws, session: str, code: str, timeout: float = 600) -> tuple[list[str], dict | None]:
    """Send one execute_request on the kernel's websocket; return (stream texts, error or None)."""
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({
        "header": {"msg_id": msg_id, "username": "test", "session": session, "msg_type": "execute_request",
                   "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    streams, error, idle, replied = [], None, False, False
    deadline = time.monotonic() + timeout
    while not (idle and replied):
        if time.monotonic() > deadline:
            raise TimeoutError(code[:200])
        msg = json.loads(ws.recv())
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            streams.append(msg["content"]["text"])
        elif kind == "error":
            error = msg["content"]
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
        elif kind == "execute_reply":
            replied = True
    return streams, error


def test_a_chapter_runs_through_the_servers_kernel(lab):
    """Chapter 1 with the stubs untouched, cell by cell, in a kernel the server started."""
    import jupytext
    import websocket

    port, root = lab
    kernel = _api(port, "/api/kernels", {"name": "python3", "path": "01_bytecode_and_frames.py"})
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{port}/api/kernels/{kernel['id']}/channels?token={TOKEN}", timeout=600)
    try:
        session, notes, cells = uuid.uuid4().hex, [], 0
        for cell in jupytext.read(root / "01_bytecode_and_frames.py").cells:
            if cell.cell_type != "code":
                continue
            streams, error = _execute(ws, session, cell.source)
            assert error is None, f"cell failed: {error['ename']}: {error['evalue']}\n{cell.source[:300]}"
            notes += [line for text in streams for line in text.splitlines() if " not done yet: " in line]
            cells += 1
        assert cells > 10
        assert notes and all(line.startswith("Exercise 1.") for line in notes), notes
        assert [k["id"] for k in _api(port, "/api/kernels")] == [kernel["id"]]  # it was the server's kernel
    finally:
        ws.close()


def _pixels(path: Path) -> tuple[tuple[int, int], float]:
    from PIL import Image, ImageStat

    with Image.open(path) as image:
        return image.size, max(ImageStat.Stat(image.convert("L")).stddev[0], 0.0)


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium not installed (apt-get install -y chromium)")
def test_chromium_shows_chapter_0_in_the_lab(lab, tmp_path):
    port, root = lab
    shot = Path(os.environ.get("TINY_SCREENSHOT_DIR", tmp_path)) / "jupyterlab_chapter0.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    profile = tmp_path / "chromium-profile"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1400,900",
         "--virtual-time-budget=20000", f"http://127.0.0.1:{port}/lab/tree/00_why_compile.ipynb?token={TOKEN}"],
        check=True, timeout=180, capture_output=True)
    assert shot.exists() and shot.stat().st_size > 20_000, "no screenshot, or a tiny one"
    size, spread = _pixels(shot)
    assert size == (1400, 900)
    assert spread > 20, f"the page looks blank (grey-level spread {spread:.1f})"
