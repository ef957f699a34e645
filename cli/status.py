"""``snet status``: a server's /status as a readable table, or as JSON; ``--watch`` follows
the server's /events, showing a reading at most every ``--interval`` seconds, until the run
ends (and shows how it ended: the stream's last document). Epochs arrive numbered from 1,
as /status gives them. Ctrl-C ends a watch with status 0
(SIGTERM: one line, 143, as any command's); a reader that goes away (``snet status | head
-3``) ends it quietly. On a terminal each reading replaces the last (the screen is
cleared); in a pipe or a file they follow one another, a blank line between, no escapes.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from snet.protocol.worker_name import printable
from snet.transport.tls import refusal

from .event_stream import https_context, open_events, open_page, status_events
from .progress_bar import clock, detach_stdout, on_terminal


def fetch_status(
    url: str, timeout: float = 5.0, token: str = "", tls_ca: str = ""
) -> dict[str, Any]:
    """GET ``url``/status (with ``token``: as ``Authorization: Bearer``; with ``tls_ca``:
    an https server's certificate must be signed by that CA)."""
    with open_page(url, "/status", token, tls_ca, timeout, {}) as response:
        document: dict[str, Any] = json.load(response)
        return document


def held_weights_note(document: dict[str, Any]) -> str:
    """The CV of the weights held, when newbob rolled the newest epoch back."""
    held = document.get("weights_cv_accuracy")  # older servers do not send it
    if held is None or held == document["cv_accuracy"]:
        return ""
    return f" (rolled back; weights held {_percent(held)})"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _compression_line(total: dict[str, Any] | None) -> list[str]:
    """The compression ledger's totals in one line (none before any update)."""
    if not total or not total.get("updates"):
        return []
    codecs = ", ".join(f"{codec} x{n}" for codec, n in total["update_codecs"].items())
    shared = total.get("weights_shared") or 0  # through the weights board: not on the wire
    boards = total.get("updates_shared") or 0  # through the update boards
    if set(total["update_codecs"]) <= {"none"}:  # its "1.0x fewer bytes" said nothing
        said = f"compression: none, {total['bytes_per_update']} B an update on the wire"
    else:
        said = (f"compression: updates {codecs}, {total['bytes_per_update']} B each, "
                f"{total['received_ratio']}x fewer bytes received, {total['sent_ratio']}x "
                "sent")  # fmt: skip
    return [
        said
        + (f"; {shared} weights copies through the board" if shared else "")
        + (f"; {boards} updates through update boards" if boards else "")
    ]


def _work_line(document: dict[str, Any]) -> str:
    """Updates applied and refused; np's workers send none: its bunches (each one partial
    answer a slice holder, which ``updates_applied`` counts)."""
    if document["mode"] == "np":
        return f"{document['steps']} bunches, {document['updates_rejected']} answers refused"
    return f"{document['updates_applied']} updates applied, {document['updates_rejected']} refused"


def render(document: dict[str, Any]) -> str:
    """The status document as a few lines and two tables (three with emulated boards)."""
    lines = [
        f"server {document['server']} ({document['state']}), {document['mode']} mode, "
        f"network {document['network']}",
        *_progress_line(document),
        f"epoch {document['epoch']}/{document['epochs_planned']}, "
        f"version {document['weight_version']}, {_work_line(document)}, "
        f"lr {document['learning_rate']:g}",
        f"train accuracy {_percent(document['train_accuracy'])}, "
        f"CV accuracy {_percent(document['cv_accuracy'])}{held_weights_note(document)}, "
        f"staleness mean {document['staleness_mean']} max {document['staleness_max']}, "
        f"{document['mcups']} MCUPS",
        "queues: " + ", ".join(f"{k} {v}" for k, v in document["queues"].items()),
        *_block_line(document.get("rule")),
        *_compression_line(document.get("compression")),
        "",
        f"{'epoch':>5} {'lr':>8} {'train':>8} {'cv':>8} {'seconds':>8}",
    ]
    for epoch in document["epochs"]:
        lines.append(
            f"{epoch['epoch']:>5} {epoch['learning_rate']:>8g} "
            f"{_percent(epoch['train_accuracy']):>8} {_percent(epoch['cv_accuracy']):>8} "
            f"{epoch['seconds']:>8.1f}"
        )
    lines += [
        "",
        f"{'worker':<22} {'backend':<8} {'state':<9} {'address':<22} {'updates':>8} "
        f"{'stale':>6} {'MCUPS':>8} {'seen':>7}",
    ]
    now = time.time()
    for row in document["workers"]:
        lines.append(
            f"{row['name']:<22.22} {row['backend']:<8} {row['state']:<9} {row['address']:<22} "
            f"{row['updates_sent']:>8} {row['staleness_mean']:>6.2f} {row['mcups']:>8.1f} "
            f"{now - row['last_seen']:>6.1f}s"
        )
    lines += _board_lines(document["workers"])
    # what workers named themselves (their backend, say) as escapes, not terminal controls
    return "\n".join(map(printable, lines))


def _block_line(rule: object) -> list[str]:
    """bmuf: the block filter's figures (server/block_filter.py), as the dashboard shows
    them; np's rule is a plain name, other modes have none. A server before 2026-11-28
    says nothing of the blocks' length nor of overlap."""
    if not isinstance(rule, dict) or "filter" not in rule:
        return []
    from snet.protocol.modes import block_length, blocks_said  # bmuf's: status starts light

    length = (
        block_length(rule["block_bunches"], rule.get("block_seconds", 0.0))
        if "block_bunches" in rule
        else ""
    )
    blocks = blocks_said(bool(rule["sync"]), length, bool(rule.get("overlap")))
    return [
        f"blocks: {rule['filter']}, {blocks}, {rule['blocks']} filtered, "
        f"eta {rule['block_momentum']:g}, "
        f"zeta {rule['block_lr']:g}, |delta| {rule['delta_norm']:.4g}"
    ]


def _progress_line(document: dict[str, Any]) -> list[str]:
    """The job's progress, its rate and time left; or who the server waits for."""
    if document["state"] == "waiting_for_workers":
        joined = document["workers_live"]
        return [f"waiting for workers: {joined} of {document['min_workers']} joined"]
    progress = document.get("progress")
    if not progress:
        return []
    parts = [
        f"progress {100 * progress['fraction']:.1f}% "
        f"({progress['frames_done']:,} of {progress['frames_planned']:,} frames)"
    ]
    if progress["frames_per_second"] is not None:
        parts.append(f"{progress['frames_per_second']:,.0f} frames/s")
    if progress["eta_seconds"] is not None:
        parts.append(f"ETA {clock(progress['eta_seconds'])}")
    return [", ".join(parts)]


def _board_lines(workers: list[dict[str, Any]]) -> list[str]:
    """Emulated boards' modelled figures (from their reports) beside the real ones."""
    boards = [row for row in workers if "modelled_busy_s" in (row.get("report") or {})]
    if not boards:
        return []
    lines = [
        "",
        f"{'board':<22} {'scale':>6} {'busy s':>8} {'link s':>8} {'comp s':>8} "
        f"{'MCUPS':>7} {'real s':>8} {'real MCUPS':>10} {'behind':>6}",
    ]
    for row in boards:
        report = row["report"]
        lines.append(
            f"{row['name']:<22.22} {report['time_scale']:>6g} {report['modelled_busy_s']:>8.2f} "
            f"{report['modelled_link_s']:>8.2f} {report['modelled_compute_s']:>8.2f} "
            f"{report['modelled_mcups']:>7.1f} {report['real_compute_s']:>8.2f} "
            f"{report['real_mcups']:>10.1f} {report['behind_model']:>6}"
        )
    return lines


ENDED = ("trained", "stopping", "stopped")  # states after which a watch ends
READ_ERRORS = (OSError, http.client.HTTPException, ValueError)  # (URLError: an OSError)
CLEAR_SCREEN = "\x1b[H\x1b[2J"


def _cannot_read(url: str, path: str, exc: Exception, token: str = "") -> str:
    """Why ``url`` + ``path`` could not be read, in one line (``token``: the one sent)."""
    if isinstance(exc, urllib.error.HTTPError) and exc.code == 401:
        if token:  # said as "needs the token", a wrong one sent the user looking for how
            given = "--token, --token-file or SNET_TOKEN"
            return f"{url} refused the token given ({given}): not the server's"
        return f"{url} needs the server's token (--token, --token-file or SNET_TOKEN)"
    if isinstance(exc, urllib.error.HTTPError) and exc.code == 403:
        # the server says why (one without a token, asked by a name it does not answer)
        with contextlib.suppress(*READ_ERRORS):
            why = exc.read(512).decode(errors="replace").strip().splitlines()
            if why:
                return f"cannot read {url}{path}: refused: {why[0]}"
    if isinstance(exc, urllib.error.HTTPError) and exc.code == 404:  # another web service
        return (f"cannot read {url}{path}: {exc.code} {exc.reason}: not an snet server's "
                "HTTP port (--http-port, default 7080)")  # fmt: skip
    if isinstance(cause := getattr(exc, "reason", None), ssl.SSLCertVerificationError):
        return f"cannot read {url}{path}: {refusal(cause)} (--tls-ca: the CA that signed it)"
    if isinstance(exc, json.JSONDecodeError):  # a page of another web service, say
        return f"{url}{path} is not an snet server's status (not JSON: {exc.msg})"
    if isinstance(exc, http.client.HTTPException) and "server_hello" in repr(exc):
        # its first bytes were an snet frame: the frames themselves made an unreadable line
        return (f"cannot read {url}{path}: that is an snet server's worker port, not its "
                "HTTP port (--http-port, default 7080)")  # fmt: skip
    if isinstance(exc, http.client.HTTPException):  # not HTTP at all, or TLS asked in plain
        plain = url.startswith("http://")
        hint = " (a server that serves TLS wants https:// and --tls-ca)" if plain else ""
        return f"cannot read {url}{path}: no HTTP answer ({exc!r}){hint}"
    return f"cannot read {url}{path}: {exc}"


def _not_a_status(url: str, path: str, document: object) -> str:
    """Why ``document`` is not an snet server's status ("" if it is one)."""
    if isinstance(document, dict) and {"server", "state"} <= document.keys():
        return ""
    return f"{url}{path} is not an snet server's status (no server and state in it)"


def _read(url: str, token: str, tls_ca: str) -> dict[str, Any] | str:
    """The status document, or why it cannot be read (one line)."""
    try:
        document: object = fetch_status(url, token=token, tls_ca=tls_ca)
    except READ_ERRORS as exc:
        return _cannot_read(url, "/status", exc, token)
    if not_one := _not_a_status(url, "/status", document):
        return not_one
    assert isinstance(document, dict)  # _not_a_status checked it
    return document


def _shown(document: dict[str, Any], url: str, as_json: bool, watching: bool) -> bool:
    """Show ``document``; False (and why, on stderr) if it is not one this snet can show
    (a server of another version may lack a field the table reads)."""
    try:
        _show(document, as_json, watching)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        print(f"snet: cannot show {url}/status: a field is missing or odd ({exc!r})",
              file=sys.stderr)  # fmt: skip
        return False
    return True


def _show(document: dict[str, Any], as_json: bool, watching: bool) -> None:
    text = json.dumps(document, indent=None if watching else 1) if as_json else render(document)
    if watching and not as_json and on_terminal(sys.stdout):
        text = CLEAR_SCREEN + text  # each reading replaces the last
    elif watching and not as_json:
        text += "\n"  # readings one after another, a blank line between them
    print(text, flush=True)


def _watch(url: str, token: str, tls_ca: str, as_json: bool, interval: float) -> int:
    """Show the status at most every ``interval`` seconds, and the last, following the
    server's /events, until the run ends (0), or until the server no longer answers before
    it did (1). The stream, not /status read again, because a server ends it with its last
    state before it closes (cli/event_stream.py): a run that ends while the watch waits
    between two readings is still seen to end. A server without /events is polled."""
    try:
        stream = open_events(url, token, tls_ca)
    except READ_ERRORS:
        stream = None  # the first reading of /status says why, in its own words
    if stream is None:
        return _poll(url, token, tls_ca, as_json, interval)
    state, shown_at = "", -math.inf
    while True:
        documents, silent = 0, False
        try:
            with stream:
                for document in status_events(stream):
                    if not_one := _not_a_status(url, "/events", document):
                        print(f"snet: {not_one}", file=sys.stderr)
                        return 1
                    assert isinstance(document, dict)  # _not_a_status checked it
                    documents += 1
                    state = document["state"]
                    now = time.monotonic()
                    if state in ENDED or now - shown_at >= interval:
                        if not _shown(document, url, as_json, watching=True):
                            return 1
                        shown_at = now
                    if state in ENDED:
                        return 0
            why = f"{url}/events ended"
        except BrokenPipeError:  # stdout's reader left, not the server: run_status ends
            raise
        except READ_ERRORS as exc:  # cut off, or silent past the read timeout
            why = _cannot_read(url, "/events", exc, token)
            silent = isinstance(exc, TimeoutError)  # a read's timeout (socket.timeout)
        # The stream ended before the run did. Once more (a proxy may cut long streams;
        # an older server's may be silent past the timeout): a dead server does not answer.
        try:
            stream = open_events(url, token, tls_ca) if documents else None
        except READ_ERRORS as exc:
            why, stream = _cannot_read(url, "/events", exc, token), None
        if stream is None:
            if not state:
                print(f"snet: {why}", file=sys.stderr)
                return 1
            # silent past the read timeout, yet /status answers: a live server of an
            # earlier version (no keep-alive in its stream): follow it by polling
            if silent and isinstance(_read(url, token, tls_ca), dict):
                return _poll(url, token, tls_ca, as_json, interval)
            print(f"snet: the server stopped answering ({why}); last state {state}",
                  file=sys.stderr)  # fmt: skip
            return 1


def _poll(url: str, token: str, tls_ca: str, as_json: bool, interval: float) -> int:
    """``_watch`` for a server without /events: /status every ``interval`` seconds. A
    server that exits as its run ends is often gone before the next reading: exit 1."""
    state = ""
    while True:
        document = _read(url, token, tls_ca)
        if isinstance(document, str):
            if not state:
                print(f"snet: {document}", file=sys.stderr)
                return 1
            print(f"snet: the server stopped answering ({document}); last state {state}",
                  file=sys.stderr)  # fmt: skip
            return 0 if state in ENDED else 1
        state = document["state"]
        if not _shown(document, url, as_json, watching=True):
            return 1
        if state in ENDED:
            return 0
        time.sleep(interval)


def server_url(given: str, tls: bool = False) -> str:
    """The server's URL from what a user gives: a bare HOST:PORT is http://, or https://
    with ``tls`` (``--tls-ca`` given: it was read as http:// and failed); a URL of one of
    the server's pages (the dashboard's ``/``, ``/status``, ``/events``, ``/metrics``...)
    names the server too, with or without a trailing slash. An IPv6 address
    is taken as the server logs it and a worker's ``--server`` takes it (``::1:7080``).
    ``ConfigError`` for a scheme or a port no server has (``ftp://`` had waited 5 s for
    a reply, port 99999 was "connection refused")."""
    from urllib.parse import urlsplit

    from snet.protocol.address import split_host_port
    from snet.protocol.errors import ConfigError

    url = given.rstrip("/")
    if "://" not in given:  # HOST:PORT[/page], as a worker's --server takes it
        where, slash, page = url.partition("/")
        try:
            host, port = split_host_port(where)
        except ValueError as exc:
            raise ConfigError(f"--url {given}: {exc}") from None
        host = f"[{host}]" if ":" in host else host  # IPv6, bare as the server logs it
        url = f"{'https' if tls else 'http'}://{host}:{port}{slash}{page}"
    try:
        parts = urlsplit(url)
        checked = parts.port  # raises for one out of range
    except ValueError as exc:
        raise ConfigError(f"--url {given}: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"--url {given}: a server's address is http:// or https://")
    if checked == 0 or not parts.hostname:
        raise ConfigError(f"--url {given}: no server listens without a host or on port 0")
    for page in ("/status", "/events", "/metrics", "/healthz", "/weights", "/control"):
        if url.endswith(page):  # any of its pages names it (…/metrics: a 404, "not snet")
            return url.removesuffix(page).rstrip("/")
    return url


def run_status(args: argparse.Namespace) -> int:
    given = args.url if args.url is not None else os.environ.get("SNET_URL")  # "" refused
    url = server_url("http://127.0.0.1:7080" if given is None else given, bool(args.tls_ca))
    token = (args.token or os.environ.get("SNET_TOKEN", "")).strip()  # as the server reads it
    if args.token_file:  # as the server and the workers read theirs (ConfigError: exit 2)
        from snet.transport.tls import read_token_file

        token = read_token_file(args.token_file)
    if not (math.isfinite(args.interval) and args.interval > 0):
        print(f"snet: --interval must be > 0, got {args.interval:g}", file=sys.stderr)
        return 2
    if args.tls_ca:  # a missing file or a directory said with its name, before a request
        https_context(args.tls_ca)  # (ConfigError: exit 2)
    try:
        if args.watch:
            return _watch(url, token, args.tls_ca or "", args.json, args.interval)
        document = _read(url, token, args.tls_ca or "")
        if isinstance(document, str):
            print(f"snet: {document}", file=sys.stderr)
            return 1
        return 0 if _shown(document, url, args.json, watching=False) else 1
    except KeyboardInterrupt:  # Ctrl-C: the way to stop watching (SIGTERM: cli/main.py)
        return 0
    except BrokenPipeError:  # the reader left (| head): nothing more to say to it
        detach_stdout()
        return 0
