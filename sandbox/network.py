"""The network of ``public`` trials, and the relay that lets containers reach a local model endpoint.

Agents that run inside the container (mini-swe-agent, Osmosis workflows) call the model
themselves. A container has its own loopback, and the host's is deliberately out of its
reach (the Prefect API and every other local service live there). So a model server on
``127.0.0.1:PORT`` is offered to containers through a relay: a TCP forwarder bound to the
``prefect-harbor`` network's gateway address (the host side of the containers' bridge)
that forwards to that one endpoint and nothing else. ``public`` trials reach it;
``no-network`` trials, having no network, do not.

The bridge is guarded by :mod:`.firewall`: containers on it reach the outside world (NAT)
and each relay while it runs, never another host service, another container or another
bridge. Every container's port on the bridge is also marked *isolated* (the kernel's bridge
port isolation), a second wall for hosts whose kernel does not pass bridged traffic through
the firewall.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from prefect_harbor.sandbox import firewall, janitor
from prefect_harbor.sandbox.engine import podman_sync

NETWORK_NAME = "prefect-harbor"
#: The relays bind in this range; the guard admits each one's port while it runs.
RELAY_PORTS = range(47200, 47300)
logger = logging.getLogger(__name__)
_lock = threading.Lock()
_relays: dict[tuple[tuple[str, int], type[socketserver.BaseRequestHandler]], Relay] = {}
_network_ready = False
#: Linux's IP_FREEBIND (<linux/in.h>); Python's socket module does not name it.
_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)


def reachable_from_sandbox(url: str) -> str:
    """``url`` as a container sees it: loopback endpoints go through a relay, others are unchanged."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not is_loopback(host):
        return url
    port = parts.port or (443 if parts.scheme == "https" else 80)
    relay = relay_for((host, port))
    netloc = f"{relay.address[0]}:{relay.address[1]}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ensure_network() -> str:
    """Create the bridge network of ``public`` trials (NAT to the outside) if missing; its name."""
    global _network_ready
    if _network_ready:
        return NETWORK_NAME
    if podman_sync("network", "exists", NETWORK_NAME).returncode != 0:
        created = podman_sync("network", "create", NETWORK_NAME)
        if created.returncode != 0 and podman_sync("network", "exists", NETWORK_NAME).returncode != 0:
            created.check(f"creating the {NETWORK_NAME} network")
    firewall.guard(bridge_name())
    _network_ready = True
    return NETWORK_NAME


@cache
def bridge_name() -> str:
    return _network_info()["network_interface"]


def isolate_ports() -> None:
    """Mark every container port on the bridge isolated (idempotent; a new container's included)."""
    for port in Path(f"/sys/class/net/{bridge_name()}/brif").glob("*"):
        flag = port / "isolated"
        try:
            if flag.read_text().strip() != "1":
                flag.write_text("1")
        except OSError as error:
            logger.warning(f"Could not isolate bridge port {port.name}: {error}; trials on {NETWORK_NAME} can reach each other.")


def _network_info() -> dict:
    inspected = podman_sync("network", "inspect", NETWORK_NAME).check(f"inspecting the {NETWORK_NAME} network")
    (network,) = json.loads(inspected.text)
    return network


def gateway_address() -> str:
    ensure_network()
    return _network_info()["subnets"][0]["gateway"]


class Forward(socketserver.BaseRequestHandler):
    """A relay's connection: both directions copied as they are to the relay's one target."""

    server: Relay

    def handle(self) -> None:
        try:
            upstream = self.open_upstream()
        except OSError:
            return
        with upstream:
            pump = threading.Thread(target=pipe, args=(upstream.recv, self.request), daemon=True)
            pump.start()
            self.forward(self.request, upstream)
            pump.join()

    def open_upstream(self) -> socket.socket:
        return self.server.connect()

    def forward(self, client: socket.socket, upstream: socket.socket) -> None:
        """Client to target; subclasses may rewrite what passes (:mod:`.proxy` adds credentials)."""
        pipe(client.recv, upstream)


def pipe(read: Callable[[int], bytes], sink: socket.socket) -> None:
    """Copy what ``read`` (a socket's ``recv``, a buffered reader's ``read1``) gives to ``sink`` until
    the end, then end ``sink``'s writing side."""
    try:
        while data := read(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class Relay(socketserver.ThreadingTCPServer):
    """A TCP relay on the bridge's gateway to one ``target``, admitted by the host's guard while it runs."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, bind: str, target: tuple[str, int], handler: type[Forward] = Forward) -> None:
        self.target = target
        for port in RELAY_PORTS:
            try:
                super().__init__((bind, port), handler)
                break
            except OSError:
                self.socket.close()
        else:
            raise OSError(f"no free port for a relay in {RELAY_PORTS.start}-{RELAY_PORTS.stop - 1} on {bind}")
        self.owner = janitor.owner_token()
        janitor.ensure_watchdog()  # withdraws the admission if this process dies without closing it
        firewall.admit(*self.address, self.owner)

    def server_bind(self) -> None:
        # The bridge gets its gateway address only when the first container joins it:
        # IP_FREEBIND lets the relay bind to it before then.
        self.socket.setsockopt(socket.IPPROTO_IP, _IP_FREEBIND, 1)
        super().server_bind()

    def connect(self) -> socket.socket:
        upstream = socket.create_connection(self.target, timeout=10)
        upstream.settimeout(None)
        return upstream

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server_address[:2]
        return str(host), port

    def close(self) -> None:
        """Stop serving and withdraw the admission: the port is closed to containers again."""
        self.shutdown()
        self.server_close()
        firewall.withdraw(*self.address, self.owner)


def relay_for(target: tuple[str, int], handler: type[Forward] = Forward) -> Relay:
    """This process's relay to ``target`` (one per target and kind), started on first use."""
    with _lock:
        relay = _relays.get((target, handler))
        if relay is None:
            relay = Relay(gateway_address(), target, handler)
            threading.Thread(target=relay.serve_forever, name=f"relay-{target[1]}", daemon=True).start()
            if not _relays:
                atexit.register(close_relays)
            _relays[(target, handler)] = relay
        return relay


def relay_addresses(kind: type[Forward] | None = None) -> set[tuple[str, int]]:
    """Where this process's relays listen (the bridge's gateway, a port each); with ``kind``, only
    the relays whose connections are exactly that handler's (:class:`Forward`: the model endpoints',
    not the host proxy's)."""
    with _lock:
        return {relay.address[:2] for (_, handler), relay in _relays.items() if kind is None or handler is kind}


def close_relays() -> None:
    """Close every relay of this process (at exit; the watchdog covers a process that is killed)."""
    with _lock:
        relays = list(_relays.values())
        _relays.clear()
    for relay in relays:
        relay.close()
