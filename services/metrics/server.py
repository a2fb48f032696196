"""A tiny threaded HTTP server for ``/health``, ``/ready`` and ``/metrics``.

Dependency-free on purpose (stdlib ``http.server`` + ``prometheus_client``) so every
service, including the CPU-bound ones, can expose probes without an event loop.

    registry = CollectorRegistry()
    tokens = Counter("meshrl_rollout_tokens_total", "Generated tokens", registry=registry)
    server = MetricsServer(registry, port=0, ready=lambda: engine_loaded)
    server.start(); print(server.port)
    ...
    server.stop()
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-reply (a scraper timing out) is not an error worth a traceback."""

    daemon_threads = True

    def handle_error(self, request, client_address):  # noqa: ANN001 (socketserver API)
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class MetricsServer:
    """Serve ``/health`` (process alive), ``/ready`` (``ready()`` is true) and ``/metrics``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ready: Callable[[], bool] | None = None,
        status: Callable[[], dict] | None = None,
    ) -> None:
        self.registry = registry
        self._ready = ready or (lambda: True)
        self._status = status
        self._httpd = _QuietServer((host, port), self._handler())
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def host(self) -> str:
        return self._httpd.server_address[0]

    def start(self) -> "MetricsServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt, *args):  # keep service logs clean
                pass

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802 (http.server API)
                path = self.path.split("?", 1)[0]
                if path == "/health":
                    self._send(200, b'{"status":"ok"}', "application/json")
                elif path == "/ready":
                    try:
                        ok = bool(server._ready())
                    except Exception as exc:  # a failing probe is "not ready", never a crash
                        ok, _ = False, exc
                    self._send(200 if ok else 503, json.dumps({"ready": ok}).encode(), "application/json")
                elif path == "/metrics":
                    self._send(200, generate_latest(server.registry), CONTENT_TYPE_LATEST)
                elif path == "/status" and server._status is not None:
                    self._send(200, json.dumps(server._status(), default=str).encode(), "application/json")
                else:
                    self._send(404, b'{"error":"not found"}', "application/json")

        return Handler
