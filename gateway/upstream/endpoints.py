"""Which backend paths API clients reach through the gateway, and which only operators.

Pure code. A vLLM server lists its paths in ``/openapi.json``; the gateway relays every
*client* path there (tokenizer, version, count_tokens, stored Responses, ...) and keeps the
*operator* ones (cache resets, sleep/wake, profiling, scaling, pausing, weight updates, LoRA
loading, RPC) behind the admin token, at ``/routes/backends/{backend}{path}``.

A path is a client path when it is under ``/v1/`` or ``/v2/`` (except LoRA loading) or one of
:data:`CLIENT_ROOT_PATHS`; every other path is an operator path. Unknown root paths of a
future vLLM are so admin-only until listed here: the safe default.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

#: Root-level paths of vLLM's server that serve API clients.
CLIENT_ROOT_PATHS = frozenset(
    {
        "/tokenize",
        "/detokenize",
        "/version",
        "/ping",
        "/invocations",
        "/pooling",
        "/classify",
        "/score",
        "/rerank",
        "/generative_scoring",
        "/tokenizer_info",
    }
)
#: Client-looking paths that change a server (LoRA adapters): operators only.
OPERATOR_V1_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
#: Stored Responses: reach the backend that created them.
STATEFUL_TEMPLATES = frozenset(
    {"/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel"}
)


def is_client_path(template: str) -> bool:
    """True when API clients may call ``template`` (see the module docstring)."""
    if template in OPERATOR_V1_PATHS:
        return False
    if template.startswith(("/v1/", "/v2/")):
        return True
    return template in CLIENT_ROOT_PATHS


@dataclass(frozen=True, slots=True)
class PathTemplate:
    """One path of a backend's OpenAPI (``/v1/responses/{response_id}``) and its methods
    (upper case)."""

    template: str
    methods: frozenset[str]
    pattern: re.Pattern[str]

    @classmethod
    def of(cls, template: str, methods: Iterable[str]) -> PathTemplate:
        """Compile ``template``: each ``{name}`` matches one path segment."""
        parts = re.split(r"(\{[^}/]+\})", template)
        regex = "".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts)
        return cls(template, frozenset(m.upper() for m in methods), re.compile(regex))


def openapi_templates(schema: object) -> list[PathTemplate]:
    """The path templates of an OpenAPI document (anything malformed is skipped)."""
    paths = schema.get("paths") if isinstance(schema, dict) else None
    if not isinstance(paths, dict):
        return []
    out = []
    for template, item in paths.items():
        if isinstance(template, str) and template.startswith("/") and isinstance(item, dict):
            methods = [m for m in item if m in ("get", "post", "put", "patch", "delete")]
            out.append(PathTemplate.of(template, methods))
    return out


def match(templates: Iterable[PathTemplate], path: str) -> PathTemplate | None:
    """The template ``path`` matches (a literal template before a parameterised one)."""
    found = None
    for candidate in templates:
        if candidate.pattern.fullmatch(path):
            if "{" not in candidate.template:
                return candidate
            found = found or candidate
    return found
