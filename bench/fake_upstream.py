"""A lean fake vLLM upstream for overhead benchmarks: no token delay, fixed 64-token answers.

    python -m bench.fake_upstream --port 9100 [--port 9101 ...] [--tokens 64]
                                  [--token-delay-ms 0] [--first-token-delay-ms 0]

A raw asyncio protocol (on uvloop when installed), not a framework, so it costs far less
CPU per request than any gateway in front of it. It speaks just enough HTTP/1.1 (keep-alive,
``Content-Length`` request bodies) and OpenAI's wire format:

* ``POST /v1/completions`` and ``/v1/chat/completions``: a JSON completion of ``tokens``
  words, or with ``"stream": true`` an SSE stream (chunked encoding) of ``tokens`` events
  plus ``data: [DONE]``, each event written on its own with a yield to the loop between
  them, so they leave as separate writes (as a real server's tokens do); with
  ``--token-delay-ms`` a sleep instead of the yield (streams that last, as under load); with
  ``--first-token-delay-ms`` the stream's headers at once and its first event that long after
  the request arrived (vLLM's prefill), so a gateway's delay in sending a request upstream
  shows in its first token;
* ``GET /health`` 200, ``GET /metrics`` a few vLLM gauges, any other ``GET`` the model list.

One process can listen on several ports (so a gateway sees several backends).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Sequence
from typing import cast

MODEL = "bench-model"
_STREAM_RE = re.compile(rb'"stream"\s*:\s*true')


def _http(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Answers:
    """Every response the fake sends, encoded once at start."""

    def __init__(
        self, tokens: int, token_delay_s: float = 0.0, first_token_delay_s: float = 0.0
    ) -> None:
        self.token_delay_s, self.first_token_delay_s = token_delay_s, first_token_delay_s
        words = [f" w{i}" for i in range(tokens)]
        usage = {"prompt_tokens": 16, "completion_tokens": tokens, "total_tokens": 16 + tokens}
        text_choice = {"index": 0, "text": "".join(words), "finish_reason": "length"}
        chat_choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(words)},
            "finish_reason": "length",
        }
        self.json = {
            "text": self._json("text_completion", text_choice, usage),
            "chat": self._json("chat.completion", chat_choice, usage),
        }
        self.stream = {
            "text": self._stream("text_completion", words, chat=False),
            "chat": self._stream("chat.completion.chunk", words, chat=True),
        }
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        self.health = _http("200 OK", "application/json", b"")
        self.metrics = _http(
            "200 OK",
            "text/plain; version=0.0.4",
            b"vllm:num_requests_running 0.0\nvllm:num_requests_waiting 0.0\n",
        )
        models = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "b"}]}
        self.models = _http("200 OK", "application/json", json.dumps(models).encode())
        self.not_found = _http("404 Not Found", "application/json", b'{"error":"not found"}')

    @staticmethod
    def _json(obj: str, choice: dict[str, object], usage: dict[str, int]) -> bytes:
        body = {"id": "cmpl-bench", "object": obj, "created": 0, "model": MODEL}
        body |= {"choices": [choice], "usage": usage}
        return _http("200 OK", "application/json", json.dumps(body).encode())

    @staticmethod
    def _stream(obj: str, words: list[str], *, chat: bool) -> list[bytes]:
        frames = []
        for word in words:
            if chat:
                choice: dict[str, object] = {"index": 0, "delta": {"content": word}}
            else:
                choice = {"index": 0, "text": word}
            choice["finish_reason"] = None
            event = {"id": "cmpl-bench", "object": obj, "created": 0, "model": MODEL}
            event["choices"] = [choice]
            frames.append(_chunk(b"data: " + json.dumps(event).encode() + b"\n\n"))
        frames.append(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return frames


class FakeProtocol(asyncio.Protocol):
    """One client connection: parse requests in order, answer each from :class:`Answers`."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a stream is being written: keep later requests buffered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._serve()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def _serve(self) -> None:
        while self.transport is not None and not self.busy:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            method, path = head.split(" ", 2)[:2]
            self._answer(method, path.split("?", 1)[0], body)

    def _answer(self, method: str, path: str, body: bytes) -> None:
        assert self.transport is not None
        a = self.answers
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            kind = "chat" if path.endswith("chat/completions") else "text"
            if _STREAM_RE.search(body):
                self.busy = True
                asyncio.ensure_future(self._write_stream(a.stream[kind]))
            else:
                self.transport.write(a.json[kind])
        elif path == "/health":
            self.transport.write(a.health)
        elif path == "/metrics":
            self.transport.write(a.metrics)
        elif method == "GET":
            self.transport.write(a.models)
        else:
            self.transport.write(a.not_found)

    async def _write_stream(self, frames: list[bytes]) -> None:
        assert self.transport is not None
        if self.answers.first_token_delay_s > 0:
            self.transport.write(self.answers.stream_head)
            await asyncio.sleep(self.answers.first_token_delay_s)
            if self.transport is None:
                return
            self.transport.write(frames[0])
        else:
            self.transport.write(self.answers.stream_head + frames[0])
        for frame in frames[1:]:
            await asyncio.sleep(self.answers.token_delay_s)
            if self.transport is None:
                return
            self.transport.write(frame)
        self.busy = False
        self._serve()


async def serve(
    host: str,
    ports: Sequence[int],
    tokens: int,
    token_delay_s: float = 0.0,
    first_token_delay_s: float = 0.0,
) -> None:
    """Listen on every port until cancelled (``token_delay_s`` between stream events,
    ``first_token_delay_s`` from a request to its stream's first event)."""
    answers = Answers(tokens, token_delay_s, first_token_delay_s)
    loop = asyncio.get_running_loop()
    servers = [
        await loop.create_server(lambda: FakeProtocol(answers), host, port, backlog=1024)
        for port in ports
    ]
    print(f"fake upstream on {host} ports {list(ports)}", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ``python -m bench.fake_upstream --port P [--port P2 ...]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, action="append", required=True)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument("--first-token-delay-ms", type=float, default=0.0)
    args = parser.parse_args(argv)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        delays = args.token_delay_ms / 1000, args.first_token_delay_ms / 1000
        runner(serve(args.host, args.port, args.tokens, *delays))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
