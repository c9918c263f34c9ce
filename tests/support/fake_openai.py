"""A scripted OpenAI-compatible chat-completions server on loopback, for tests.

    with FakeOpenAI() as fake:
        fake.push(fake.error(429), fake.tool_calls(("shell.run", {"cmd": "ls"})), fake.text("done"))
        ... point saucer at fake.base_url ...
        fake.requests[0].json["messages"]

Each POST to ``/v1/chat/completions`` takes the next scripted response (or
asks ``responder(request)`` when the script is empty) and records the request.
With nothing scripted it answers 400 "script exhausted", which is not retried,
so a test that expects fewer calls fails loudly.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeOpenAI", "RecordedRequest"]

_ids = itertools.count(1)


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    json: Any
    raw: bytes

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.json.get("messages", []) if isinstance(self.json, dict) else []

    @property
    def tool_names(self) -> list[str]:
        tools = self.json.get("tools", []) if isinstance(self.json, dict) else []
        return [t["function"]["name"] for t in tools]


@dataclass
class Scripted:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        fake = self.server.fake
        with fake._lock:
            fake.gets.append(self.path)
        if self.path == "/props" and fake.props is not None:  # llama-server's own endpoint
            self._send(Scripted(200, fake.props))
        elif self.path.rstrip("/").endswith("/models"):
            self._send(Scripted(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}))
        else:
            self._send(Scripted(404, {"error": {"message": "not found"}}))

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = None
        fake = self.server.fake
        request = RecordedRequest("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body, raw)
        with fake._lock:
            fake.requests.append(request)
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(Scripted(404, {"error": {"message": f"no route {self.path}"}}))
            return
        self._send(fake._next(request))

    def _send(self, item: Scripted) -> None:
        if item.delay:
            time.sleep(item.delay)
        data = json.dumps(item.body).encode()
        try:
            self.send_response(item.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in item.headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeOpenAI

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and hung up is expected in retry tests


class FakeOpenAI:
    """The server; use as a context manager (or start()/stop())."""

    def __init__(self, model: str = "fake-model") -> None:
        self.model = model
        self.requests: list[RecordedRequest] = []
        self.script: deque[Scripted] = deque()
        self.responder: Callable[[RecordedRequest], Scripted | dict[str, Any]] | None = None
        #: The paths of the GET requests (``requests`` holds the POSTs).
        self.gets: list[str] = []
        #: What ``GET /props`` answers (None: 404, as any server but llama.cpp's llama-server).
        self.props: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------- lifecycle

    def start(self) -> FakeOpenAI:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.gets.clear()
            self.script.clear()
            self.responder = None
            self.props = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "start() the fake server first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    # ------------------------------------------------------------- scripting

    def push(self, *items: Scripted) -> FakeOpenAI:
        with self._lock:
            self.script.extend(items)
        return self

    def _next(self, request: RecordedRequest) -> Scripted:
        with self._lock:
            item = self.script.popleft() if self.script else None
            responder = self.responder
        if item is None and responder is not None:
            out = responder(request)
            item = out if isinstance(out, Scripted) else Scripted(200, out)
        if item is None:
            return Scripted(
                400, {"error": {"message": "fake_openai: script exhausted", "type": "invalid_request_error"}}
            )
        if item.status == 200 and isinstance(item.body, dict) and item.body.get("model") is None:
            item.body["model"] = (request.json or {}).get("model", self.model)
        return item

    @staticmethod
    def completion(
        message: dict[str, Any],
        *,
        usage: tuple[int, int] | None = (10, 5),
        finish_reason: str = "stop",
        model: str | None = None,
        cached_tokens: int | None = None,
    ) -> Scripted:
        body: dict[str, Any] = {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        }
        if usage is not None:
            body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
            if cached_tokens is not None:
                body["usage"]["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        return Scripted(200, body)

    @classmethod
    def text(cls, content: str, *, usage: tuple[int, int] | None = (10, 5), **kw: Any) -> Scripted:
        """A final answer (no tool calls)."""
        return cls.completion({"role": "assistant", "content": content}, usage=usage, **kw)

    @classmethod
    def tool_calls(
        cls,
        *calls: tuple[str, Any] | tuple[str, Any, str],
        content: str | None = None,
        usage: tuple[int, int] | None = (10, 5),
        **kw: Any,
    ) -> Scripted:
        """Tool calls; each is (function name or server.tool, arguments[, id]); dots become ``__``.

        Arguments that are a str are sent as they are (to script malformed JSON).
        """
        out = []
        for call in calls:
            name, args = call[0], call[1]
            call_id = call[2] if len(call) > 2 else f"call_{next(_ids)}"
            out.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": name.replace(".", "__"),
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
            )
        kw.setdefault("finish_reason", "tool_calls")
        return cls.completion({"role": "assistant", "content": content, "tool_calls": out}, usage=usage, **kw)

    @staticmethod
    def error(status: int, message: str = "", *, headers: dict[str, str] | None = None) -> Scripted:
        kind = {429: "rate_limit_exceeded", 500: "server_error", 503: "server_error"}.get(
            status, "invalid_request_error"
        )
        return Scripted(
            status, {"error": {"message": message or f"scripted HTTP {status}", "type": kind}}, headers or {}
        )

    @staticmethod
    def slow(item: Scripted, seconds: float) -> Scripted:
        """``item`` answered after ``seconds`` (to trigger client timeouts)."""
        return Scripted(item.status, item.body, item.headers, seconds)
