"""Allowlist networking: a restricted trial reaches the hosts its task allows, and nothing else.

A trial whose network is restricted (task.toml's ``network_mode = "allowlist"`` or
``"no-network"``, for the environment or a phase) has no network interface: its container, or
its pod, is started with ``--network none``, so no packet leaves it, DNS included. Into its
network namespace this process puts one listening socket, on the container's own loopback
(:data:`PROXY_ADDRESS`), made by a thread that enters the namespace for that alone: the socket
stays this process's, so nothing in the container can close or replace it. It is made before
any command Harbor runs (an image's ``ENTRYPOINT`` runs first: one that takes the port fails
its own trial's start). The container gets ``HTTP_PROXY``/``HTTPS_PROXY`` pointing at it.

Each connection there is an HTTP proxy request (``CONNECT host:port``, or an absolute URL),
checked against the phase's ``allowed_hosts`` as Harbor validates them (a name, a ``*.`` wildcard
for the names under it, an address, a CIDR range). An allowed name is resolved here, on the
host, and refused unless every address is public (:func:`.firewall.public_addresses`: never the
host, its loopback, a private network or a link-local address, whatever the list says); then it
is opened from the host, directly or through the host's proxy. One allowed host is no front for
another: an absolute URL's ``Host`` header must name the URL's host, and a tunnel's TLS hello
(:mod:`.tls_hello`) an allowed one. A model endpoint's relay (:mod:`.network`) is reachable as the
task's allowlist says; the host proxy's relay never is. Under ``no-network`` the list is empty:
every request is refused. A phase switch changes the list, never the network, and ends the
connections the new list does not allow.

Every destination asked for, allowed or refused, is written to the trial's sandbox report
(:mod:`.trial_report`, section ``network``), the first :data:`MAX_RECORDED` of them: the row's
``hosts_tried``. A trial holds at most :data:`MAX_CONNECTIONS` connections (each a thread here).

What differs from Harbor's sidecar (a transparent proxy): only what goes through the proxy
variables (curl, pip, uv, apt, git, npm, Python's HTTP clients) reaches an allowed host here; a
program that opens its own sockets, or resolves names itself, reaches nothing. Through the
host's own proxy, that proxy resolves the name again (a name whose answers change between the
two lookups is not caught here, as for :mod:`.proxy`'s relay).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from harbor.models.task.config import NetworkAllowlistEntryType, NetworkMode, NetworkPolicy, classify_network_allowlist_entry

from prefect_harbor.sandbox import tls_hello
from prefect_harbor.sandbox.firewall import DestinationRefused, public_addresses
from prefect_harbor.sandbox.network import Forward, pipe, relay_addresses
from prefect_harbor.sandbox.proxy import MAX_HEAD_BYTES, basic_credentials, host_proxy_settings, read_head

#: Where a restricted container finds its proxy: its own loopback.
PROXY_ADDRESS = ("127.0.0.1", 3128)
#: Connections one trial may hold open at once: each is a thread of this process, which no limit
#: of the container's counts, so more are answered 503 and closed.
MAX_CONNECTIONS = 64
#: Destinations one trial's report records; more are counted, not listed (each is a line of the report).
MAX_RECORDED = 200
#: How long an upstream may go on answering once its client has finished sending.
_DRAIN_SEC = 30.0
#: How long a client may take to send its request head, and an upstream to answer a connect.
_HEAD_TIMEOUT_SEC = 60.0
_CONNECT_TIMEOUT_SEC = 30.0


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

    @property
    def key(self) -> str:
        """The attempt's place in the report: one per destination and verdict."""
        return f"{self.host}:{self.port}:{self.allowed}"


@dataclass
class _Connection:
    """A client's connection: the host it was allowed to, and the upstream opened for it."""

    host: str | None = None
    upstream: socket.socket | None = None


class EgressProxy:
    """One trial's proxy: the listener in its namespace, the phase's policy, what was asked for.

    ``record`` is called with each new :class:`Attempt` (at most :data:`MAX_RECORDED`), and
    ``flush`` with them all, their counts final, at :meth:`close` (the trial's sandbox report)."""

    def __init__(self, policy: NetworkPolicy, record: Callable[[Attempt], None], flush: Callable[[list[Attempt], int], None]) -> None:
        self.policy = policy
        self._record, self._flush = record, flush
        self._attempts: dict[tuple[str, int, bool], Attempt] = {}
        self._unrecorded = 0
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._connections: dict[socket.socket, _Connection] = {}

    def start(self, pid: int) -> None:
        """Listen in the namespace of ``pid`` (the trial's main container) and serve until :meth:`close`."""
        self._listener = listen_in_namespace(pid)
        threading.Thread(target=self._serve, args=(self._listener,), name=f"egress-{pid}", daemon=True).start()

    def switch(self, policy: NetworkPolicy) -> None:
        """Take a phase's policy, and end the connections it would not allow (a tunnel the agent
        opened does not outlive its phase into the verifier's)."""
        with self._lock:
            self.policy = policy
            ended = [(client, open_) for client, open_ in self._connections.items() if open_.host is None or not allows(policy, open_.host)]
        for client, open_ in ended:
            _end(client, open_)

    def close(self) -> None:
        """Stop listening, end every open connection (both sides), and hand over the final counts."""
        listener, self._listener = self._listener, None
        if listener is not None:
            _close(listener)
        with self._lock:
            connections, self._connections = list(self._connections.items()), {}
            attempts, unrecorded = [dataclasses.replace(attempt) for attempt in self._attempts.values()], self._unrecorded
        for client, open_ in connections:
            _end(client, open_)
        self._flush(attempts, unrecorded)

    def _serve(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                full = len(self._connections) >= MAX_CONNECTIONS
                if not full:
                    self._connections[client] = _Connection()
            try:
                if not full:
                    threading.Thread(target=self._handle, args=(client,), daemon=True).start()
                    continue
            except RuntimeError:  # this process has no thread left to give
                with self._lock:
                    self._connections.pop(client, None)
            _answer(client, 503, f"the trial has {MAX_CONNECTIONS} connections open through its proxy already, or the sweep has no thread left")
            _close(client)

    def _handle(self, client: socket.socket) -> None:
        open_: _Connection | None = None
        try:
            client.settimeout(_HEAD_TIMEOUT_SEC)
            reader = client.makefile("rb")
            request = _Request.read(reader)
            if request is None:
                return _answer(client, 400, "not an HTTP proxy request (CONNECT host:port, or an absolute http:// URL) for a valid host name")
            named = request.host_header()
            if named is not None and named != request.host:
                return _answer(client, 403, self._note(request.host, request.port, f"its Host header names {named[:253]}, not {request.host}"))
            if refusal := self._check(request.host, request.port):
                return _answer(client, 403, refusal)
            with self._lock:
                open_ = self._connections.get(client)
                if open_ is None or not allows(self.policy, request.host):
                    return  # the phase switched meanwhile
                open_.host = request.host
            try:
                upstream = _open(request.host, request.port)
            except (OSError, DestinationRefused) as error:
                return _answer(client, 502, f"{request.host}:{request.port} could not be reached ({error})")
            with self._lock:
                open_.upstream = upstream
            client.settimeout(None)  # a tunnel may be quiet: the cap, a phase switch and stop() end it
            self._relay(client, reader, upstream, request)
        except OSError:
            pass
        finally:
            with self._lock:
                self._connections.pop(client, None)
            _end(client, open_ or _Connection())

    def _relay(self, client: socket.socket, reader, upstream: socket.socket, request: _Request) -> None:
        """Copy both ways; a tunnel's TLS hello must name an allowed host (no fronting)."""
        pump = threading.Thread(target=pipe, args=(upstream.recv, client), daemon=True)
        if request.method == "CONNECT":
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            pump.start()  # a server that speaks first (SSH, SMTP) is heard before the client's first byte
            first = reader.peek(1)[:1]
            if first and tls_hello.is_handshake(first) and self._check_hello(reader, upstream, request) is not None:
                return  # refused and recorded: the client, in TLS already, sees the tunnel end
        else:
            upstream.sendall(request.origin_head())
            pump.start()
        pipe(reader.read1, upstream)
        pump.join(_DRAIN_SEC)  # the client is done: the upstream has this long to finish its answer
        _close(upstream)
        pump.join()

    def _check_hello(self, reader, upstream: socket.socket, request: _Request) -> str | None:
        """Read the client's TLS hello and pass it on; why the tunnel ends instead, or None."""
        header = reader.read(tls_hello.HEADER)
        try:
            payload = reader.read(tls_hello.record_length(header))
            name = tls_hello.server_name(payload)
        except tls_hello.NotAHello as error:
            return self._note(request.host, request.port, f"a TLS hello that cannot be read ({error})")
        if name is not None and name != request.host.lower() and not allows(self.policy, name):
            return self._note(name, request.port, f"a TLS hello for {name[:253]} in a tunnel to {request.host}")
        upstream.sendall(header + payload)
        return None

    def _check(self, host: str, port: int) -> str:
        """Why a request for ``host:port`` is refused, or ``""``; either way it is recorded."""
        why = ""
        if (host.strip("[]"), port) in relay_addresses(Forward) and allows(self.policy, host):
            pass  # a model endpoint's relay, which the task's allowlist names (Harbor adds the endpoint's host)
        elif not allows(self.policy, host):
            mode = self.policy.network_mode.value
            why = "the phase has no network (no-network)" if mode == NetworkMode.NO_NETWORK.value else f"{host} is not in the task's allowed_hosts"
        else:
            try:
                public_addresses(host, port)
            except DestinationRefused as refused:
                why = str(refused)
        return self._note(host, port, why)

    def _note(self, host: str, port: int, why: str) -> str:
        """Count a request for ``host:port`` (``why`` it was refused, or ``""``); ``why`` back."""
        with self._lock:
            attempt = self._attempts.get((host, port, not why))
            if attempt is None and len(self._attempts) >= MAX_RECORDED:
                self._unrecorded += 1
                return why
            new = attempt is None
            attempt = attempt or self._attempts.setdefault((host, port, not why), Attempt(host, port, not why, why[:300]))
            attempt.count += 1
            snapshot = dataclasses.replace(attempt)
        if new:
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
        """The request whose head ``reader`` gives, or None when it names no destination the proxy can check."""
        head = read_head(reader)
        words = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        if len(words) != 3:
            return None
        method, target, _ = words
        try:
            if method.upper() == "CONNECT":
                parts = urlsplit(f"//{target}")
                request = cls("CONNECT", parts.hostname or "", parts.port or 443, head)
            else:
                parts = urlsplit(target)
                if parts.scheme.lower() != "http":
                    return None
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                request = cls(method, parts.hostname or "", parts.port or 80, head, path)
        except ValueError:  # a port that is no number
            return None
        return request if _valid_host(request.host) else None

    def host_header(self) -> str | None:
        """The host the ``Host`` header names (lower-cased, without its port), or None without one."""
        for line in self.head.split(b"\r\n")[1:]:
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "host" and value.strip():
                try:
                    return urlsplit(f"//{value.strip()}").hostname or value.strip()
                except ValueError:
                    return value.strip()
        return None

    def origin_head(self) -> bytes:
        """The request as its origin server reads it: the path alone, one request per connection."""
        lines = self.head.split(b"\r\n")
        method, _, version = lines[0].split(b" ")
        dropped = (b"proxy-", b"connection:", b"keep-alive:")
        kept = [line for line in lines[1:] if line and not line.lower().startswith(dropped)]
        return b"\r\n".join([b" ".join([method, self.path.encode("latin-1"), version]), *kept, b"Connection: close", b"", b""])


_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_.])?")


def _valid_host(host: str) -> bool:
    """A name of DNS's shape (at most 253 characters of letters, digits, ``-``, ``_`` and dots) or an address."""
    if not host or len(host) > 253:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return _HOST_NAME.fullmatch(host) is not None


def _open(host: str, port: int) -> socket.socket:
    """A connection to ``host:port`` from the host: direct, to an address checked public, or
    through the host's proxy (a tunnel), as the host itself goes out."""
    if (host.strip("[]"), port) in relay_addresses(Forward):
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
        head += f"Proxy-Authorization: {basic_credentials(unquote(parts.username or ''), unquote(parts.password or '')).decode()}\r\n"
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


def _end(client: socket.socket, open_: _Connection) -> None:
    """End a client's connection and its upstream's."""
    _close(client)
    if open_.upstream is not None:
        _close(open_.upstream)


def _close(connection: socket.socket) -> None:
    try:
        connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    connection.close()
