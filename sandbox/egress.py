"""Allowlist networking: a restricted trial reaches the hosts its task allows, and nothing else.

A trial whose network is restricted (task.toml's ``network_mode = "allowlist"`` or
``"no-network"``, for the environment or a phase) has no network interface: its container, or
its pod, is started with ``--network none``, so no packet leaves it, DNS included. Into its
network namespace this process puts one listening socket, on the container's own loopback
(:data:`PROXY_ADDRESS`), made by a thread that enters the namespace for that alone: the socket
stays this process's, so nothing in the container can close, replace or answer on that port
before it. The container gets ``HTTP_PROXY``/``HTTPS_PROXY`` pointing at it.

Each connection there is an HTTP proxy request (``CONNECT host:port``, or an absolute URL),
checked against the phase's ``allowed_hosts`` as Harbor validates them (a name, a ``*.`` wildcard
for the names under it, an address, a CIDR range). An allowed name is resolved here, on the
host, and refused unless every address is public (:func:`.firewall.public_addresses`: never the
host, its loopback, a private network or a link-local address, whatever the list says); then it
is opened from the host, directly or through the host's proxy. The model endpoint's relay
(:mod:`.network`) is reachable as the task's allowlist says. Under ``no-network`` the list is
empty: every request is refused. A phase switch changes the list, never the network.

Every destination asked for, allowed or refused, is written to the trial's sandbox report
(:mod:`.trial_report`, section ``network``): the row's ``hosts_tried``.

What differs from Harbor's sidecar (a transparent proxy): only what goes through the proxy
variables (curl, pip, uv, apt, git, npm, Python's HTTP clients) reaches an allowed host here; a
program that opens its own sockets, or resolves names itself, reaches nothing.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from harbor.models.task.config import NetworkAllowlistEntryType, NetworkMode, NetworkPolicy, classify_network_allowlist_entry

from prefect_harbor.sandbox.firewall import DestinationRefused, public_addresses
from prefect_harbor.sandbox.network import pipe, relay_addresses
from prefect_harbor.sandbox.proxy import MAX_HEAD_BYTES, host_proxy_settings

#: Where a restricted container finds its proxy: its own loopback.
PROXY_ADDRESS = ("127.0.0.1", 3128)
#: Connections one trial may hold open at once: each is a thread of this process, which no limit
#: of the container's counts, so more are answered 503 and closed.
MAX_CONNECTIONS = 64
#: How long a client may take to send its request head, and an upstream to answer a connect.
_HEAD_TIMEOUT_SEC = 60.0
_CONNECT_TIMEOUT_SEC = 30.0
logger = logging.getLogger(__name__)


def proxy_variables(service_names: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """A restricted container's proxy settings, both spellings (tools read one or the other); its
    own loopback and its compose services (on that loopback, in a pod) are never proxied."""
    url = f"http://{PROXY_ADDRESS[0]}:{PROXY_ADDRESS[1]}"
    exempt = ",".join(dict.fromkeys(["localhost", "127.0.0.1", "::1", *service_names]))
    return {name: value for key, value in (("http_proxy", url), ("https_proxy", url), ("no_proxy", exempt)) for name in (key, key.upper())}


def allows(policy: NetworkPolicy, host: str) -> bool:
    """Whether ``policy`` lets a trial ask for ``host`` (a name or an address literal)."""
    if policy.network_mode == NetworkMode.PUBLIC:
        return True
    if policy.network_mode == NetworkMode.NO_NETWORK:
        return False
    host = host.strip("[]").lower().rstrip(".")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for entry in policy.allowed_hosts:
        kind = classify_network_allowlist_entry(entry)
        if address is None:
            if kind == NetworkAllowlistEntryType.HOSTNAME and host == entry:
                return True
            if kind == NetworkAllowlistEntryType.WILDCARD_HOSTNAME and host.endswith(entry[1:]):
                return True
        elif kind in (NetworkAllowlistEntryType.IPV4_ADDRESS, NetworkAllowlistEntryType.IPV6_ADDRESS):
            if address == ipaddress.ip_address(entry):
                return True
        elif kind in (NetworkAllowlistEntryType.IPV4_CIDR, NetworkAllowlistEntryType.IPV6_CIDR):
            if address in ipaddress.ip_network(entry):
                return True
    return False


def listen_in_namespace(pid: int, address: tuple[str, int] = PROXY_ADDRESS) -> socket.socket:
    """A listening socket at ``address`` in the network namespace of process ``pid`` (host root).

    A thread of its own enters the namespace, makes the socket and leaves: a socket keeps the
    namespace it was made in, and no other thread of this process ever is in the container's."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def make() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.setns(target, os.CLONE_NEWNET)
                try:
                    made.append(socket.create_server(address, backlog=128))
                finally:
                    os.setns(own, os.CLONE_NEWNET)  # should it fail, the thread ends here and its namespace with it
            finally:
                os.close(target)
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            failed.append(error)
        finally:
            os.close(own)

    thread = threading.Thread(target=make, name=f"egress-listen-{pid}", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise OSError(f"could not listen at {address[0]}:{address[1]} in the trial's network namespace: {failed[0]}") from failed[0]
    return made[0]


@dataclass
class Attempt:
    """One destination a trial asked for: how often, and what it was told."""

    host: str
    port: int
    allowed: bool
    why: str = ""
    count: int = 0
    first: float = field(default_factory=time.time)


class EgressProxy:
    """One trial's proxy: the listener in its namespace, the phase's policy, what was asked for.

    ``record`` is called with each :class:`Attempt` as it changes (the trial's sandbox report)."""

    def __init__(self, policy: NetworkPolicy, record: Callable[[Attempt], None]) -> None:
        self.policy = policy
        self._record = record
        self._attempts: dict[tuple[str, int, bool], Attempt] = {}
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        #: Open connections, and the host each was allowed to (None while its request is read).
        self._connections: dict[socket.socket, str | None] = {}

    def start(self, pid: int) -> None:
        """Listen in the namespace of ``pid`` (the trial's main container) and serve until :meth:`close`."""
        self._listener = listen_in_namespace(pid)
        threading.Thread(target=self._serve, args=(self._listener,), name=f"egress-{pid}", daemon=True).start()

    def switch(self, policy: NetworkPolicy) -> None:
        """Take a phase's policy, and end the connections it would not allow (a tunnel the agent
        opened does not outlive its phase into the verifier's)."""
        with self._lock:
            self.policy = policy
            ended = [connection for connection, host in self._connections.items() if host is None or not allows(policy, host)]
        for connection in ended:
            _close(connection)

    def close(self) -> None:
        """Stop listening and end every open connection."""
        listener, self._listener = self._listener, None
        if listener is not None:
            _close(listener)
        with self._lock:
            connections, self._connections = list(self._connections), {}
        for connection in connections:
            _close(connection)

    @property
    def attempts(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts.values())

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                full = len(self._connections) >= MAX_CONNECTIONS
                if not full:
                    self._connections[client] = None
            if full:
                _answer(client, 503, f"the trial has {MAX_CONNECTIONS} connections open through its proxy already")
                _close(client)
                continue
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        try:
            client.settimeout(_HEAD_TIMEOUT_SEC)
            reader = client.makefile("rb")
            request = _Request.read(reader)
            if request is None:
                return _answer(client, 400, "not an HTTP proxy request (CONNECT host:port, or an absolute http:// URL)")
            refusal = self._check(request.host, request.port)
            if refusal:
                return _answer(client, 403, refusal)
            with self._lock:
                if client not in self._connections or not allows(self.policy, request.host):
                    return  # the phase switched meanwhile
                self._connections[client] = request.host
            try:
                upstream = _open(request.host, request.port)
            except (OSError, DestinationRefused) as error:
                return _answer(client, 502, f"{request.host}:{request.port} could not be reached ({error})")
            client.settimeout(None)
            with upstream:
                if request.method == "CONNECT":
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    upstream.sendall(request.origin_head())
                pump = threading.Thread(target=pipe, args=(upstream.recv, client), daemon=True)
                pump.start()
                pipe(reader.read1, upstream)
                pump.join()
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.pop(client, None)
            _close(client)

    def _check(self, host: str, port: int) -> str:
        """Why a request for ``host:port`` is refused, or ``""``; either way it is recorded."""
        why = ""
        if (host.strip("[]"), port) in relay_addresses() and allows(self.policy, host):
            pass  # the model endpoint's relay, which the task's allowlist names (Harbor adds the endpoint's host)
        elif not allows(self.policy, host):
            mode = self.policy.network_mode.value
            why = "the phase has no network (no-network)" if mode == NetworkMode.NO_NETWORK.value else f"{host} is not in the task's allowed_hosts"
        else:
            try:
                public_addresses(host, port)
            except DestinationRefused as refused:
                why = str(refused)
        with self._lock:
            attempt = self._attempts.setdefault((host, port, not why), Attempt(host, port, not why, why))
            attempt.count += 1
            snapshot = Attempt(attempt.host, attempt.port, attempt.allowed, attempt.why, attempt.count, attempt.first)
        self._record(snapshot)
        return why


@dataclass(frozen=True)
class _Request:
    method: str
    host: str
    port: int
    head: bytes
    path: str = ""

    @classmethod
    def read(cls, reader) -> _Request | None:
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = reader.readline(MAX_HEAD_BYTES)
            if not line or len(head) + len(line) > MAX_HEAD_BYTES:
                return None
            head += line
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        words = request_line.split(" ")
        if len(words) != 3:
            return None
        method, target, _ = words
        try:
            if method.upper() == "CONNECT":
                parts = urlsplit(f"//{target}")
                return cls("CONNECT", parts.hostname or "", parts.port or 443, head) if parts.hostname else None
            parts = urlsplit(target)
            if parts.scheme.lower() != "http" or not parts.hostname:
                return None
            path = parts.path or "/"
            return cls(method, parts.hostname, parts.port or 80, head, path + (f"?{parts.query}" if parts.query else ""))
        except ValueError:  # a port that is no number
            return None

    def origin_head(self) -> bytes:
        """The request as its origin server reads it: the path alone, one request per connection."""
        lines = self.head.split(b"\r\n")
        method, _, version = lines[0].split(b" ")
        dropped = (b"proxy-", b"connection:", b"keep-alive:")
        kept = [line for line in lines[1:] if line and not line.lower().startswith(dropped)]
        return b"\r\n".join([b" ".join([method, self.path.encode("latin-1"), version]), *kept, b"Connection: close", b"", b""])


def _open(host: str, port: int) -> socket.socket:
    """A connection to ``host:port`` from the host: direct, to an address checked public, or
    through the host's proxy (a tunnel), as the host itself goes out."""
    if (host.strip("[]"), port) in relay_addresses():
        return socket.create_connection((host.strip("[]"), port), timeout=_CONNECT_TIMEOUT_SEC)
    proxy = _host_proxy()
    if proxy is None:
        last: OSError | None = None
        for address in public_addresses(host, port):  # the addresses checked: no second lookup to rebind
            try:
                connection = socket.create_connection((address, port), timeout=_CONNECT_TIMEOUT_SEC)
                connection.settimeout(None)
                return connection
            except OSError as error:
                last = error
        raise last or OSError(f"{host} has no address")
    return _tunnel(proxy, host, port)


def _host_proxy() -> str | None:
    settings = host_proxy_settings()
    return settings.get("HTTPS_PROXY") or settings.get("https_proxy") or settings.get("HTTP_PROXY") or settings.get("http_proxy")


def _tunnel(proxy_url: str, host: str, port: int) -> socket.socket:
    """A ``CONNECT`` tunnel to ``host:port`` through the host's proxy, with its credentials."""
    parts = urlsplit(proxy_url if "://" in proxy_url else f"http://{proxy_url}")
    connection = socket.create_connection((parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)), timeout=_CONNECT_TIMEOUT_SEC)
    if parts.scheme == "https":
        connection = ssl.create_default_context().wrap_socket(connection, server_hostname=parts.hostname)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
    if parts.username or parts.password:
        credentials = base64.b64encode(f"{unquote(parts.username or '')}:{unquote(parts.password or '')}".encode()).decode()
        head += f"Proxy-Authorization: Basic {credentials}\r\n"
    connection.sendall((head + "\r\n").encode())
    answer = b""
    while not answer.endswith(b"\r\n\r\n"):
        byte = connection.recv(1)
        if not byte or len(answer) > MAX_HEAD_BYTES:
            break
        answer += byte
    status_line = answer.split(b"\r\n", 1)[0]
    if status_line.split(b" ", 2)[1:2] != [b"200"]:
        connection.close()
        raise OSError(f"the host's proxy answered {status_line.decode('latin-1')[:200]!r}")
    connection.settimeout(None)
    return connection


def _answer(client: socket.socket, status: int, why: str) -> None:
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}[status]
    body = f"prefect-harbor: {why}.\n".encode()
    try:
        client.sendall(b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (status, reason.encode(), len(body), body))
    except OSError:
        pass


def _close(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()
