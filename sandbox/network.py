"""The network of ``public`` trials, and the relay that lets containers reach a local model endpoint.

Agents that run inside the container (mini-swe-agent, Osmosis workflows) call the model
themselves. A container has its own loopback, and the host's is deliberately out of its
reach (the Prefect API and every other local service live there). So a model server on
``127.0.0.1:PORT`` is offered to containers through a relay: a TCP forwarder bound to the
``prefect-harbor`` network's gateway address (the host side of the containers' bridge)
that forwards to that one endpoint and nothing else. ``public`` trials reach it;
``no-network`` trials, having no network, do not.

A bridge also makes every host service bound to all interfaces (``0.0.0.0``: a Prefect server
started for remote workers, a database) reachable at the gateway. So the bridge's traffic
*to the host* passes an iptables guard (chain ``PREFECT-HARBOR``, on ``INPUT`` from the bridge
only, IPv4 and IPv6) that admits replies and the relays' ports and rejects the rest.
Traffic out to the world (NAT, ``FORWARD``) is not touched.

Trials must not reach each other either: every container's port on the bridge is marked
*isolated* (the kernel's bridge port isolation), so isolated ports forward to the host side
of the bridge only, never to one another.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import shutil
import socket
import subprocess
import socketserver
import threading
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from prefect_harbor.sandbox.engine import podman_sync

NETWORK_NAME = "prefect-harbor"
GUARD_CHAIN = "PREFECT-HARBOR"
#: The relays bind in this range; the guard admits it and nothing else of the host's.
RELAY_PORTS = range(47200, 47300)
logger = logging.getLogger(__name__)
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
    guard_host(bridge_name())
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


def guard_host(bridge: str) -> bool:
    """Install the INPUT guard for ``bridge``, IPv4 and IPv6 (idempotent); False, with a warning, where it cannot be."""
    return all(_guard(tool, reject, bridge) for tool, reject in (("iptables", "icmp-admin-prohibited"), ("ip6tables", "icmp6-adm-prohibited")))


def _guard(tool: str, reject: str, bridge: str) -> bool:
    rules = [
        ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
        ["-p", "tcp", "--dport", f"{RELAY_PORTS.start}:{RELAY_PORTS.stop - 1}", "-j", "RETURN"],
        ["-j", "REJECT", "--reject-with", reject],
    ]
    binary = shutil.which(tool)
    unguarded = f"host services listening on all interfaces are reachable from public trials over {'IPv6' if '6' in tool else 'IPv4'}"
    if binary is None:
        logger.warning(f"{tool} is not installed: {unguarded}.")
        return False

    def run(*args: str) -> bool:
        return subprocess.run([binary, "-w", *args], capture_output=True).returncode == 0

    if not run("-n", "-L", GUARD_CHAIN) and not run("-N", GUARD_CHAIN):
        logger.warning(f"Could not create the {tool} guard (not root?): {unguarded}.")
        return False
    for rule in rules:
        if not run("-C", GUARD_CHAIN, *rule):
            run("-A", GUARD_CHAIN, *rule)
    jump = ["INPUT", "-i", bridge, "-j", GUARD_CHAIN]
    if not run("-C", *jump):
        run("-I", *jump)
    return True


def gateway_address() -> str:
    ensure_network()
    return _network_info()["subnets"][0]["gateway"]


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
        for port in RELAY_PORTS:
            try:
                super().__init__((bind, port), _Forward)
                return
            except OSError:
                self.socket.close()
        raise OSError(f"no free port for a model relay in {RELAY_PORTS.start}-{RELAY_PORTS.stop - 1} on {bind}")

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
