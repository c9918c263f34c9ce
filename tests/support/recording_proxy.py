"""A loopback HTTP proxy that records every exchange, byte for byte, between saucer and a model server.

    with RecordingProxy("http://127.0.0.1:8080") as proxy:
        ... point saucer at proxy.base_url (".../v1") ...
        proxy.exchanges[0].request_json["tool_choice"]

It sits outside saucer's process boundary (a CLI run in a subprocess is
recorded too), so what it records is what went over the wire, not what
saucer meant to send.
"""

from __future__ import annotations

import http.client
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["RecordingProxy", "Exchange"]

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass
class Exchange:
    method: str
    path: str
    request_body: bytes
    status: int
    response_body: bytes
    seconds: float

    @property
    def request_json(self) -> Any:
        return json.loads(self.request_body) if self.request_body else None

    @property
    def response_json(self) -> Any:
        try:
            return json.loads(self.response_body)
        except ValueError:
            return None


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        import time

        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        upstream = self.server.upstream
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        started = time.monotonic()
        conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=self.server.timeout_s)
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            response = conn.getresponse()
            data, status, reply_headers = response.read(), response.status, response.getheaders()
        except OSError as exc:
            data, status, reply_headers = json.dumps({"error": {"message": f"proxy: {exc}"}}).encode(), 502, []
        finally:
            conn.close()
        with self.server.lock:
            self.server.exchanges.append(
                Exchange(self.command, self.path, body, status, data, time.monotonic() - started)
            )
        self.send_response(status)
        for key, value in reply_headers:
            if key.lower() not in _HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = _forward
    do_POST = _forward


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    upstream: Any
    exchanges: list[Exchange]
    lock: threading.Lock
    timeout_s: float


class RecordingProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream`` and keeps every exchange in ``exchanges``."""

    def __init__(self, upstream: str, *, timeout: float = 120.0) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.upstream = urlsplit(upstream)
        self._server.exchanges = []
        self._server.lock = threading.Lock()
        self._server.timeout_s = timeout
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def exchanges(self) -> list[Exchange]:
        return self._server.exchanges

    def completions(self) -> list[Exchange]:
        """The chat-completion exchanges, in order."""
        return [e for e in self.exchanges if e.path.rstrip("/").endswith("/chat/completions")]

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def clear(self) -> None:
        with self._server.lock:
            self._server.exchanges.clear()

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
