"""``specgate drafts train --from-capture [DIR]``: the gateway's captured prompts (config
``capture:``, :mod:`gateway.telemetry.capture`) as the ``{"id", "messages"}`` prompts JSONL the
pipeline reads.

Each record's prompt becomes chat messages with text content: chat ``messages`` as sent
(``developer`` as ``system``), a completions ``prompt`` string (or each string of a list) as
one user message, Responses ``instructions``/``input`` and Anthropic ``system``/``messages``
as system, user and assistant turns. Text parts are joined with newlines; images, tool calls
and tool results are left out, and a prompt left without a user turn (or a completions prompt
of token ids) is skipped and counted. Identical prompts are kept once, with an id derived from
their content, so a rerun on more traffic keeps the ids already distilled.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.capture_store import capture_files
from contracts.tasks import TASKS

Messages = list[dict[str, str]]
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
#: The prompt fields each endpoint's records carry, and the type each must have.
_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "/v1/chat/completions": {"messages": (list,)},
    "/v1/completions": {"prompt": (str, list)},
    "/v1/responses": {"instructions": (str, type(None)), "input": (str, list)},
    "/v1/messages": {"system": (str, list, type(None)), "messages": (list,)},
}


@dataclass
class Conversion:
    """What :func:`convert_capture` read and kept."""

    records: int = 0
    prompts: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    skipped: Counter[str] = field(default_factory=Counter)


def parse_tasks(text: str | None) -> tuple[str, ...]:
    """``"code,chat"`` -> ``("code", "chat")`` (None: every task); ValueError naming an
    unknown task."""
    if text is None:
        return TASKS
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"--tasks {text!r}: expected some of {','.join(TASKS)}")
    return tasks


def read_capture(path: Path) -> Iterator[dict[str, Any]]:
    """The records of one capture file; a bad line raises ValueError naming the file and
    line. An unterminated last line (the gateway is writing it) is left for the next run."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            if not raw.endswith(b"\n"):
                return
            if not raw.strip():
                continue
            try:
                yield _checked(json.loads(raw))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: bad capture line: {exc}") from None


def _checked(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    if record.get("task") not in TASKS:
        raise ValueError(f"task {record.get('task')!r} is not one of {', '.join(TASKS)}")
    endpoint = record.get("endpoint")
    fields = _FIELDS.get(endpoint) if isinstance(endpoint, str) else None
    if fields is None:
        raise ValueError(f"endpoint {record.get('endpoint')!r} is not a routed endpoint")
    if not any(name in record for name in fields):
        raise ValueError(f"no prompt field ({', '.join(fields)})")
    for name, types in fields.items():
        if name in record and not isinstance(record[name], types):
            raise TypeError(f"{name} is a {type(record[name]).__name__}")
    return record


def to_prompts(record: dict[str, Any]) -> list[Messages]:
    """The chat prompts of one checked record (several for a completions prompt list)."""
    endpoint = record["endpoint"]
    if endpoint == "/v1/completions":
        given = record["prompt"]
        texts = [given] if isinstance(given, str) else given
        return [[_user(t)] for t in texts if isinstance(t, str) and t.strip()]
    messages: Messages = []
    if endpoint == "/v1/chat/completions":
        items = record["messages"]
    elif endpoint == "/v1/responses":
        _add(messages, "system", record.get("instructions"))
        given = record.get("input")
        items = [_user(given)] if isinstance(given, str) else given or []
    else:
        _add(messages, "system", record.get("system"))
        items = record["messages"]
    for item in items:
        if isinstance(item, str):
            _add(messages, "user", item)
        elif isinstance(item, dict) and item.get("type") in (None, "message"):
            _add(messages, item.get("role"), item.get("content"))
    return [messages] if any(m["role"] == "user" for m in messages) else []


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _add(messages: Messages, role: Any, content: Any) -> None:
    """Append a turn with ``content``'s text, when the role is a chat role and text is left."""
    text = _text(content)
    if isinstance(role, str) and role in _ROLES and text.strip():
        messages.append({"role": _ROLES[role], "content": text})


def _text(content: Any) -> str:
    """A string, or the ``text`` of text parts (``text``, ``input_text``, ``output_text``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = [
        p["text"]
        for p in content
        if isinstance(p, dict)
        and p.get("type") in ("text", "input_text", "output_text")
        and isinstance(p.get("text"), str)
    ]
    return "\n".join(parts)


def convert_capture(root: Path, tasks: Sequence[str]) -> Conversion:
    """Read ``root``'s capture files of ``tasks``, oldest first, into deduplicated prompts.
    Raises ValueError for a bad line, FileNotFoundError when ``root`` is not a directory."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no capture directory (is capture: enabled?)")
    out, seen = Conversion(), set()
    for captured in capture_files(root):
        if captured.task not in tasks:
            continue
        for record in read_capture(captured.path):
            out.records += 1
            if record["task"] not in tasks:
                continue
            prompts = to_prompts(record)
            if not prompts:
                out.skipped["token ids" if _token_ids(record) else "no user text"] += 1
            for messages in prompts:
                key = json.dumps(messages, sort_keys=True, ensure_ascii=False)
                if key in seen:
                    out.duplicates += 1
                    continue
                seen.add(key)
                digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
                out.prompts.append({"id": f"capture-{digest[:16]}", "messages": messages})
    return out


def _token_ids(record: dict[str, Any]) -> bool:
    prompt = record.get("prompt")
    return isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], str)


def write_prompts(prompts: list[dict[str, Any]], out: Path) -> None:
    """Write the prompts JSONL to ``out`` (0600: they are users' prompts), atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        for prompt in prompts:
            handle.write(json.dumps(prompt) + "\n")
    tmp.replace(out)
