"""Run a demo and save a picture of its live dashboard (``make screenshot``).

    python -m bench.dashboard_screenshot [PATH]     (default docs/dashboard.png)

Starts ``snet demo`` (async mode, three workers, the default job and data) with the HTTP
port on 127.0.0.1, opens the dashboard in headless Chromium, waits until a few epochs have
been cross-validated while training still runs, captures the page, and stops the demo.
Needs Debian's ``chromium``.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from .browser import Browser, find_chromium

WORKERS = 3
EPOCHS = 30
CV_EPOCHS_BEFORE_SHOT = 8


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _capture(url: str, path: Path) -> str:
    async with Browser(width=1400, height=1000) as page:
        for _ in range(100):  # the demo's server needs a moment to listen
            try:
                await page.open(url)
                await page.wait_for("document.body.dataset.events >= 1", 5)
                break
            except Exception:  # not up yet: the page shows an error
                await asyncio.sleep(0.3)
        await page.wait_for(
            f"document.querySelectorAll('#workers tbody tr').length === {WORKERS}", 60
        )
        await page.wait_for(
            f"document.querySelectorAll('.point-cv_accuracy').length >= {CV_EPOCHS_BEFORE_SHOT}",
            180,
        )
        await asyncio.sleep(1.0)  # a few more events, so the rate chart has a history
        await page.screenshot(path)
        summary: str = await page.evaluate(
            "['epoch', 'version', 'rate', 'train', 'cv']"
            ".map((id) => id + ' ' + document.getElementById(id).textContent).join(', ')"
        )
        return summary


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else "docs/dashboard.png")
    if find_chromium() is None:
        print("dashboard_screenshot: chromium is not installed (apt-get install chromium)")
        return 2
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="snet-shot-") as out_dir:
        log = Path(out_dir) / "demo.log"
        demo = subprocess.Popen(
            [
                *(sys.executable, "-m", "snet.cli", "demo", "--mode", "async"),
                *("--workers", str(WORKERS), "--epochs", str(EPOCHS)),
                *("--http-port", str(port), "--out-dir", out_dir),
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        try:
            summary = asyncio.run(_capture(f"http://127.0.0.1:{port}/", path))
        except BaseException:
            print(f"dashboard_screenshot failed; the demo said:\n{log.read_text()[-3000:]}")
            raise
        finally:
            demo.send_signal(signal.SIGTERM)  # graceful: the demo stops its workers too
            try:
                demo.wait(60)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()
    print(f"saved {path} ({summary})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
