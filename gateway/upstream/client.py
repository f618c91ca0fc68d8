"""The HTTP exchange with one backend, behind one small interface with two engines.

:class:`AiohttpUpstream` (the default) talks to backends with an ``aiohttp.ClientSession``
directly: aiohttp's C HTTP parser and O(1) connection pool, no per-request URL, cookie or
header objects (measured in docs/benchmarks.md: the httpx layer over aiohttp was about a tenth
of the gateway's CPU per request). :class:`HttpxUpstream` does the same over an
``httpx.AsyncClient``: selected with ``SPECGATE_UPSTREAM_TRANSPORT=httpx`` (httpcore), and used
by in-process tests, whose fake backends are httpx transports.

Both give the forwarder the same three failure kinds, so failover and error mapping do not
depend on the engine:

* :class:`UpstreamUnreachable`: nothing came back before the response headers (refused,
  reset, connect or pool timeout): the next backend may be tried; its subclass
  :class:`UpstreamDropped` says the connection was made and then lost before the headers
  (the request may have reached the backend: the forwarder checks for a backend death before
  failing over);
* :class:`UpstreamTimeout`: connected, but no headers within the first-byte timeout (the
  request may be running there, so it is not retried);
* :class:`UpstreamBroken`: the body failed after the headers (reset, no first chunk within
  the first-byte timeout, or a later gap between chunks longer than the idle timeout).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx

#: Headers an ``httpx.AsyncClient`` adds to every request by default.
_HTTPX_DEFAULTS = frozenset({"accept", "accept-encoding", "user-agent", "connection"})


class UpstreamUnreachable(Exception):
    """The backend sent no response (connection refused, reset or timed out)."""


class UpstreamDropped(UpstreamUnreachable):
    """The connection was made, then closed or reset before the response headers."""


class UpstreamTimeout(Exception):
    """The backend sent no response headers within the first-byte timeout."""


class UpstreamBroken(Exception):
    """The response body failed part-way (reset, or a gap longer than its timeout)."""


class UpstreamResponse(Protocol):
    """A backend response whose status and headers have arrived."""

    status: int
    #: Response headers as sent, names lower-cased (ASGI's form).
    raw_headers: list[tuple[bytes, bytes]]

    def chunks(self) -> AsyncIterator[bytes]:
        """The raw body bytes as they arrive; raises :class:`UpstreamBroken`."""
        ...

    async def aclose(self) -> None:
        """Release the connection (back to the pool once the body was read, else closed, so
        the backend sees the disconnect and aborts the generation)."""
        ...


class UpstreamClient(Protocol):
    """Sends one request (a POST, for the routed endpoints) to a backend."""

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        method: str = "POST",
        first_byte_timeout_s: float,
        idle_timeout_s: float,
    ) -> UpstreamResponse:
        """Send ``body`` to ``url`` (``method``: POST unless a relayed path's request says
        otherwise); returns once the status and headers are in.

        ``first_byte_timeout_s`` bounds the wait for the headers and then for the first body
        chunk (vLLM sends a stream's headers at once and its first chunk after the prefill),
        ``idle_timeout_s`` each later gap between chunks (seconds). Raises
        :class:`UpstreamUnreachable` or :class:`UpstreamTimeout`.
        """
        ...

    async def aclose(self) -> None:
        """Close the connection pool."""
        ...


@dataclass(slots=True)
class _AiohttpResponse:
    response: aiohttp.ClientResponse
    status: int
    raw_headers: list[tuple[bytes, bytes]]
    idle_timeout_s: float

    async def chunks(self) -> AsyncIterator[bytes]:
        first = True
        try:
            async for chunk in self.response.content.iter_any():
                if first:  # from now on the gaps between chunks are bounded by the idle timeout
                    first = False
                    connection = self.response.connection  # None once the body is all in
                    if connection is not None and connection.protocol is not None:
                        connection.protocol.read_timeout = self.idle_timeout_s
                        connection.protocol.start_timeout()  # re-armed now
                yield chunk
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise UpstreamBroken(type(exc).__name__) from exc

    async def aclose(self) -> None:
        if self.response.content.at_eof():
            self.response.release()
        else:
            self.response.close()


class AiohttpUpstream:
    """:class:`UpstreamClient` on one ``aiohttp.ClientSession``.

    ``max_connections`` caps the pool (all backends together); ``connect_timeout_s`` bounds
    the wait for a pooled connection plus the TCP connect; ``keep_alive_s`` is how long an
    idle pooled connection is kept (``Settings.backend_keep_alive_s``). The body is sent and
    relayed as bytes: no automatic ``Content-Type``, ``Accept-Encoding`` or ``User-Agent`` is
    added and nothing is decompressed, so the backend sees the client's headers and the client
    the backend's bytes. Must be built inside a running event loop.
    """

    def __init__(
        self, *, max_connections: int, connect_timeout_s: float, keep_alive_s: float
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}  # by first-byte timeout
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=max_connections, limit_per_host=0, keepalive_timeout=keep_alive_s
            ),
            auto_decompress=False,
            skip_auto_headers=("Content-Type", "Accept-Encoding", "User-Agent"),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        method: str = "POST",
        first_byte_timeout_s: float,
        idle_timeout_s: float,
    ) -> UpstreamResponse:
        """See :meth:`UpstreamClient.post`."""
        timeout = self._timeouts.get(first_byte_timeout_s)
        if timeout is None:
            timeout = self._timeouts[first_byte_timeout_s] = aiohttp.ClientTimeout(
                total=None,
                connect=self.connect_timeout_s,
                sock_connect=self.connect_timeout_s,
                sock_read=first_byte_timeout_s,
            )
        try:
            response = await self.session.request(
                method, url, data=body, headers=headers, timeout=timeout
            )
        except aiohttp.SocketTimeoutError as exc:  # connected; no headers in time
            raise UpstreamTimeout(str(exc)) from exc
        except aiohttp.ClientConnectorError as exc:  # never connected
            raise UpstreamUnreachable(type(exc).__name__) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise UpstreamDropped(type(exc).__name__) from exc
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise UpstreamUnreachable(type(exc).__name__) from exc
        raw = [(k.lower(), v) for k, v in response.raw_headers]
        return _AiohttpResponse(response, response.status, raw, idle_timeout_s)

    async def aclose(self) -> None:
        """See :meth:`UpstreamClient.aclose`."""
        await self.session.close()


@dataclass(slots=True)
class _HttpxResponse:
    response: httpx.Response
    status: int
    raw_headers: list[tuple[bytes, bytes]]
    first_byte_timeout_s: float
    idle_timeout_s: float

    async def chunks(self) -> AsyncIterator[bytes]:
        # httpcore reads its read timeout once, when the body starts: the first chunk and
        # the later gaps are bounded here instead (its own read timeout is the first-byte one)
        parts = self.response.aiter_raw()
        timeout = self.first_byte_timeout_s
        while True:
            try:
                async with asyncio.timeout(timeout):
                    chunk = await anext(parts)
            except StopAsyncIteration:
                return
            except (TimeoutError, httpx.HTTPError) as exc:
                raise UpstreamBroken(type(exc).__name__) from exc
            timeout = self.idle_timeout_s
            yield chunk

    async def aclose(self) -> None:
        await self.response.aclose()


@dataclass(slots=True)
class HttpxUpstream:
    """:class:`UpstreamClient` on an ``httpx.AsyncClient`` (its transport: httpcore, or an
    in-process fake in tests). The client's connect and pool timeouts apply; the read
    timeout until the headers is the first-byte one, the first chunk and later gaps are
    bounded by the response's own clock. httpx's default request headers (``Accept``,
    ``Accept-Encoding``, ``User-Agent``, ``Connection``) are removed unless the client sent
    them. Closing the client is its owner's business."""

    client: httpx.AsyncClient

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        method: str = "POST",
        first_byte_timeout_s: float,
        idle_timeout_s: float,
    ) -> UpstreamResponse:
        """See :meth:`UpstreamClient.post`."""
        encoded = [(k.encode(), v.encode()) for k, v in headers.items()]  # UTF-8, as aiohttp
        request = self.client.build_request(method, url, content=body, headers=encoded)
        for name in _HTTPX_DEFAULTS.difference(headers):  # only the client's headers go
            request.headers.pop(name, None)
        request.extensions["timeout"]["read"] = first_byte_timeout_s
        try:
            response = await self.client.send(request, stream=True)
        except httpx.ReadTimeout as exc:
            raise UpstreamTimeout(str(exc)) from exc
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            raise UpstreamDropped(type(exc).__name__) from exc
        except httpx.HTTPError as exc:
            raise UpstreamUnreachable(type(exc).__name__) from exc
        raw = [(k.lower(), v) for k, v in response.headers.raw]
        return _HttpxResponse(
            response, response.status_code, raw, first_byte_timeout_s, idle_timeout_s
        )

    async def aclose(self) -> None:
        """Nothing: the client belongs to the app's lifespan."""
