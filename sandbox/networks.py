"""A compose file's ``networks``, as far as a trial's pod can honour them.

Under compose each service joins the networks it lists (the project's ``default`` when it lists
none) and reaches, by name or alias, the services it shares a network with. In the local sandbox
a trial's services share one network namespace (:mod:`.pod`), where every service reaches every
other. That is what compose gives whenever every two services share a network: the implicit
``default``, one plain bridge network that all join, or any layout that keeps no two apart. So
those are honoured (with ``aliases`` as more names for the service), and what would differ is
refused before the trial, naming the key:

* networks that keep two services apart (compose would isolate them; here they would meet);
* networks this sandbox does not make: ``external`` (the host's), ``internal`` (no way out:
  use task.toml's ``network_mode = "no-network"``), a driver other than ``bridge``, driver
  options, ``ipam``, IPv6, and per-service fixed addresses or options.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import combinations
from typing import Any

DEFAULT = "default"
#: Keys of a top-level network that change nothing in a pod.
_NETWORK_KEYS_IGNORED = {"name", "labels", "attachable"}
#: Keys of a service's entry under ``networks`` that change nothing in a pod (``priority``: which network is connected first).
_SERVICE_KEYS_IGNORED = {"priority", "gw_priority"}


class NetworkNotHonoured(ValueError):
    """The compose file's networks ask for a layout a trial's pod cannot give."""


def service_networks(value: Any, where: str) -> dict[str, list[str]]:
    """A service's ``networks`` (a list of names, or a mapping of name to settings) as network -> aliases."""
    if value is None or value == [] or value == {}:
        return {DEFAULT: []}
    if isinstance(value, list):
        return {str(name): [] for name in value}
    if not isinstance(value, dict):
        raise NetworkNotHonoured(f"{where}: give a list of network names or a mapping of name to settings.")
    networks: dict[str, list[str]] = {}
    for name, settings in value.items():
        settings = settings or {}
        if not isinstance(settings, dict):
            raise NetworkNotHonoured(f"{where}.{name}: give a mapping of settings (aliases).")
        other = sorted(key for key, value in settings.items() if value and key not in {"aliases", *_SERVICE_KEYS_IGNORED} and not str(key).startswith("x-"))
        if other:
            raise NetworkNotHonoured(
                f"{where}.{name}.{other[0]} cannot be honoured by the local container sandbox: a trial's services share one "
                "network namespace with no addresses of their own; reach services by name (or alias) instead."
            )
        aliases = settings.get("aliases") or []
        if not isinstance(aliases, list):
            raise NetworkNotHonoured(f"{where}.{name}.aliases: give a list of names.")
        networks[str(name)] = [str(alias) for alias in aliases]
    return networks


def check_networks(services: Mapping[str, Mapping[str, list[str]]], declared: Any, where: str) -> None:
    """Refuse (:class:`NetworkNotHonoured`) networks a pod cannot honour; ``services`` maps each
    service to its networks, ``declared`` is the file's top-level ``networks``."""
    if declared is not None and not isinstance(declared, dict):
        raise NetworkNotHonoured(f"{where}: networks: give a mapping of network names to settings.")
    declared = declared or {}
    for name, settings in declared.items():
        _check_network(str(name), settings or {}, f"{where}: networks.{name}")
    for service, networks in services.items():
        for network in networks:
            if network != DEFAULT and network not in declared:
                raise NetworkNotHonoured(f"{where}: services.{service}.networks: {network!r} is not declared under the top-level networks.")
    for (first, first_networks), (second, second_networks) in combinations(services.items(), 2):
        if not set(first_networks) & set(second_networks):
            raise NetworkNotHonoured(
                f"{where}: services.{first} (networks {sorted(first_networks)}) and services.{second} (networks "
                f"{sorted(second_networks)}) share no network, so compose would keep them apart; a trial's services share one "
                "network namespace, where each reaches every other. Put them on a common network (or drop their networks keys)."
            )


def _check_network(name: str, settings: Any, where: str) -> None:
    if not isinstance(settings, dict):
        raise NetworkNotHonoured(f"{where}: give a mapping of settings.")
    if settings.get("external"):
        raise NetworkNotHonoured(f"{where}.external: a trial joins none of the host's networks; drop external and let the trial make its own.")
    if settings.get("internal"):
        raise NetworkNotHonoured(f"{where}.internal: to keep a trial from the outside, set task.toml's [environment] network_mode = \"no-network\" (its services "
            f"still reach each other).")
    if settings.get("driver", "bridge") != "bridge":
        raise NetworkNotHonoured(f"{where}.driver: {settings['driver']!r}; only a plain bridge network is honoured (drop the driver).")
    other = sorted(key for key, value in settings.items() if value and key not in {"driver", "external", "internal", *_NETWORK_KEYS_IGNORED} and not str(key).startswith("x-"))
    if other:
        raise NetworkNotHonoured(f"{where}.{other[0]} cannot be honoured by the local container sandbox; a trial's network is made by the sandbox (drop {other[0]}).")
