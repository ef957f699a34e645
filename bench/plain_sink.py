"""The physical reference: a plain TCP receiver that ``recv_into``s a preallocated buffer.

One thread per connection, no framing, no parsing: the fastest way Python can take bytes
off a loopback socket. Prints the port, then, on stdin EOF, the bytes received per
connection, the time between its first and last byte, and the process's CPU time (all
its threads) over that time.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time


def _drain(connection: socket.socket, results: list[dict[str, float]]) -> None:
    buffer = bytearray(4 << 20)
    view = memoryview(buffer)
    total, first, last, cpu_at_first = 0, 0.0, 0.0, 0.0
    while True:
        n = connection.recv_into(view)
        if n == 0:
            break
        if total == 0:
            first = time.perf_counter()
            cpu_at_first = time.process_time()
        total += n
        last = time.perf_counter()
    results.append(
        {"bytes": total, "seconds": max(last - first, 1e-9), "cpu_at_first": cpu_at_first}
    )


def main() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    results: list[dict[str, float]] = []
    threads: list[threading.Thread] = []
    listener.settimeout(0.2)

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=_drain, args=(connection, results), daemon=True)
            thread.start()
            threads.append(thread)

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()  # the harness closes stdin once its clients are done
    for thread in threads:
        thread.join(10)
    listener.close()
    # The clients are done before stdin closes, so the CPU time from the first byte to now
    # is what receiving took (the waits in between cost none).
    # Connections that received nothing have no first byte and are left out.
    firsts = [r["cpu_at_first"] for r in results if r["bytes"] > 0]
    started = min(firsts, default=time.process_time())
    cpu = time.process_time() - started
    print(json.dumps({"connections": results, "cpu_seconds": cpu}), flush=True)


if __name__ == "__main__":
    main()
