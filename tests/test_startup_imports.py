"""Each command imports only what it uses (issue 19, start-up): a worker never loads the
server's HTTP stack, ``snet train`` no event loop. Checked in a fresh interpreter, since
this test process has imported everything already."""

from __future__ import annotations

import json
import sys

import pytest

from helpers import run_process

# what each command's path imports (cli/main.py dispatches to these modules)
COMMANDS = {
    "worker": "import snet.cli.main, snet.cli.commands, snet.client.worker, snet.client.joining",
    "train": "import snet.cli.main, snet.cli.train",
    "server": "import snet.cli.main, snet.cli.commands, snet.server.app",
    # the command line as main() builds it for `snet status`: that command's flags alone
    "status": "import snet.cli.parser as p, snet.cli.status; "
    "p.command_parser('status').parse_args(['status'])",
}
# modules a command must not load: (command, module)
NOT_LOADED = [
    ("worker", "aiohttp"),
    ("worker", "snet.server.app"),
    ("worker", "snet.server.config"),  # the server's flags and settings (0.03 s)
    ("worker", "snet.client.spert.backend"),  # the board emulator: `snet spert`'s alone
    ("train", "asyncio"),
    ("train", "aiohttp"),
    ("server", "snet.client.worker"),
    ("status", "numpy"),  # the other commands' flags (their config classes) are not built
    ("status", "aiohttp"),
]


@pytest.mark.system
def test_commands_import_only_what_they_use() -> None:
    loaded = {}
    for command, imports in COMMANDS.items():
        code = f"import sys, json; {imports}; print(json.dumps(sorted(sys.modules)))"
        done = run_process([sys.executable, "-c", code])
        assert done.returncode == 0, done.stderr
        loaded[command] = set(json.loads(done.stdout))
    assert "aiohttp" in loaded["server"]  # the check can see a module that is loaded
    for command, module in NOT_LOADED:
        assert module not in loaded[command], f"{command} imports {module}"


ENTRY = """
import atexit, sys
atexit.register(lambda: print("interpreter teardown ran", flush=True))
sys.argv = ["snet", *sys.argv[1:]]
from snet.cli.main import entry
entry()
"""


@pytest.mark.system
def test_long_running_commands_leave_without_the_interpreter_s_teardown() -> None:
    """A worker (as a server, a board, the demo) leaves with its exit status and its log
    flushed, skipping the teardown that costs 0.15-0.2 s of CPU after numpy and numba;
    the other commands exit as Python does."""
    worker = ["worker", "--server", "127.0.0.1:1", "--retry-seconds", "0"]
    done = run_process([sys.executable, "-c", ENTRY, *worker])
    assert done.returncode == 3, done.stderr  # unreachable: the worker's own status
    assert "cannot reach the server at 127.0.0.1:1" in done.stderr  # the log, flushed
    assert "interpreter teardown ran" not in done.stdout
    status = run_process([sys.executable, "-c", ENTRY, "status", "--url", "http://127.0.0.1:1"])
    assert status.returncode == 1 and "cannot read http://127.0.0.1:1/status" in status.stderr
    assert "interpreter teardown ran" in status.stdout
