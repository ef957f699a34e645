"""The physical reference: a plain TCP receiver that ``recv_into``s a preallocated buffer.

One thread per connection, no framing, no parsing: the fastest way Python can take bytes
off a loopback socket. Prints the port, then, on stdin EOF, the bytes received per
connection and the time between its first and last byte.
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
    total, first, last = 0, 0.0, 0.0
    while True:
        n = connection.recv_into(view)
        if n == 0:
            break
        if total == 0:
            first = time.perf_counter()
        total += n
        last = time.perf_counter()
    results.append({"bytes": total, "seconds": max(last - first, 1e-9)})


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
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
