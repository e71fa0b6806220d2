"""What keeps containers (trials and builds) off the host: the seccomp profile, the bridge's guard,
the relays' admissions, the process budget and the proxy relay."""

import json
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from auth_proxy import AuthenticatingProxy
from tasks_factory import BASE_DOCKERFILE

from prefect_harbor.sandbox import firewall, janitor, limits, network, proxy, seccomp
from prefect_harbor.sandbox.engine import podman
from prefect_harbor.sandbox.images import image_resolver


def strict() -> dict:
    return seccomp.strict_profile(json.loads(seccomp.DEFAULT_SECCOMP_PROFILE.read_text()))


def allowed_without_caps(profile: dict, name: str) -> list[dict]:
    return [r for r in profile["syscalls"] if name in r["names"] and r["action"] == "SCMP_ACT_ALLOW" and not (r.get("includes") or {}).get("caps")]


def test_the_profile_allows_namespaces_and_keyrings_only_as_dockers_default_does():
    profile = strict()
    for name in ("unshare", "setns", "mount", "umount2", "pivot_root", "keyctl", "add_key", "request_key", "clone3"):
        assert not allowed_without_caps(profile, name), name
    (clone,) = [r for r in allowed_without_caps(profile, "clone") if r.get("args", [{}])[0].get("index") == 0]
    assert clone["args"] == [{"index": 0, "value": seccomp.CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]
    assert allowed_without_caps(profile, "read") and allowed_without_caps(profile, "execve")


def test_the_profile_is_kept_in_a_private_folder_and_rewritten_when_tampered_with():
    path = seccomp.seccomp_profile()
    assert path is not None and path.parent.stat().st_mode & 0o777 == 0o700
    expected = path.read_text()
    path.write_text('{"defaultAction": "SCMP_ACT_ALLOW"}')
    assert seccomp.seccomp_profile() == path and path.read_text() == expected


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
async def test_a_container_cannot_make_namespaces_or_touch_the_keyring_but_runs_threads(tmp_path):
    probe = (
        "unshare -Ur true 2>&1; echo unshare=$?; unshare -m true 2>/dev/null; echo mount-ns=$?; "
        "python3 -c 'import threading; t = threading.Thread(target=print, args=(\"thread-ok\",)); t.start(); t.join()'; "
        "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); print(\"keyctl\", l.syscall(250, 0, -4, 0), ctypes.get_errno())'"
    )
    image = await _test_image(tmp_path)
    out = (await podman("run", "--rm", *seccomp.seccomp_options(), image, "bash", "-c", probe)).check("probe").text
    assert "unshare=1" in out and "Operation not permitted" in out and "mount-ns=1" in out
    assert "thread-ok" in out and "keyctl -1 " in out, out


async def _test_image(tmp_path: Path) -> str:
    """The image every test task shares (built once, then found by content)."""
    folder = tmp_path / "environment"
    folder.mkdir()
    (folder / "Dockerfile").write_text(BASE_DOCKERFILE)
    return await image_resolver(extra_ca_certs=[]).ensure_built(folder, "guards", timeout_sec=600)


def test_the_default_process_limit_is_the_hosts_budget_shared_by_the_trials_at_once():
    budget = limits.process_budget()
    assert limits.trial_pids_limit(None, 1) == min(limits.DEFAULT_PIDS_LIMIT, budget)
    assert limits.trial_pids_limit(None, 64) == min(limits.DEFAULT_PIDS_LIMIT, budget // 64)
    assert limits.trial_pids_limit(300, 4) == 300


def test_a_process_limit_the_host_cannot_hold_names_the_field_and_the_fix():
    budget = limits.process_budget()
    with pytest.raises(limits.ProcessBudgetError, match=rf"pids_limit: {budget} processes per trial times 2 trials .* lower pids_limit to {budget // 2}"):
        limits.trial_pids_limit(budget, 2)
    with pytest.raises(limits.ProcessBudgetError, match="run fewer trials at once"):
        limits.trial_pids_limit(None, budget)


def input_rules() -> str:
    return subprocess.run(["iptables", "-S", firewall.INPUT_CHAIN], capture_output=True, text=True).stdout


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_a_relay_is_admitted_while_it_runs_and_no_longer():
    network.ensure_network()
    relay = network.Relay(network.gateway_address(), ("127.0.0.1", 9))
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    admitted = f"--dport {relay.address[1]} "
    assert admitted in input_rules()
    assert "47200:47299" not in input_rules(), "the whole relay range is admitted"
    relay.close()
    assert admitted not in input_rules()


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_the_admissions_of_a_dead_owner_are_withdrawn():
    network.ensure_network()
    dead = "1.1"  # pid 1 never started at tick 1: no live process has this token
    firewall.admit(network.gateway_address(), 47299, dead)
    assert f"{firewall.RELAY_COMMENT} {dead}" in input_rules()
    assert firewall.withdraw_dead_owners(janitor.owner_alive) >= 1
    assert f"{firewall.RELAY_COMMENT} {dead}" not in input_rules()


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_the_watchdog_withdraws_its_owners_admissions():
    script = firewall.withdraw_owner_script("2.2")
    firewall.admit(network.gateway_address(), 47298, "2.2")
    subprocess.run(["/bin/sh", "-c", script], check=True)
    assert f"{firewall.RELAY_COMMENT} 2.2" not in input_rules()


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_only_addresses_routed_out_of_an_uplink_are_outside():
    network.ensure_network()
    inside = ("127.0.0.1", network.gateway_address(), "169.254.169.254", "0.0.0.0", "::ffff:127.0.0.1", f"::ffff:{network.gateway_address()}")
    outside = [address for address in inside if firewall.is_outside(address)]
    assert outside == []
    assert firewall.is_outside("203.0.113.80") == bool(firewall.uplinks("-4"))


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_forwarding_from_the_bridge_is_dropped_except_out_of_uplinks_and_never_to_link_local():
    network.ensure_network()
    rules = subprocess.run(["iptables", "-t", "mangle", "-S", firewall.FORWARD_CHAIN], capture_output=True, text=True).stdout.splitlines()
    assert rules[1] == f"-A {firewall.FORWARD_CHAIN} -d 169.254.0.0/16 -j DROP" and rules[-1] == f"-A {firewall.FORWARD_CHAIN} -j DROP"
    assert [f"-A {firewall.FORWARD_CHAIN} -o {uplink} -j RETURN" for uplink in firewall.uplinks("-4")] == rules[2:-1]
    jumps = subprocess.run(["iptables", "-t", "mangle", "-S", "FORWARD"], capture_output=True, text=True).stdout
    assert f"-A FORWARD -i {network.bridge_name()} -j {firewall.FORWARD_CHAIN}" in jumps


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_containers_get_a_credential_free_relay_for_an_authenticating_proxy(monkeypatch):
    upstream = AuthenticatingProxy("alice", "proxy-password-canary")
    monkeypatch.setenv("HTTPS_PROXY", upstream.url)
    monkeypatch.setenv("no_proxy", "internal.example")
    seen = proxy.container_proxy_variables()
    assert "proxy-password-canary" not in json.dumps(seen)
    host, port = seen["HTTPS_PROXY"].removeprefix("http://").split(":")
    assert host == network.gateway_address() and seen["no_proxy"] == seen["NO_PROXY"] == f"internal.example,localhost,127.0.0.1,::1,{host}"
    assert seen["https_proxy"] == seen["HTTPS_PROXY"], "apt and curl read only the lower-case spelling"
    assert "proxy-password-canary" in proxy.proxy_secrets()
    # Through the relay, a request without credentials gets in with the proxy's (the destination check
    # is let through here: the stand-in proxy answers 502 for a closed port on loopback).
    monkeypatch.setattr(proxy, "public_addresses", lambda host, port: [host])
    client = socket.create_connection((host, int(port)), timeout=5)
    client.sendall(b"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\n\r\n")
    reply = client.recv(1024)
    client.close()
    assert upstream.refused == 0 and upstream.allowed == 1 and reply.startswith(b"HTTP/1.1 502"), reply


def test_a_proxy_without_credentials_elsewhere_is_passed_as_it_is(monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    assert proxy.container_proxy_variables() == {"HTTP_PROXY": "http://proxy.invalid:3128", "NO_PROXY": "localhost"}


def test_a_socks_proxy_with_a_password_is_not_passed_at_all(monkeypatch):
    monkeypatch.setenv("ALL_PROXY", "socks5://bob:socks-password@proxy.invalid:1080")
    assert "ALL_PROXY" not in proxy.container_proxy_variables()


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_the_relay_adds_credentials_to_each_request_of_a_kept_alive_connection():
    heads, bodies = [], []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        connection, _ = listener.accept()
        reader = connection.makefile("rb")
        for _ in range(2):
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += reader.readline()
            heads.append(head)
            bodies.append(reader.read(5))
        connection.close()

    threading.Thread(target=serve, daemon=True).start()
    handler = type("Creds", (proxy.AuthenticatingForward,), {"authorization": b"Basic c2VjcmV0", "tls": False, "upstream_host": "127.0.0.1"})
    relay = network.relay_for(listener.getsockname(), handler)
    client = socket.create_connection(relay.address, timeout=5)
    request = b"POST http://203.0.113.80/ HTTP/1.1\r\nHost: 203.0.113.80\r\nContent-Length: 5\r\nProxy-Authorization: Basic Zm9v\r\n\r\nhello"
    client.sendall(request + request.replace(b"hello", b"again"))
    client.close()
    for _ in range(50):
        if len(bodies) == 2:
            break
        threading.Event().wait(0.1)
    assert bodies == [b"hello", b"again"]
    assert all(h.count(b"Proxy-Authorization") == 1 and b"Proxy-Authorization: Basic c2VjcmV0" in h for h in heads), heads


def test_the_host_budget_is_half_of_pid_max():
    assert limits.process_budget() == int(Path("/proc/sys/kernel/pid_max").read_text()) // 2


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
async def test_run_steps_get_the_trials_capabilities_seccomp_and_network(tmp_path, make_environment):
    """A build's RUN step and a trial's container: the same capability set, a seccomp filter, the guarded bridge."""
    probe = "grep -E '^(CapEff|Seccomp):' /proc/self/status; ip -4 -o addr 2>/dev/null || cat /proc/net/fib_trie"
    folder = tmp_path / "build" / "environment"
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text(f"{BASE_DOCKERFILE}RUN ({probe}) > /build-status.txt  # {tmp_path.name}\n")
    image = await image_resolver(extra_ca_certs=[]).ensure_built(folder, "caps", timeout_sec=600)
    at_build = (await podman("run", "--rm", image, "cat", "/build-status.txt")).check("read").text
    env = make_environment()
    await env.start(force_build=False)
    try:
        in_trial = (await env.exec(probe)).stdout
    finally:
        await env.stop(delete=True)
    capabilities = [line for line in (at_build + "\n" + in_trial).splitlines() if line.startswith("CapEff")]
    assert len(capabilities) == 2 and capabilities[0] == capabilities[1], capabilities
    assert at_build.count("Seccomp:\t2") == 1 and in_trial.count("Seccomp:\t2") == 1
    subnet = network.gateway_address().rsplit(".", 1)[0]
    assert subnet in at_build and subnet in in_trial, "the build did not run on the prefect-harbor bridge"


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "100.64.0.1", "fd00::1", "169.254.169.254", "0.0.0.0",
        # IPv6 that carries a private IPv4 address to a translating gateway (NAT64, 6to4, IPv4-compatible), reserved and cloud-host addresses
        "64:ff9b::a00:1", "64:ff9b::a9fe:a9fe", "64:ff9b:1::a00:1", "2002:7f00:1::1", "2002:a00:1::1", "::127.0.0.1", "::10.0.0.1", "::ffff:0:127.0.0.1",
        "0.1.2.3", "192.0.0.170", "198.18.0.1", "240.0.0.1", "255.255.255.255", "168.63.129.16",
    ],
)
def test_the_host_loopback_private_and_link_local_addresses_are_not_public_in_any_spelling(address):
    assert not firewall.is_public(address)


@pytest.mark.parametrize("host", ["127.0.0.1", "2130706433", "0x7f.1", "0177.0.0.1", "[::ffff:127.0.0.1]", "localhost", "10.0.0.1", "no-such-name.invalid"])
def test_a_destination_the_host_or_a_private_network_holds_is_refused_after_resolution(host):
    with pytest.raises(firewall.DestinationRefused):
        firewall.public_addresses(host, 80)


def relayed(request: bytes) -> tuple[bytes, list[bytes]]:
    """``request`` sent through a credential-adding relay to a stand-in proxy: what the client got back, and what reached the proxy."""
    received: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        connection, _ = listener.accept()
        connection.settimeout(5)
        try:
            while data := connection.recv(65536):
                received.append(data)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except OSError:
            pass
        connection.close()

    threading.Thread(target=serve, daemon=True).start()
    handler = type("Creds", (proxy.AuthenticatingForward,), {"authorization": b"Basic c2VjcmV0", "tls": False, "upstream_host": "127.0.0.1"})
    relay = network.relay_for(listener.getsockname(), handler)
    with socket.create_connection(relay.address, timeout=5) as client:
        client.sendall(request)
        answer = b""
        try:
            while chunk := client.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and (b"403" in answer.split(b"\r\n", 1)[0] or answer.endswith(b"ok")):
                    break
        except OSError:
            pass
    listener.close()
    return answer, received


@pytest.mark.parametrize(
    "request_head",
    [
        b"GET http://127.0.0.1:4200/api/health HTTP/1.1\r\nHost: 127.0.0.1:4200\r\n\r\n",
        b"CONNECT 127.0.0.1:4200 HTTP/1.1\r\nHost: 127.0.0.1:4200\r\n\r\n",
        b"GET http://[::ffff:127.0.0.1]:4200/ HTTP/1.1\r\n\r\n",
        b"GET http://a@2130706433:4200/ HTTP/1.1\r\n\r\n",
        b"CONNECT 10.0.0.5:443 HTTP/1.1\r\n\r\n",
        b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:4200\r\n\r\n",
        b"GET http://203.0.113.80/ HTTP/1.1\r\nHost: 127.0.0.1:4200\r\n\r\n",
    ],
    ids=["absolute-form-loopback", "connect-loopback", "mapped-ipv6", "userinfo-and-decimal", "connect-private", "origin-form", "host-header-loopback"],
)
@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_the_relay_refuses_a_destination_a_trial_may_not_reach_and_the_proxy_never_sees_it(request_head):
    answer, received = relayed(request_head)
    assert answer.startswith(b"HTTP/1.1 403 Forbidden"), answer
    assert received == [], "the request reached the host's proxy"


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_a_second_request_on_a_kept_alive_connection_is_checked_too():
    allowed = b"GET http://203.0.113.80/ HTTP/1.1\r\nHost: 203.0.113.80\r\n\r\n"
    answer, received = relayed(allowed + b"GET http://127.0.0.1:4200/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert b"127.0.0.1" not in b"".join(received), received
