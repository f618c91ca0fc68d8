"""The exact prompt length of a request, from a vLLM backend's ``/tokenize``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx

logger = logging.getLogger(__name__)

#: Chat request fields the chat template renders (vLLM's ``TokenizeChatRequest`` takes them).
TEMPLATE_FIELDS = (
    "messages",
    "tools",
    "documents",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
)


async def count_prompt_tokens(
    client: httpx.AsyncClient,
    base_url: str,
    path: str,
    body: Mapping[str, Any],
    timeout_s: float = 2.0,
) -> int | None:
    """Prompt tokens of a completions (``prompt``) or chat (``messages`` with the fields the
    chat template renders, :data:`TEMPLATE_FIELDS`) request, as the backend at ``base_url``
    counts them; None when it cannot say (no ``/tokenize``, an error, a timeout after
    ``timeout_s`` seconds, a batch prompt, another endpoint's shape: the caller's bound
    stands then)."""
    if path.endswith("/chat/completions"):
        payload = {"model": body.get("model")}
        payload |= {k: body[k] for k in TEMPLATE_FIELDS if body.get(k) is not None}
    elif isinstance(body.get("prompt"), str):
        payload = {"model": body.get("model"), "prompt": body["prompt"]}
    else:
        return None
    try:
        response = await client.post(f"{base_url}/tokenize", json=payload, timeout=timeout_s)
        count = response.json()["count"] if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        count = None
    if not isinstance(count, int):
        logger.info("no token count from %s/tokenize: the guards use the bound", base_url)
        return None
    return count
