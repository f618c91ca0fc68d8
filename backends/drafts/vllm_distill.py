"""The ``distill`` stage on a vLLM server of the target (``specgate drafts train --engine vllm``).

Each prompt's chat messages go to the server's ``/tokenize`` with ``add_generation_prompt``
(the target's own chat template), and those token ids to ``/v1/completions`` with
``return_token_ids``: the row is the prompt ids (loss mask 0) followed by the answer's ids
(mask 1, ending with the end-of-turn token when the target stopped), in speculators' format
``{"id", "input_ids", "loss_mask"}``, exactly what ``hf_stages.py distill`` writes. Sampling is
the transformers engine's: a fixed half of the prompts (by a hash of their id) at temperature
0.7 and top_p 0.95, the rest greedy; prompts over 1536 tokens are skipped.

Before anything is written, :func:`check_server` refuses a server of another model: its token
ids for a known string must be the target's ``tokenizer.json`` ids. Rows are appended whole
(one ``write`` and a flush per line); a rerun skips the ids already in the file, after cutting
a torn last line left by an interrupted run. Requests run concurrently, at most
``concurrency`` at a time, over one ``httpx.AsyncClient``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from backends.drafts.hf_stages import _done_ids, _read_prompts, _sampled

LogFn = Callable[[str], None]
#: Tokenized by the server and compared with the target's tokenizer.json (special tokens,
#: words with and without a leading space, code, digits).
CHECK_TEXT = "<|im_start|>user\nspecgate checks the tokenizer: def f(x): return 42<|im_end|>"


class DistillError(RuntimeError):
    """The server cannot be used, or a request to it failed."""


class ServerMismatch(DistillError):
    """The server serves another model than the target."""


@dataclass(frozen=True)
class DistillSettings:
    """The transformers engine's sampling and limits (``hf_stages.py distill``'s defaults)."""

    max_new_tokens: int = 320
    max_prompt_tokens: int = 1536
    sample_share: float = 0.5
    temperature: float = 0.7
    top_p: float = 0.95
    limit: int = 0  # prompts to answer in all, 0: every prompt
    concurrency: int = 8
    request_timeout_s: float = 600.0


def sampling(item_id: str, settings: DistillSettings) -> dict[str, Any]:
    """The request's sampling fields: greedy, or temperature and top_p (top_k off), chosen
    per prompt as the transformers engine chooses."""
    if _sampled(item_id, settings.sample_share):
        return {"temperature": settings.temperature, "top_p": settings.top_p, "top_k": 0}
    return {"temperature": 0.0, "top_p": 1.0, "top_k": 0}


def local_vocab(target: Path) -> dict[str, int] | None:
    """Token string -> id from ``target/tokenizer.json`` (added tokens included), or None."""
    path = target / "tokenizer.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = data.get("model", {}).get("vocab", {})
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        vocab = {piece[0]: i for i, piece in enumerate(vocab)}
    return {**vocab, **{t["content"]: t["id"] for t in data.get("added_tokens", [])}}


class Server:
    """One vLLM server's ``/tokenize`` and ``/v1/completions`` for one served model."""

    def __init__(self, client: httpx.AsyncClient, url: str, model: str = "") -> None:
        self.client, self.url, self.model = client, url.rstrip("/"), model

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer; DistillError naming the URL when it fails."""
        try:
            reply = await self.client.request(method, self.url + path, json=body)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise DistillError(f"{self.url}{path}: {type(exc).__name__}: {exc}") from None
        if reply.status_code != 200:
            raise DistillError(f"{self.url}{path}: HTTP {reply.status_code}: {reply.text[:300]}")
        try:
            return reply.json()
        except ValueError:
            raise DistillError(f"{self.url}{path}: answer is not JSON") from None

    async def tokenize_chat(self, messages: list[dict[str, Any]]) -> tuple[list[int], int]:
        """The chat template's prompt ids and the server's ``max_model_len``."""
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        data = await self.call("POST", "/tokenize", body)
        return [int(t) for t in data["tokens"]], int(data["max_model_len"])

    async def complete(self, ids: list[int], max_tokens: int, fields: dict[str, Any]) -> list[int]:
        """The answer's token ids for prompt ``ids``."""
        body = {"model": self.model, "prompt": ids, "max_tokens": max_tokens, **fields}
        data = await self.call("POST", "/v1/completions", body | {"return_token_ids": True})
        token_ids = data["choices"][0].get("token_ids")
        if token_ids is None:
            raise DistillError(f"{self.url}: no token_ids in the answer (vLLM too old?)")
        return [int(t) for t in token_ids]


async def check_server(server: Server, target: Path, served: str, log: LogFn = print) -> None:
    """Pick the served model (``served``, else the only one) and refuse a server whose
    tokenizer is not the target's; sets ``server.model``. Raises DistillError."""
    bad = DistillError(f"--server {server.url!r}: expected a URL like http://HOST:PORT")
    if not server.url.startswith(("http://", "https://")):
        raise bad
    try:
        parts = urlsplit(server.url)
        parts.port  # noqa: B018  (raises ValueError for a port outside 0-65535)
    except ValueError:
        raise bad from None
    if not parts.hostname:
        raise bad
    try:
        names = [m["id"] for m in (await server.call("GET", "/v1/models"))["data"]]
    except (KeyError, TypeError):
        raise DistillError(f"{server.url}/v1/models: not an OpenAI model list") from None
    if served in names:
        server.model = served
    elif len(names) == 1:
        server.model = names[0]
        log(f"{server.url} serves {names[0]!r} (the config names {served!r})")
    else:
        raise ServerMismatch(f"{server.url} serves {names}, none of them {served!r}")
    vocab = local_vocab(target)
    if vocab is None:
        log(f"{target}: no tokenizer.json, the server's tokenizer is not compared")
        return
    body = {"model": server.model, "prompt": CHECK_TEXT, "add_special_tokens": False}
    data = await server.call("POST", "/tokenize", body | {"return_token_strs": True})
    for token, text in zip(data["tokens"], data.get("token_strs") or [], strict=False):
        if vocab.get(text) != token:
            raise ServerMismatch(
                f"{server.url} serves {server.model!r}, whose tokenizer is not the target's "
                f"({target}/tokenizer.json): {text!r} is {token} there, {vocab.get(text)} here"
            )
    if not data.get("token_strs"):
        raise ServerMismatch(f"{server.url}: /tokenize gave no token_strs to compare")


class _Progress:
    """Progress lines with rate and ETA, at most one every ``every_s`` seconds (and the last)."""

    def __init__(self, total: int, log: LogFn, every_s: float = 10.0) -> None:
        self.total, self.log, self.every_s = total, log, every_s
        self.done, self.tokens, self.started = 0, 0, time.monotonic()
        self.shown = self.started

    def add(self, tokens: int) -> None:
        self.done, self.tokens = self.done + 1, self.tokens + tokens
        now = time.monotonic()
        if now - self.shown < self.every_s and self.done < self.total:
            return
        self.shown, spent = now, max(now - self.started, 1e-9)
        eta = (self.total - self.done) * spent / self.done
        self.log(
            f"distill: {self.done}/{self.total} ({self.done / spent:.1f}/s, "
            f"{self.tokens / spent:.0f} tok/s, ETA {eta:.0f} s)"
        )


async def distill(
    server: Server,
    prompts: Path,
    out: Path,
    settings: DistillSettings,
    *,
    log: LogFn = print,
) -> dict[str, Any]:
    """Append a row to ``out`` for every prompt not there yet; returns a summary.
    ``server`` must have passed :func:`check_server`. Raises DistillError."""
    try:
        done = _done_ids(out)
    except ValueError as exc:
        raise DistillError(str(exc)) from None
    todo = [(i, m) for i, m in _read_prompts(prompts) if i not in done]
    if settings.limit:
        todo = todo[: max(0, settings.limit - len(done))]
    log(f"distill: {len(todo)} prompts to answer on {server.url} ({len(done)} done before)")
    progress, skipped = _Progress(len(todo), log), 0
    gate = asyncio.Semaphore(settings.concurrency)

    async def answer(item_id: str, messages: list[dict[str, Any]], sink: Any) -> None:
        nonlocal skipped
        async with gate:
            ids, max_model_len = await server.tokenize_chat(messages)
            if len(ids) > settings.max_prompt_tokens or (
                len(ids) + settings.max_new_tokens > max_model_len
            ):
                skipped += 1
                progress.add(0)
                return
            fields = sampling(item_id, settings)
            answer = await server.complete(ids, settings.max_new_tokens, fields)
        if answer:
            row = {"id": item_id, "input_ids": ids + answer}
            row["loss_mask"] = [0] * len(ids) + [1] * len(answer)
            sink.write(json.dumps(row) + "\n")  # one whole line, then flushed
            sink.flush()
        progress.add(len(ids) + len(answer))

    started = time.monotonic()
    with out.open("a", encoding="utf-8") as sink:
        try:
            async with asyncio.TaskGroup() as group:  # one failure cancels the rest
                for item_id, messages in todo:
                    group.create_task(answer(item_id, messages, sink))
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
    seconds = time.monotonic() - started
    return {
        "stage": "distill",
        "engine": "vllm",
        "answered": progress.done - skipped,
        "skipped_too_long": skipped,
        "tokens": progress.tokens,
        "seconds": round(seconds, 1),
        "tokens_per_s": round(progress.tokens / seconds, 1) if seconds else None,
    }


def http_client(settings: DistillSettings) -> httpx.AsyncClient:
    """The stage's one client: generation timeout, connections for ``concurrency``."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(settings.request_timeout_s, connect=5.0),
        limits=httpx.Limits(max_connections=settings.concurrency + 2),
    )


async def distill_from(
    url: str,
    target: Path,
    served: str,
    prompts: Path,
    out: Path,
    settings: DistillSettings,
    *,
    log: LogFn = print,
) -> dict[str, Any]:
    """:func:`check_server` then :func:`distill` against the server at ``url``."""
    async with http_client(settings) as client:
        server = Server(client, url)
        await check_server(server, target, served, log)
        return await distill(server, prompts, out, settings, log=log)
