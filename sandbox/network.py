"""The network of ``public`` trials, and the relay that lets containers reach a local model endpoint.

Agents that run inside the container (mini-swe-agent, Osmosis workflows) call the model
themselves. A container has its own loopback, and the host's is deliberately out of its
reach (the Prefect API and every other local service live there). So a model server on
``127.0.0.1:PORT`` is offered to containers through a relay: a TCP forwarder bound to the
``prefect-harbor`` network's gateway address (the host side of the containers' bridge)
that forwards to that one endpoint and nothing else. ``public`` trials reach it;
``no-network`` trials, having no network, do not.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import socketserver
import threading
from urllib.parse import urlsplit, urlunsplit

from prefect_harbor.sandbox.engine import podman_sync

NETWORK_NAME = "prefect-harbor"
_lock = threading.Lock()
_relays: dict[tuple[str, int], _Relay] = {}
_network_ready = False
#: Linux's IP_FREEBIND (<linux/in.h>); Python's socket module does not name it.
_IP_FREEBIND = getattr(socket, "IP_FREEBIND", 15)


def reachable_from_sandbox(url: str) -> str:
    """``url`` as a container sees it: loopback endpoints go through a relay, others are unchanged."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not _is_loopback(host):
        return url
    port = parts.port or (443 if parts.scheme == "https" else 80)
    relay = _relay_for((host, port))
    netloc = f"{relay.address[0]}:{relay.address[1]}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _is_loopback(host: str) -> bool:
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
    _network_ready = True
    return NETWORK_NAME


def gateway_address() -> str:
    ensure_network()
    inspected = podman_sync("network", "inspect", NETWORK_NAME).check(f"inspecting the {NETWORK_NAME} network")
    (network,) = json.loads(inspected.text)
    return network["subnets"][0]["gateway"]


class _Forward(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            upstream = socket.create_connection(self.server.target, timeout=10)  # type: ignore[attr-defined]
        except OSError:
            return
        upstream.settimeout(None)
        pump = threading.Thread(target=_pipe, args=(upstream, self.request), daemon=True)
        pump.start()
        _pipe(self.request, upstream)
        pump.join()
        upstream.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class _Relay(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, bind: str, target: tuple[str, int]) -> None:
        self.target = target
        super().__init__((bind, 0), _Forward)

    def server_bind(self) -> None:
        # The bridge gets its gateway address only when the first container joins it:
        # IP_FREEBIND lets the relay bind to it before then.
        self.socket.setsockopt(socket.IPPROTO_IP, _IP_FREEBIND, 1)
        super().server_bind()

    @property
    def address(self) -> tuple[str, int]:
        return self.server_address[0], self.server_address[1]


def _relay_for(target: tuple[str, int]) -> _Relay:
    with _lock:
        relay = _relays.get(target)
        if relay is None:
            relay = _Relay(gateway_address(), target)
            threading.Thread(target=relay.serve_forever, name=f"model-relay-{target[1]}", daemon=True).start()
            _relays[target] = relay
        return relay
