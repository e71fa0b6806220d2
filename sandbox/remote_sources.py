"""``ADD <url>`` sources, fetched here and handed to the build as files.

The guard (:mod:`.build_guard`) turns an ``ADD`` of a URL into a ``COPY`` of its download, and
this module fetches it, only from where a ``RUN`` step could connect: each name is resolved
once, every address it has must be public (routed out of an uplink, not one of the host's own,
not link-local, not a private network: :func:`.firewall.public_addresses`, the check the proxy
relay makes too), and the connection goes to an address so checked, never to a second lookup's
answer. A redirect is checked the same way. Through the host's proxy (when one is set) the proxy
makes the connection, but a private or loopback destination is still refused before it is asked.
An ``ADD`` the guard misses is fetched by buildah in the builder's container (:mod:`.builder`),
on the trials' guarded bridge, which reaches no host address either.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path
from urllib.parse import urljoin, urlsplit, urlunsplit
from urllib.request import getproxies, proxy_bypass

import httpx

from prefect_harbor.sandbox.firewall import DestinationRefused, public_addresses

#: The most one ``ADD`` URL may download.
MAX_DOWNLOAD_BYTES = 2 * 1024**3
_MAX_REDIRECTS = 10


class RemoteSourceError(ValueError):
    """An ``ADD`` URL that may not or could not be fetched; the message names it and why."""


async def fetch(url: str, destination: Path, *, timeout_sec: float = 600) -> None:
    """Download ``url`` to ``destination`` (mode 0600, as Docker's ``ADD`` leaves it)."""
    proxy = _proxy_for(url)
    async with httpx.AsyncClient(proxy=proxy, trust_env=False, verify=ssl.create_default_context(), timeout=timeout_sec) as client:
        for _ in range(_MAX_REDIRECTS + 1):
            request_url, headers, extensions = await _pinned(url, via_proxy=proxy is not None)
            async with client.stream("GET", request_url, headers=headers, extensions=extensions) as response:
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code != 200:
                    raise RemoteSourceError(f"ADD {url}: the server answered {response.status_code} {response.reason_phrase}.")
                await _save(response, destination, url)
                return
    raise RemoteSourceError(f"ADD {url}: more than {_MAX_REDIRECTS} redirects.")


async def _pinned(url: str, *, via_proxy: bool) -> tuple[str, dict[str, str], dict]:
    """The request for ``url``: its host checked public, and (without a proxy) the address itself to connect to."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteSourceError(f"ADD {url}: only http(s) URLs can be added; copy the file into the task's environment folder instead.")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = await asyncio.to_thread(public_addresses, parts.hostname, port)
    except DestinationRefused as refused:
        raise RemoteSourceError(
            f"ADD {url}: {refused}; a build may not fetch from there. Put the file in the task's environment folder and COPY it."
        ) from None
    if via_proxy:
        return url, {}, {}
    address = addresses[0]
    literal = f"[{address}]" if ":" in address else address
    netloc = f"{literal}:{parts.port}" if parts.port else literal
    host_header = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, "")), {"Host": host_header}, {"sni_hostname": parts.hostname}


def _proxy_for(url: str) -> str | None:
    """The host's proxy for ``url`` (``*_PROXY``, ``NO_PROXY`` honoured), as the standard library reads them."""
    parts = urlsplit(url)
    if proxy_bypass(parts.hostname or ""):
        return None
    proxies = getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


async def _save(response: httpx.Response, destination: Path, url: str) -> None:
    received = 0
    descriptor = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        async for chunk in response.aiter_bytes():
            received += len(chunk)
            if received > MAX_DOWNLOAD_BYTES:
                raise RemoteSourceError(f"ADD {url}: larger than {MAX_DOWNLOAD_BYTES // 1024**3} GiB.")
            handle.write(chunk)
