"""A tiny OpenAI-compatible chat-completions server on loopback, for tests.

Standard library only (``http.server`` in a thread). It answers ``POST /v1/chat/completions`` with the
real response shape (``id``, ``object``, ``created``, ``model``, ``choices[].message``, ``usage``) and
plays a script: each request takes the next ``Behaviour`` from the queue, or ``default`` when the queue
is empty. It records every request (parsed JSON body, headers, arrival time) and the most requests it
ever had in flight at once, so tests can assert on prompts, retries and concurrency.

Example::

    with OpenAIServer() as server:
        server.script(rate_limited(retry_after=0.05), ok("```python\\nclass ModelNew: ...\\n```"))
        client = ChatClient(base_url=server.base_url, model="test-model", api_key="k")
        client.chat([{"role": "user", "content": "hi"}])
        assert len(server.requests) == 2

Token counts are deterministic: ``prompt_tokens`` = whitespace-separated words over all messages'
content, ``completion_tokens`` = words of the answer.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Behaviour:
    """What the server does with one request.

    kind: ``"ok"`` (200 with ``text``), ``"status"`` (an error ``status`` with an OpenAI error body and
    ``retry_after`` as a ``Retry-After`` header when set), ``"malformed"`` (200 with a body that is not
    JSON), ``"no_usage"`` (200 without the ``usage`` field). ``delay_s`` sleeps before answering (longer
    than the client's timeout makes a timeout).
    """

    kind: str = "ok"
    text: str = ""
    status: int = 200
    retry_after: float | None = None
    delay_s: float = 0.0


def ok(text: str, delay_s: float = 0.0) -> Behaviour:
    return Behaviour("ok", text=text, delay_s=delay_s)


def rate_limited(retry_after: float | None = 0.05) -> Behaviour:
    return Behaviour("status", status=429, retry_after=retry_after)


def server_error(status: int = 500) -> Behaviour:
    return Behaviour("status", status=status)


def slow(delay_s: float, text: str = "too late") -> Behaviour:
    return Behaviour("ok", text=text, delay_s=delay_s)


def malformed() -> Behaviour:
    return Behaviour("malformed")


def no_usage(text: str) -> Behaviour:
    return Behaviour("no_usage", text=text)


@dataclass
class RecordedRequest:
    path: str
    body: dict | None
    headers: dict  # lower-case names
    arrived: float

    @property
    def messages(self) -> list[dict]:
        return (self.body or {}).get("messages", [])

    def content(self, role: str) -> str:
        """All content of the messages with that role, joined by newlines."""
        return "\n".join(m.get("content", "") for m in self.messages if m.get("role") == role)


@dataclass
class OpenAIServer:
    """The scripted server; use as a context manager (starts on enter, stops on exit)."""

    default: Behaviour = field(default_factory=lambda: ok("no script left"))
    host: str = "127.0.0.1"

    def __post_init__(self):
        self._queue: deque[Behaviour] = deque()
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- script and inspection ------------------------------------------------------------------
    def script(self, *behaviours: Behaviour) -> None:
        with self._lock:
            self._queue.extend(behaviours)

    def _next(self) -> Behaviour:
        with self._lock:
            return self._queue.popleft() if self._queue else self.default

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> OpenAIServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                with server._lock:
                    server.requests.append(
                        RecordedRequest(
                            self.path, body, {k.lower(): v for k, v in self.headers.items()}, time.monotonic()
                        )
                    )
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout): nothing to answer
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, body):
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(
                        404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}
                    )
                if body is None:
                    return self._send(
                        400, {"error": {"message": "body is not JSON", "type": "invalid_request"}}
                    )
                behaviour = server._next()
                if behaviour.delay_s:
                    time.sleep(behaviour.delay_s)
                if behaviour.kind == "status":
                    headers = {}
                    if behaviour.retry_after is not None:
                        headers["Retry-After"] = f"{behaviour.retry_after:g}"
                    error = {"message": f"scripted {behaviour.status}", "type": "scripted", "code": None}
                    return self._send(behaviour.status, {"error": error}, headers)
                if behaviour.kind == "malformed":
                    return self._send_raw(
                        200, b'{"id": "chatcmpl-x", "choices": [ {"mess', "application/json"
                    )
                prompt_words = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
                answer_words = len(behaviour.text.split())
                payload = {
                    "id": f"chatcmpl-{len(server.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", ""),
                    "system_fingerprint": None,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": behaviour.text},
                            "finish_reason": "stop",
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": prompt_words,
                        "completion_tokens": answer_words,
                        "total_tokens": prompt_words + answer_words,
                    },
                }
                if behaviour.kind == "no_usage":
                    del payload["usage"]
                return self._send(200, payload)

            def _send(self, status, payload, headers=None):
                self._send_raw(status, json.dumps(payload).encode(), "application/json", headers)

            def _send_raw(self, status, data, content_type, headers=None):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer((self.host, 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="openai-test-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
