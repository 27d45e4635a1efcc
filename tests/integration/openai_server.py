"""A small OpenAI-compatible server on loopback for the ``openai`` backend's tests, with faults
on demand.

It answers ``/v1/embeddings`` (vector ``[len(text), position]`` per input),
``/v1/chat/completions`` and ``/v1/completions`` (``"echo: " + prompt``, with usage). An input
text steers it: ``fail-429:N:KEY`` and ``fail-500:N:KEY`` fail the first N calls carrying KEY
(429s with ``Retry-After: 0.05``), ``slow:S …`` answers after S seconds, ``malformed`` answers
invalid JSON, ``echo-key-400`` a 400 whose body echoes the Authorization header, ``short``
makes an embeddings answer drop its last vector. ``storm`` answers the next N calls of any
kind with 429. It counts calls, and the most it served at once. A chat or completions call
with ``"stream": true`` is answered as server-sent events, a word each 20 ms (``count:N``
streams N words), then the usage and ``[DONE]``; it counts the words it sent and the streams
its client cut short.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


class FakeUpstream(ThreadingHTTPServer):
    """The server: start with ``with FakeUpstream() as upstream:``; ``upstream.url``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.calls: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.storm = 0
        self.authorizations: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.words_sent = 0
        self.streams_cut = 0
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()
        self.server_close()

    def should_fail(self, texts: list[str]) -> int | None:
        """The status this call must fail with, if any (counting the failure)."""
        with self.lock:
            if self.storm > 0:
                self.storm -= 1
                return 429
            for text in texts:
                kind, _, rest = text.partition(":")
                if kind in ("fail-429", "fail-500"):
                    times, _, key = rest.partition(":")
                    if self.failures[key] < int(times):
                        self.failures[key] += 1
                        return int(kind[-3:])
        return None


class Handler(BaseHTTPRequestHandler):
    server: FakeUpstream

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests assert on what the server counted."""

    def do_POST(self) -> None:
        upstream = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with upstream.lock:
            upstream.calls[self.path] += 1
            upstream.authorizations.append(self.headers.get("Authorization", ""))
            upstream.in_flight += 1
            upstream.most_in_flight = max(upstream.most_in_flight, upstream.in_flight)
        self._in_flight = True
        try:
            self._answer(body)
        finally:
            self._leave()

    def _leave(self) -> None:
        """The call stops counting as in flight: before the last bytes of its answer go out,
        so that a client who sends its next call the moment it has its answer is never
        counted twice, however late this thread runs again."""
        if self._in_flight:
            self._in_flight = False
            with self.server.lock:
                self.server.in_flight -= 1

    def _answer(self, body: dict[str, Any]) -> None:
        texts = _texts(body)
        for text in texts:
            if text.startswith("slow:"):
                time.sleep(float(text.split(":")[1].split()[0]))
        status = self.server.should_fail(texts)
        if status is not None:
            self._send(status, b'{"error": {"message": "try again"}}', {"Retry-After": "0.05"})
        elif "echo-key-400" in texts:
            self._send(400, f"bad request from {self.headers['Authorization']}".encode())
        elif "malformed" in texts:
            self._send(200, b'{"data": [')
        elif body.get("stream"):
            self._stream(texts[0])
        elif self.path == "/v1/embeddings":
            vectors = [
                {"index": i, "embedding": [float(len(text)), float(i)]}
                for i, text in enumerate(texts)
            ]
            if "short" in texts:
                vectors.pop()
            self._json({"object": "list", "data": vectors, "model": body["model"]})
        else:
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if self.path == "/v1/chat/completions":
                choice["message"] = {"role": "assistant", "content": f"echo: {texts[0]}"}
            else:
                choice["text"] = f"echo: {texts[0]}"
            usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
            self._json({"choices": [choice], "usage": usage, "model": body["model"]})

    def _stream(self, text: str) -> None:
        kind, _, count = text.partition(":")
        words = [f"w{n}" for n in range(1, int(count) + 1)] if kind == "count" else [text]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chat = self.path == "/v1/chat/completions"
        events = [
            {
                "choices": [
                    {"index": 0, "delta": {"content": f"{word} "}}
                    if chat
                    else {"index": 0, "text": f"{word} "}
                ]
            }
            for word in words
        ]
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        events.append({"choices": [], "usage": {"completion_tokens": len(words)}})
        try:
            for event in events:
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
                with self.server.lock:
                    self.server.words_sent += 1
                time.sleep(0.02)
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            with self.server.lock:
                self.server.streams_cut += 1

    def _json(self, answer: dict[str, Any]) -> None:
        self._send(200, json.dumps(answer).encode())

    def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self._leave()
        self.wfile.write(payload)


def _texts(body: dict[str, Any]) -> list[str]:
    """The input texts of an embeddings, chat or completions request."""
    if "input" in body:
        return list(body["input"])
    if "messages" in body:
        return [str(message.get("content", "")) for message in body["messages"]]
    return [str(body.get("prompt", ""))]
