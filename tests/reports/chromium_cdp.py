"""A minimal DevTools-protocol driver for headless Chromium: open a file, collect console errors,
exceptions, dialogs and every network request, evaluate JS, take a full-page screenshot."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websocket  # websocket-client

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio", "--no-default-browser-check",
    "--remote-debugging-port=0", "--remote-allow-origins=*",
]


@dataclass
class PageRun:
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)


class Chromium:
    """One headless browser with one page session (use as a context manager)."""

    def __init__(self, binary: str, width: int = 1280, height: int = 900) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="tk-chromium-", ignore_cleanup_errors=True)
        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.tmp.name}", f"--window-size={width},{height}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True)  # its own process group: the renderer/GPU/crashpad children end with it
        url = self._devtools_url()
        self.ws = websocket.create_connection(url, timeout=60, suppress_origin=True)
        self._id = 0
        self.run = PageRun()
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=True)

    def _devtools_url(self) -> str:
        deadline = time.monotonic() + 60
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                return m.group(1)
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError("chromium did not report a DevTools endpoint")

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False,
             timeout_s: float = 60) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)
        raise TimeoutError(method)

    def _event(self, ev: dict[str, Any]) -> None:
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.run.console_errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.run.exceptions.append(str(d.get("exception", {}).get("description") or d.get("text")))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            self.run.console_errors.append(f"{p['entry'].get('source')}: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        elif method == "Page.javascriptDialogOpening":
            self.run.dialogs.append(p.get("message", ""))
            self.ws.send(json.dumps({"id": 10**9 + len(self.run.dialogs), "method": "Page.handleJavaScriptDialog",
                                     "params": {"accept": True}, "sessionId": self.session}))
        elif method == "Network.requestWillBeSent":
            self.run.requests.append(p.get("request", {}).get("url", ""))
        elif method == "Network.loadingFailed":
            self.run.failed_requests.append(f"{p.get('errorText')} {p.get('blockedReason', '')}")

    def open(self, path: Path, ready_js: str, timeout_s: float = 90) -> None:
        """Navigate to a local file and wait until `ready_js` evaluates truthy."""
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.eval(ready_js):
                return
            time.sleep(0.25)
        raise TimeoutError(f"page never became ready: {ready_js}")

    def eval(self, expr: str) -> Any:
        res = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"evaluate failed: {res['exceptionDetails']}")
        return res.get("result", {}).get("value")

    def screenshot(self, out: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=True)
        out.write_bytes(base64.b64decode(data["data"]))
        return out

    def drain(self, seconds: float = 0.5) -> None:
        """Let late events (console errors after drawing) arrive."""
        self.ws.settimeout(seconds)
        try:
            while True:
                self._event(json.loads(self.ws.recv()))
        except websocket.WebSocketTimeoutException:
            pass
        finally:
            self.ws.settimeout(60)

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self._stop_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._stop_group(signal.SIGKILL)
                self.proc.wait(timeout=10)
            # helpers of the browser may still be flushing into the profile for a moment (seen in CI:
            # "Directory not empty: 'Default'"); the profile is scratch, so retry, then let it go
            for _ in range(20):
                try:
                    shutil.rmtree(self.tmp.name)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            self.tmp.cleanup()

    def _stop_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
