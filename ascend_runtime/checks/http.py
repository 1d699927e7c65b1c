"""HTTP helpers shared by the checks: endpoint URLs and a client session tuned for many streams."""

from __future__ import annotations

import resource
from urllib.parse import urlsplit

import aiohttp

JSON_HEADERS = {"Content-Type": "application/json"}


class EndpointError(ValueError):
    """The endpoint URL is not an http(s) base URL."""


def base_url(endpoint: str) -> str:
    """Normalise ``http://host:port[/v1][/]`` to ``http://host:port`` (raises EndpointError)."""
    url = endpoint.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # .port raises ValueError on a port outside 0..65535
    except ValueError:
        raise EndpointError(f"not an http(s) URL with a valid port: {endpoint!r}; e.g. http://127.0.0.1:8000") from None
    if parts.scheme not in ("http", "https") or not host or any(c.isspace() for c in url) or parts.port == 0:
        raise EndpointError(f"not an http(s) URL with a host: {endpoint!r}; e.g. http://127.0.0.1:8000")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def make_session(timeout_s: float, connect_timeout_s: float | None = None) -> aiohttp.ClientSession:
    """A session without connection-count limits; ``timeout_s`` bounds each socket read (seconds)."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=None, enable_cleanup_closed=False)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_read=timeout_s, sock_connect=connect_timeout_s or timeout_s
    )
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)


def raise_open_file_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards ``wanted`` (capped by the hard limit); return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            return soft
    return soft
