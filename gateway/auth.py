"""Client API keys and the admin token.

Client keys (``Authorization: Bearer KEY`` on ``/v1/*`` and the relayed backend paths but
``/ping`` and ``/version``) come from ``SPECGATE_API_KEYS`` (comma-separated) and
``SPECGATE_API_KEYS_FILE`` (one per line, ``#`` comments); with none, those are open. The
admin token guards ``/routes*`` and ``/status``; without one, those answer only on a
loopback listener, and :func:`build_auth` refuses a non-loopback gateway with admin
endpoints enabled and no token. Keys are compared in constant time
(``hmac.compare_digest``) and never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request

from gateway.errors import GatewayError
from gateway.settings import Settings


class InsecureSettings(Exception):
    """The settings would expose admin endpoints without a token; the message says why."""


@dataclass(frozen=True, slots=True)
class Auth:
    """The accepted client keys and admin token, as bytes for constant-time comparison."""

    client_keys: tuple[bytes, ...]
    admin_token: bytes | None

    def client_ok(self, authorization: str | None) -> bool:
        """True when no keys are configured or the header carries one of them."""
        if not self.client_keys:
            return True
        given = _bearer(authorization)
        # compare against every key so timing does not reveal which one matched
        return sum(hmac.compare_digest(given, key) for key in self.client_keys) > 0

    def admin_ok(self, authorization: str | None) -> bool:
        """True when no admin token is configured (loopback only) or the header carries it."""
        if self.admin_token is None:
            return True
        return hmac.compare_digest(_bearer(authorization), self.admin_token)


def _bearer(authorization: str | None) -> bytes:
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip().encode() if scheme.lower() == "bearer" else b""


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_auth(settings: Settings) -> Auth:
    """Read keys from settings and the key file.

    Raises :class:`InsecureSettings` when the gateway listens beyond loopback with admin
    endpoints enabled and no admin token, and OSError when the key file cannot be read.
    """
    keys = []
    if settings.api_keys is not None:
        keys += settings.api_keys.get_secret_value().split(",")
    if settings.api_keys_file is not None:
        for line in settings.api_keys_file.read_text(encoding="utf-8").splitlines():
            keys.append(line.split("#", 1)[0])
    client_keys = tuple(k.strip().encode() for k in keys if k.strip())
    token = settings.admin_token.get_secret_value().strip() if settings.admin_token else ""
    if settings.admin_enabled and not token and not is_loopback(settings.host):
        raise InsecureSettings(
            f"refusing to listen on {settings.host} with admin endpoints (/routes, reload) and "
            "no admin token: set SPECGATE_ADMIN_TOKEN, listen on 127.0.0.1, or set "
            "SPECGATE_ADMIN_ENABLED=false"
        )
    return Auth(client_keys, token.encode() or None)


def header_text(raw: bytes) -> str:
    """A raw header name or value as text: UTF-8, or Latin-1 for bytes that are not UTF-8.

    Every path reads headers this way (the routed endpoints, and the dependencies below), so
    a key is accepted or refused alike everywhere; UTF-8 is also what the upstream client
    writes back, so a UTF-8 value reaches the backend as the client sent it.
    """
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _authorization(request: Request) -> str | None:
    for name, value in request.scope["headers"]:
        if name == b"authorization":
            return header_text(value)
    return None


def check_client_key(auth: Auth, authorization: str | None) -> None:
    """Raise :class:`GatewayError` 401 (OpenAI's ``invalid_api_key``) unless
    ``authorization`` carries a valid client key (or none is configured)."""
    if not auth.client_ok(authorization):
        raise GatewayError(
            401,
            "Incorrect API key provided.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_client_key(
    auth: Auth, open_paths: frozenset[str] = frozenset()
) -> Callable[[Request], Awaitable[None]]:
    """Dependency for ``/v1/*`` and the relayed paths: 401 in OpenAI's envelope (Anthropic's
    on its Messages paths) without a valid client key, except on ``open_paths`` (exact
    paths, the app's ``root_path`` removed, as vLLM's ``AuthenticationMiddleware`` compares
    them)."""

    async def check(request: Request) -> None:
        scope = request.scope
        if open_paths and scope["path"].removeprefix(scope.get("root_path", "")) in open_paths:
            return
        check_client_key(auth, _authorization(request))

    return check


def require_admin(auth: Auth) -> Callable[[Request], Awaitable[None]]:
    """Dependency for admin endpoints: 401 without the admin token (when one is set)."""

    async def check(request: Request) -> None:
        if not auth.admin_ok(_authorization(request)):
            raise GatewayError(
                401,
                "This endpoint needs the admin token.",
                code="invalid_admin_token",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check
