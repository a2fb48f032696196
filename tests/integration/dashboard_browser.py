"""A headless Chromium driven over the DevTools protocol (CDP), for the dashboard tests.

    with HeadlessChromium(tmp_path) as browser:
        page = browser.open("http://127.0.0.1:8600/dashboard#token=...")
        page.eval("document.title")

Only what the tests need: start Chromium with a fresh profile and a debugging port, find
the page's websocket, evaluate JavaScript. Every wait has a deadline; the browser's whole
process group is ended on exit.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from websockets.sync.client import connect

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
]  # fmt: skip


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError("no chromium binary on PATH: `scripts/install.sh --test` installs the Debian package `chromium`")


class Page:
    """One tab, over its CDP websocket."""

    def __init__(self, ws_url: str) -> None:
        self._ws = connect(ws_url, open_timeout=10, max_size=None).__enter__()
        self._ids = itertools.count(1)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 10.0) -> dict[str, Any]:
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"CDP {method} got no answer in {timeout}s")
            reply = json.loads(self._ws.recv(timeout=left))
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"CDP {method}: {reply['error']}")
                return reply.get("result", {})

    def eval(self, expression: str) -> Any:
        """Evaluate ``expression`` in the page; return its JSON value."""
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in res:
            raise RuntimeError(f"page threw: {res['exceptionDetails'].get('text')} in {expression!r}")
        return res["result"].get("value")

    def screenshot(self, path: Path, width: int = 1360) -> Path:
        """Save the whole page (not only the viewport) as a PNG at ``path``."""
        import base64

        height = int(self.eval("Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)") or 800)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": min(max(height, 400), 8000), "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
        shot = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, timeout=30)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def set_width(self, width: int = 1360, height: int = 1000) -> None:
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip

    def mouse_move(self, x: float, y: float) -> None:
        """Move the pointer to page coordinates (x, y), as a user's mouse would."""
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def click(self, selector: str) -> None:
        """Click the centre of the first element matching ``selector`` with a real mouse event."""
        box = self.eval(f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
                        " return [r.left + r.width / 2, r.top + r.height / 2]; })()")  # fmt: skip
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "clickCount": 1,
                                                   "button": "none" if kind == "mouseMoved" else "left"})

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def close(self) -> None:
        self._ws.close()


class HeadlessChromium:
    """A Chromium process of our own (fresh ``--user-data-dir``)."""

    def __init__(self, workdir: Path) -> None:
        self.profile = Path(workdir) / "chromium-profile"
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    def __enter__(self) -> "HeadlessChromium":
        self.profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode} before opening its debugging port")
            if time.monotonic() > deadline:
                self.__exit__()
                raise TimeoutError("chromium did not open its debugging port within 30s")
            time.sleep(0.05)
        self.port = int(port_file.read_text().split()[0])
        return self

    def open(self, url: str) -> Page:
        """Open ``url`` in a new tab and return it."""
        r = httpx.put(f"http://127.0.0.1:{self.port}/json/new?{quote(url, safe='')}", timeout=10)
        r.raise_for_status()
        page = Page(r.json()["webSocketDebuggerUrl"])
        page.call("Runtime.enable")
        deadline = time.monotonic() + 30
        while page.eval("location.href === 'about:blank' || document.readyState !== 'complete'"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish loading within 30s")
            time.sleep(0.05)
        return page

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
