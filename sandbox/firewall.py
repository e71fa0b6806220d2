"""The host's guard around the ``prefect-harbor`` bridge, which trials and image builds share.

A container on a bridge with NAT can reach more than the outside world: every host service
bound to all interfaces (a Prefect server started with ``--host 0.0.0.0``, a database) answers
at the bridge's gateway and at the host's other addresses, and every other container on the
bridge, or on another bridge of the host, is one hop away. Two chains close that, IPv4 and IPv6:

* ``PREFECT-HARBOR`` (table ``filter``, hook ``INPUT``, traffic from the bridge to the host):
  replies pass, each relay this project runs is admitted by its own rule while it runs
  (:func:`admit`, :func:`withdraw`), everything else is rejected.
* ``PREFECT-HARBOR-FWD`` (table ``mangle``, hook ``FORWARD``, traffic the host would route or
  bridge on from the bridge): it passes only towards the interfaces of the host's default
  routes, the way out, and never to a link-local address (a cloud's metadata service,
  ``169.254.169.254``, holds the host's credentials); a neighbour on the same bridge
  (bridged traffic crosses this hook where the kernel's bridge netfilter is on) or a
  container on another bridge is dropped. The
  ``mangle`` table runs before ``filter``, where the container network's own rules accept
  whatever a container sends, and nothing else writes to it.

Each relay's rule carries its owner's token in a comment, so the watchdog and the janitor
withdraw the rules of an owner that died (:mod:`.janitor`).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import shlex
import shutil
import socket
import subprocess
from collections.abc import Callable
from functools import cache

INPUT_CHAIN = "PREFECT-HARBOR"
FORWARD_CHAIN = "PREFECT-HARBOR-FWD"
#: The comment on every relay's admission; the owner's token follows it.
RELAY_COMMENT = "prefect-harbor relay"
_FAMILIES = (("iptables", "icmp-admin-prohibited", "-4"), ("ip6tables", "icmp6-adm-prohibited", "-6"))
logger = logging.getLogger(__name__)


@cache
def _binary(tool: str) -> str | None:
    return shutil.which(tool)


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_binary(tool) or tool, "-w", *args], capture_output=True, text=True)


def _ok(tool: str, *args: str) -> bool:
    return _run(tool, *args).returncode == 0


def uplinks(family: str) -> list[str]:
    """The interfaces of the host's default routes (``-4`` or ``-6``): the only way out for a container."""
    listed = subprocess.run(["ip", "-j", family, "route", "show", "default"], capture_output=True, text=True)
    try:
        routes = json.loads(listed.stdout or "[]")
    except ValueError:
        return []
    return sorted({route["dev"] for route in routes if route.get("dev")})


#: Networks behind a host, never the internet: no relay forwards to them and no download comes from
#: them, wherever the host would route them (RFC 1918, carrier-grade NAT, IPv6 unique and site-local),
#: and addresses that are no one's on the internet or lead to a cloud host's own services ("this
#: network", IETF assignments, benchmarking, reserved, broadcast, Azure's WireServer).
_BEHIND_A_HOST = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7", "fec0::/10")
_NO_ONES = ("0.0.0.0/8", "192.0.0.0/24", "198.18.0.0/15", "240.0.0.0/4", "168.63.129.16/32")
PRIVATE_NETWORKS = tuple(ipaddress.ip_network(network) for network in (*_BEHIND_A_HOST, *_NO_ONES))
#: IPv6 prefixes that carry an IPv4 address a gateway may deliver to (NAT64, 6to4, the old
#: IPv4-compatible form): such an address is judged as the IPv4 address it carries.
_CARRIERS = tuple(ipaddress.ip_network(network) for network in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96", "::ffff:0:0:0/96"))
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")


class DestinationRefused(ValueError):
    """A destination a container may not have the host (a relay, a download) connect to; the message says why."""


def _plain(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``address`` as the kernel connects to it: an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``) is its IPv4 address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    return ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip


def _carried(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries to a translating gateway (NAT64, 6to4), or None."""
    if not isinstance(ip, ipaddress.IPv6Address) or ip.is_unspecified or ip.is_loopback:
        return None
    if ip in _SIX_TO_FOUR:
        return ip.sixtofour
    if any(ip in network for network in _CARRIERS):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_outside(address: str) -> bool:
    """Whether a container on the bridge may reach ``address``: the host would route it out of an
    uplink, and it is none of the host's own addresses, nor link-local, multicast or unspecified."""
    ip = _plain(address)
    if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
        return False
    family = "-6" if ip.version == 6 else "-4"
    routed = subprocess.run(["ip", "-j", family, "route", "get", str(ip)], capture_output=True, text=True)
    try:
        (route,) = json.loads(routed.stdout or "[]")
    except ValueError:
        return False
    return route.get("type", "unicast") == "unicast" and route.get("dev") in uplinks(family)


def is_public(address: str) -> bool:
    """Whether the host may connect to ``address`` for a container (a relay's request, a download):
    :func:`is_outside`, in none of :data:`PRIVATE_NETWORKS`, and carrying no IPv4 address that is not."""
    ip = _plain(address)
    if (carried := _carried(ip)) is not None and not is_public(str(carried)):
        return False
    return not any(ip in network for network in PRIVATE_NETWORKS if network.version == ip.version) and is_outside(str(ip))


def public_addresses(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (a name, or a literal in any form the resolver reads:
    ``2130706433``, ``0x7f.1``, ``[::ffff:127.0.0.1]``), when all of them are public; else
    :class:`DestinationRefused` naming those that are not. A name that does not resolve is refused."""
    try:
        found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise DestinationRefused(f"{host} cannot be resolved ({error})") from None
    addresses = sorted({str(info[4][0]) for info in found})
    inside = [address for address in addresses if not is_public(address)]
    if inside or not addresses:
        raise DestinationRefused(f"{host} is {', '.join(inside) or 'nowhere'}: the host, a private network or a link-local address")
    return addresses


def guard(bridge: str) -> bool:
    """Install both chains for ``bridge``, IPv4 and IPv6 (idempotent); False, with a warning, where it cannot be."""
    return all(_guard_family(tool, reject, family, bridge) for tool, reject, family in _FAMILIES)


def _guard_family(tool: str, reject: str, family: str, bridge: str) -> bool:
    version = "IPv6" if family == "-6" else "IPv4"
    if _binary(tool) is None:
        logger.warning(f"{tool} is not installed: host services and other containers are reachable from the {bridge} bridge over {version}.")
        return False
    if not _ok(tool, "-n", "-L", INPUT_CHAIN) and not _ok(tool, "-N", INPUT_CHAIN):
        logger.warning(f"Could not create the {tool} guard (not root?): host services are reachable from the {bridge} bridge over {version}.")
        return False
    # An older release admitted the whole relay range; relays are now admitted one by one.
    while _ok(tool, "-D", INPUT_CHAIN, "-p", "tcp", "--dport", "47200:47299", "-j", "RETURN"):
        pass
    for rule in (["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"], ["-j", "REJECT", "--reject-with", reject]):
        if not _ok(tool, "-C", INPUT_CHAIN, *rule):
            _ok(tool, "-A", INPUT_CHAIN, *rule)
    if not _ok(tool, "-C", "INPUT", "-i", bridge, "-j", INPUT_CHAIN):
        _ok(tool, "-I", "INPUT", "-i", bridge, "-j", INPUT_CHAIN)
    return _guard_forwarding(tool, family, bridge, version)


def _guard_forwarding(tool: str, family: str, bridge: str, version: str) -> bool:
    mangle = ("-t", "mangle")
    if not _ok(tool, *mangle, "-n", "-L", FORWARD_CHAIN):
        if not _ok(tool, *mangle, "-N", FORWARD_CHAIN) or not _ok(tool, *mangle, "-A", FORWARD_CHAIN, "-j", "DROP"):
            logger.warning(f"Could not create the {tool} forwarding guard: containers on the {bridge} bridge can reach each other over {version}.")
            return False
    link_local = "fe80::/10" if family == "-6" else "169.254.0.0/16"
    if not _ok(tool, *mangle, "-C", FORWARD_CHAIN, "-d", link_local, "-j", "DROP"):
        _ok(tool, *mangle, "-I", FORWARD_CHAIN, "1", "-d", link_local, "-j", "DROP")
    ways_out = uplinks(family)
    if not ways_out and family == "-4":
        logger.warning(f"The host has no default route: containers on the {bridge} bridge reach nothing outside it.")
    for uplink in ways_out:  # after the link-local DROP, before the final DROP
        if not _ok(tool, *mangle, "-C", FORWARD_CHAIN, "-o", uplink, "-j", "RETURN"):
            _ok(tool, *mangle, "-I", FORWARD_CHAIN, "2", "-o", uplink, "-j", "RETURN")
    if not _ok(tool, *mangle, "-C", "FORWARD", "-i", bridge, "-j", FORWARD_CHAIN):
        _ok(tool, *mangle, "-I", "FORWARD", "1", "-i", bridge, "-j", FORWARD_CHAIN)
    return True


def _admission(address: str, port: int, owner: str) -> list[str]:
    return ["-p", "tcp", "-d", address, "--dport", str(port), "-m", "comment", "--comment", f"{RELAY_COMMENT} {owner}", "-j", "RETURN"]


def admit(address: str, port: int, owner: str) -> None:
    """Let containers on the bridge reach one relay (``address:port``, IPv4) while it runs."""
    rule = _admission(address, port, owner)
    if _binary("iptables") and not _ok("iptables", "-C", INPUT_CHAIN, *rule) and not _ok("iptables", "-I", INPUT_CHAIN, "1", *rule):
        logger.warning(f"Could not admit the relay at {address}:{port} through the host's guard: containers cannot reach it.")


def withdraw(address: str, port: int, owner: str) -> None:
    """Close what :func:`admit` opened (idempotent)."""
    if _binary("iptables"):
        while _ok("iptables", "-D", INPUT_CHAIN, *_admission(address, port, owner)):
            pass


def withdraw_dead_owners(alive: Callable[[str], bool]) -> int:
    """Remove the admissions whose owner ``alive(token)`` says is gone (the janitor): how many."""
    if not _binary("iptables"):
        return 0
    prefix, removed = f"{RELAY_COMMENT} ", 0
    for line in _run("iptables", "-S", INPUT_CHAIN).stdout.splitlines():
        words = shlex.split(line)
        if "--comment" in words and words[:2] == ["-A", INPUT_CHAIN]:
            comment = words[words.index("--comment") + 1]
            if comment.startswith(prefix) and not alive(comment.removeprefix(prefix)):
                removed += _ok("iptables", "-D", *words[1:])
    return removed


def withdraw_owner_script(owner: str) -> str:
    """A shell line that removes ``owner``'s admissions: the watchdog's, once its owner is gone."""
    iptables = shlex.quote(_binary("iptables") or "iptables")
    comment = shlex.quote(f'"{RELAY_COMMENT} {owner}"')
    return f"{iptables} -w -S {INPUT_CHAIN} 2>/dev/null | grep -F -- {comment} | sed 's/^-A /-D /' | while read -r rule; do eval {iptables} -w $rule; done"
