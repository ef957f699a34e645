"""A headless Chromium driven over the DevTools protocol (CDP), for looking at the dashboard.

Used by the dashboard's browser test and by ``dashboard_screenshot``. It speaks just
enough CDP over a websocket (aiohttp's client): evaluate JavaScript, capture a screenshot,
and record which URLs the page requested. Chromium runs with a fresh profile, no sandbox
(tests run as root), no GPU and none of its background network traffic, and its debugging
port listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",  # any free port; Chromium writes it to DevToolsActivePort
)
START_SECONDS = 30.0
CALL_SECONDS = 30.0


class BrowserError(Exception):
    """Chromium could not be started, or a DevTools call failed."""


def find_chromium() -> str | None:
    """The Chromium executable on PATH (Debian's package is ``chromium``), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """``async with Browser(width, height) as page:`` one headless Chromium page."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        self.width, self.height = width, height
        self.requested: list[str] = []  # every URL the page asked for, in order
        self._profile = tempfile.TemporaryDirectory(
            prefix="snet-chromium-", ignore_cleanup_errors=True
        )
        self._process: subprocess.Popen[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Browser:
        executable = find_chromium()
        if executable is None:
            raise BrowserError("chromium is not installed (Debian: apt-get install chromium)")
        profile = Path(self._profile.name)
        self._process = subprocess.Popen(
            [
                executable,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={self.width},{self.height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: helpers end with it
        )
        try:
            port = await self._debugging_port(profile / "DevToolsActivePort")
            self._session = aiohttp.ClientSession()
            async with self._session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            page = next(t for t in targets if t.get("type") == "page")
            self._socket = await self._session.ws_connect(
                page["webSocketDebuggerUrl"], max_msg_size=0
            )
            self._reader = asyncio.get_running_loop().create_task(self._read())
            await self.call("Network.enable")
            await self.call("Page.enable")
            await self.call(
                "Emulation.setDeviceMetricsOverride",
                {
                    "width": self.width,
                    "height": self.height,
                    "deviceScaleFactor": 1,
                    "mobile": False,
                },
            )
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._socket is not None:
            await self._socket.close()
        if self._session is not None:
            await self._session.close()
        if self._process is not None:
            self._stop_process_group(self._process)
        # Chromium's helpers may still be writing to the profile as they exit.
        for _ in range(50):
            shutil.rmtree(self._profile.name, ignore_errors=True)
            if not Path(self._profile.name).exists():
                break
            await asyncio.sleep(0.1)
        self._profile.cleanup()

    @staticmethod
    def _stop_process_group(process: subprocess.Popen[bytes]) -> None:
        """SIGTERM to Chromium's group (the browser and the helpers it started), then
        SIGKILL to whatever is left of that group."""
        for signum, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(wait)
                if signum == signal.SIGTERM:
                    time.sleep(0.2)  # let the helpers see their parent go

    async def _debugging_port(self, active_port: Path) -> int:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise BrowserError(f"chromium exited with status {self._process.returncode}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(active_port.read_text().splitlines()[0])
            await asyncio.sleep(0.1)
        raise BrowserError(f"chromium opened no debugging port in {START_SECONDS:.0f} s")

    async def _read(self) -> None:
        assert self._socket is not None
        async for frame in self._socket:
            if frame.type != aiohttp.WSMsgType.TEXT:
                continue
            message = json.loads(frame.data)
            if "id" in message:
                future = self._replies.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
            elif message.get("method") == "Network.requestWillBeSent":
                self.requested.append(message["params"]["request"]["url"])
        for future in self._replies.values():  # the socket closed: no reply will come
            if not future.done():
                future.set_exception(BrowserError("the DevTools connection closed"))

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One CDP command; returns its ``result``."""
        assert self._socket is not None
        call_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[call_id] = future
        await self._socket.send_str(
            json.dumps({"id": call_id, "method": method, "params": params or {}})
        )
        reply = await asyncio.wait_for(future, CALL_SECONDS)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def open(self, url: str) -> None:
        """Navigate and wait until the document has loaded."""
        await self.call("Page.navigate", {"url": url})
        await self.wait_for("document.readyState === 'complete'", 30)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values only)."""
        result = await self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float) -> Any:
        """Poll ``expression`` until it is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out after {timeout:.0f} s waiting for {expression}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> None:
        """The visible page as a PNG file."""
        shot = await self.call("Page.captureScreenshot", {"format": "png"})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
