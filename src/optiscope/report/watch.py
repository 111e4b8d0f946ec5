"""``optiscope report --watch DIR``: the report served on 127.0.0.1 while a run writes it.

``GET /`` is the page, built again whenever a file of the run directories has changed; its charts drawn
from ``metrics.jsonl`` poll ``GET /data?key=…`` for their columns (Bokeh's ``AjaxDataSource``), and the
page polls ``GET /signature`` to reload itself when it would show other charts (a new run, results).
Only the standard library's ``http.server`` serves; it listens on the loopback interface alone.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np

from .. import runs
from .page import Page, build
from .rundir import read_run

HOST = "127.0.0.1"


#: A rebuild of the page is followed by at least this many times its own duration without one: a run that logs
#: at every step changes metrics.jsonl before each chart's poll, and a rebuild at each (0.6–0.8 s for a page of
#: a few runs) kept a core busy beside the training run and every poll waiting 10 s and more behind the lock.
REBUILD_SPACING = 4


class Report:
    """The page of ``dirs``, rebuilt when one of their files has changed since the last request, or a run in them
    has started or stopped — at most once in ``REBUILD_SPACING`` times the last rebuild's duration: in between,
    requests get the page as last built (its charts then lag the run by about that long)."""

    def __init__(self, dirs: Sequence[Path], interval_ms: int = 1000) -> None:
        self.dirs, self.interval_ms = [Path(d) for d in dirs], interval_ms
        self._lock = threading.Lock()
        self._stamp: Any = None
        self._page = Page("")
        self._next_look = -math.inf  # when files are next looked at

    def stamp(self) -> tuple:
        out = []
        for d in self.dirs:
            for name in (runs.RESULTS, runs.METRICS, runs.CONFIG):
                try:
                    s = (d / name).stat()
                    out.append((s.st_size, s.st_mtime_ns))
                except OSError:
                    out.append(None)
            out.append(tuple(sorted(p.name for p in (d / runs.FIGURES).glob("*.png"))))
            out.append(runs.in_progress(d))  # a run that stops without results shows as stopped
        return tuple(out)

    def page(self) -> Page:
        with self._lock:
            if time.monotonic() < self._next_look:
                return self._page
            stamp = self.stamp()
            if stamp != self._stamp:
                started = time.monotonic()
                self._page = build([read_run(d) for d in self.dirs], watch=True, interval_ms=self.interval_ms)
                self._stamp = stamp
                done = time.monotonic()
                self._next_look = done + REBUILD_SPACING * (done - started)
            return self._page


def jsonable(value: Any) -> Any:
    """Columns as strict JSON: arrays as lists, values that are not finite as null."""
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def handler_for(report: Report) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlparse(self.path)
            page = report.page()
            if url.path == "/":
                self._send(200, "text/html; charset=utf-8", page.html.encode())
            elif url.path == "/signature":
                self._send(200, "text/plain", page.signature.encode())
            elif url.path == "/data":
                key = parse_qs(url.query).get("key", [""])[0]
                if key not in page.live:
                    self._send(404, "application/json", b"{}")
                else:
                    self._send(200, "application/json", json.dumps(jsonable(page.live[key]), allow_nan=False).encode())
            else:
                self._send(404, "text/plain", b"not found")

        def _send(self, code: int, kind: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Silent: one request per chart per second would bury the console."""

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that goes away mid-response (a closed tab) is no error worth a traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def serve(
    dirs: Sequence[Path], port: int = 0, interval_ms: int = 1000, ready: Callable[[str], None] | None = None
) -> ThreadingHTTPServer:
    """Start serving the report of ``dirs`` in a background thread; returns the server (``shutdown()``
    stops it). ``port=0`` takes a free port; ``ready`` gets the page's URL."""
    for d in dirs:
        read_run(d)  # a path that is not a directory is refused before anything listens
    report = Report(dirs, interval_ms)
    report.page()
    server = Server((HOST, port), handler_for(report))
    threading.Thread(target=server.serve_forever, name="optiscope-report", daemon=True).start()
    if ready is not None:
        ready(f"http://{HOST}:{server.server_address[1]}/")
    return server
