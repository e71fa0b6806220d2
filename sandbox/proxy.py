"""The host's proxy settings as containers get them: never with the proxy's credentials.

Trials and image builds reach the outside through the host's proxy when one is set
(``HTTP_PROXY``, ``HTTPS_PROXY``, ...). A proxy URL can carry a password
(``http://user:password@proxy:3128``); given as it is, the password would be in every
container's environment (``/proc/1/environ``), so in what an agent or a ``RUN`` step prints,
in archives and in build logs. So a proxy that needs credentials, or that listens on the
host's loopback (out of a container's reach), is offered to containers through a relay on
the bridge's gateway (:mod:`.network`): containers get ``http://<gateway>:<port>`` with no
credentials, and the relay adds them to each request head on its way to the real proxy.
Anything else (a proxy without credentials, elsewhere on the network) is passed as it is.
A proxy the relay cannot speak for (a SOCKS proxy with a password) is not passed at all.

The relay forwards only to where a trial may go (:func:`check_destination`): a request for the
host, its loopback, a private network or a link-local address is answered ``403`` and never
reaches the proxy, which may sit on the host's loopback beside the Prefect API.

:func:`proxy_secrets` gives the passwords to the run's redactor, in case one leaks anyway.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import ssl
from functools import cache
from urllib.parse import unquote, urlsplit

from prefect_harbor.sandbox.firewall import DestinationRefused, public_addresses
from prefect_harbor.sandbox.network import Forward, Relay, gateway_address, is_loopback, pipe, relay_for

#: Proxy variables that Docker and buildah pass to RUN steps without a matching ARG (not kept in the image).
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "FTP_PROXY", "ALL_PROXY")
#: The longest request head the relay reads before it gives up on a client.
MAX_HEAD_BYTES = 64 * 1024
logger = logging.getLogger(__name__)


def host_proxy_settings() -> dict[str, str]:
    """The host's proxy variables, as spelled in its environment (both spellings are honoured by tools)."""
    return {name: os.environ[name] for variable in PROXY_VARIABLES for name in (variable, variable.lower()) if os.environ.get(name)}


def container_proxy_variables() -> dict[str, str]:
    """What containers (trials, their services, ``RUN`` steps) get of the host's proxy settings."""
    settings = host_proxy_settings()
    if not settings:
        return {}
    out: dict[str, str] = {}
    for name, value in settings.items():
        if name.upper() == "NO_PROXY":
            continue
        if (reachable := _reachable_proxy(value)) is not None:
            out[name] = reachable
    if any(value != settings[name] for name, value in out.items()):
        # Through a relay, both spellings of each variable (apt and curl read only the lower-case
        # one, as under Docker's proxy settings); the gateway is never proxied, nor the container's
        # own loopback (which the proxy could not reach).
        out |= {name.lower(): value for name, value in out.items()} | {name.upper(): value for name, value in out.items()}
        exempt = [entry for name in ("NO_PROXY", "no_proxy") for entry in settings.get(name, "").split(",") if entry.strip()]
        exempt += ["localhost", "127.0.0.1", "::1", gateway_address()]
        out["NO_PROXY"] = out["no_proxy"] = ",".join(dict.fromkeys(entry.strip() for entry in exempt))
    else:
        out |= {name: value for name, value in settings.items() if name.upper() == "NO_PROXY"}
    return out


def proxy_secrets() -> list[str]:
    """The passwords (and whole credentials) in the host's proxy URLs: what a run's redactor must scrub."""
    found: list[str] = []
    for name, value in host_proxy_settings().items():
        if name.upper() == "NO_PROXY":
            continue
        parts = urlsplit(value)
        if parts.password:
            found += [parts.password, unquote(parts.password)]
        if parts.username and parts.password:
            found.append(f"{parts.username}:{parts.password}")
    return found


def _reachable_proxy(url: str) -> str | None:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    host = parts.hostname or ""
    if not parts.password and not parts.username and not is_loopback(host):
        return url
    if parts.scheme not in ("http", "https"):
        _warn_once(f"A {parts.scheme}:// proxy with credentials or on loopback is not passed to containers: only http(s) proxies can be relayed.")
        return None
    relay = _proxy_relay(parts.scheme, host, parts.port or (443 if parts.scheme == "https" else 80), unquote(parts.username or ""), unquote(parts.password or ""))
    return f"http://{relay.address[0]}:{relay.address[1]}"


@cache
def _warn_once(message: str) -> None:
    logger.warning(message)


@cache
def _proxy_relay(scheme: str, host: str, port: int, username: str, password: str) -> Relay:
    handler = type(
        "CredentialedForward", (AuthenticatingForward,),
        {"authorization": basic_credentials(username, password) if username or password else None, "tls": scheme == "https", "upstream_host": host},
    )  # fmt: skip
    return relay_for((host, port), handler)


def basic_credentials(username: str, password: str) -> bytes:
    """A ``Proxy-Authorization`` value for ``username`` and ``password`` (HTTP Basic)."""
    return b"Basic " + base64.b64encode(f"{username}:{password}".encode())


class AuthenticatingForward(Forward):
    """A container's proxy connection, forwarded to the real proxy with the credentials added.

    Each request head gets the proxy's ``Proxy-Authorization`` (the client's own is dropped);
    bodies pass as they are (by ``Content-Length``). After a ``CONNECT`` (HTTPS through the
    proxy), or a chunked request body, the rest of the connection is copied as it is.
    """

    authorization: bytes | None = None
    tls: bool = False
    upstream_host: str = ""

    def forward(self, client: socket.socket, upstream: socket.socket) -> None:
        reader = client.makefile("rb")
        try:
            while head := read_head(reader):
                try:
                    check_destination(head)
                except DestinationRefused as refused:
                    _refuse(client, upstream, str(refused))
                    return
                length = _content_length(head)
                last = head.split(b" ", 1)[0].upper() == b"CONNECT" or length is None
                # After a tunnel or a chunked body the rest passes as it is, so the proxy is told to read no further request.
                headers = _rewrite(head, self.authorization, close=last)
                upstream.sendall(headers)
                if last or length is None:
                    break
                _copy_exactly(reader, upstream, length)
        except OSError:
            pass
        pipe(reader.read1, upstream)  # a tunnel, a chunked body, or nothing left: as it is

    def open_upstream(self) -> socket.socket:
        upstream = super().open_upstream()
        return ssl.create_default_context().wrap_socket(upstream, server_hostname=self.upstream_host) if self.tls else upstream


def check_destination(head: bytes) -> None:
    """Refuse (:class:`DestinationRefused`) a request whose destination a container may not reach
    through the host's proxy: every host it names, the request line's (``CONNECT host:port``, or an
    absolute URL) and the ``Host`` header's, must resolve to public addresses only
    (:func:`.firewall.public_addresses`). A request that names no destination is refused too.

    The proxy resolves the names again itself: a name whose answers change between the two
    lookups (DNS rebinding) is not caught here; the names are passed on as written, so a proxy
    that allows or denies by name keeps working.
    """
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    words = request_line.split(" ")
    if len(words) != 3:
        raise DestinationRefused(f"cannot read the request line {request_line[:200]!r}")
    method, target, _ = words
    if method.upper() == "CONNECT":
        hosts = [_host_port(f"//{target}", 443)]
    elif "://" in target:
        hosts = [_host_port(target, 80)]
    else:
        raise DestinationRefused(f"{method} {target[:200]}: a request to a proxy names its destination (http://host/path)")
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "host" and value.strip():
            hosts.append(_host_port(f"//{value.strip()}", hosts[0][1]))
    for host, port in hosts:
        public_addresses(host, port)


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    try:
        port = parts.port or default_port
    except ValueError:
        raise DestinationRefused(f"{url[:200]}: not a port") from None
    if not parts.hostname:
        raise DestinationRefused(f"{url[:200]}: no host")
    return parts.hostname, port


def _refuse(client: socket.socket, upstream: socket.socket, why: str) -> None:
    """Answer 403 with ``why``, and end the connection to the proxy, which has been sent nothing."""
    body = f"prefect-harbor: refused: {why}. A trial reaches only the internet through the proxy.\n".encode()
    try:
        client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    except OSError:
        pass
    for end in (upstream, client):
        try:
            end.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def read_head(reader) -> bytes:
    """One request head from ``reader`` (stray blank lines skipped); empty at the end or past :data:`MAX_HEAD_BYTES`."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = reader.readline(MAX_HEAD_BYTES)
        if not line or len(head) + len(line) > MAX_HEAD_BYTES:
            return b""
        head += line
        if head in (b"\r\n", b"\n"):  # stray blank lines between requests
            head = b""
    return head


def _rewrite(head: bytes, authorization: bytes | None, *, close: bool = False) -> bytes:
    """The head with the proxy's credentials in place of the client's (and, with ``close``, ``Connection: close``)."""
    dropped = (b"proxy-authorization:", b"connection:", b"proxy-connection:") if close else (b"proxy-authorization:",)
    lines = head.split(b"\r\n")
    kept = [line for line in lines[1:] if line and not line.lower().startswith(dropped)]
    if authorization:
        kept.append(b"Proxy-Authorization: " + authorization)
    if close:
        kept.append(b"Connection: close")
    return b"\r\n".join([lines[0], *kept, b"", b""])


def _content_length(head: bytes) -> int | None:
    """The body's length: 0 without one, None when it cannot be known (chunked)."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            return None
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            length = int(value.strip())
    return length


def _copy_exactly(reader, sink: socket.socket, length: int) -> None:
    while length > 0:
        data = reader.read1(min(length, 65536))
        if not data:
            raise OSError("the client closed the connection in a request body")
        sink.sendall(data)
        length -= len(data)
