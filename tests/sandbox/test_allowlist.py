"""Allowlist networking in a real container: the allowed hosts through the trial's proxy, nothing else
(no route, no DNS, no host address whatever the list says), phases switching the list, every
destination asked for in the trial's sandbox report."""

import asyncio
import json
import socket
import time

import pytest
from harbor.models.task.config import NetworkMode, NetworkPolicy
from tasks_factory import API_COMPOSE, API_FILES, FETCH

from prefect_harbor.sandbox import egress
from prefect_harbor.sandbox.engine import podman

pytestmark = pytest.mark.integration

#: Run in the container: each probe's first line of answer (or the error), as JSON.
PROBE = r"""
import json, os, socket, sys

def proxied(request):
    try:
        with socket.create_connection(("127.0.0.1", 3128), timeout=30) as s:
            s.sendall(request.encode())
            return s.recv(4096).split(b"\r\n")[0].decode()
    except OSError as e:
        return type(e).__name__

def connect(host, port):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return "connected"
    except OSError as e:
        return type(e).__name__

def resolve(name):
    try:
        socket.getaddrinfo(name, 443)
        return "resolved"
    except OSError:
        return "unresolved"

def bind(port):
    try:
        socket.create_server(("127.0.0.1", port))
        return "bound"
    except OSError as e:
        return type(e).__name__

print(json.dumps({
    "env": os.environ.get("https_proxy"),
    "allowed": proxied("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n"),
    "plain_http": proxied("GET http://deb.debian.org/debian/ HTTP/1.1\r\nHost: deb.debian.org\r\n\r\n"),
    "not_listed": proxied("CONNECT files.pythonhosted.org:443 HTTP/1.1\r\n\r\n"),
    "listed_but_the_host": proxied("CONNECT 127.0.0.1:4200 HTTP/1.1\r\n\r\n"),
    "listed_private": proxied("CONNECT 10.1.2.3:80 HTTP/1.1\r\n\r\n"),
    "mapped": proxied("CONNECT [::ffff:127.0.0.1]:4200 HTTP/1.1\r\n\r\n"),
    "direct": connect(sys.argv[1], 443),
    "dns": resolve("pypi.org"),
    "take_the_port": bind(3128),
}))
"""


async def probe(env, pypi_address: str) -> dict:
    done = await env.exec(f"cat > /tmp/probe.py <<'PY'\n{PROBE}\nPY\npython3 /tmp/probe.py {pypi_address}")
    assert done.return_code == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def network_report(env) -> list[dict]:
    reports = list((env.trial_paths.trial_dir / "sandbox").glob("*.json"))
    return [entry for path in reports for entry in json.loads(path.read_text()).get("network", [])]


async def test_an_allowlist_trial_reaches_its_hosts_through_its_proxy_and_nothing_else(make_environment):
    pypi_address = socket.getaddrinfo("pypi.org", 443)[0][4][0]
    env = make_environment(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org", "*.debian.org", "127.0.0.1", "10.0.0.0/8", "::ffff:127.0.0.1"])
    await env.start(force_build=False)
    try:
        seen = await probe(env, pypi_address)
        await env.set_network_policy(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))  # a verifier phase without network
        after = await probe(env, pypi_address)
    finally:
        await env.stop(delete=True)
    assert seen["env"] == "http://127.0.0.1:3128"
    assert seen["allowed"] == "HTTP/1.1 200 Connection established"
    assert seen["plain_http"].startswith("HTTP/1.1 ") and " 40" not in seen["plain_http"][8:12], seen["plain_http"]
    assert seen["not_listed"] == "HTTP/1.1 403 Forbidden"
    assert seen["listed_but_the_host"] == seen["listed_private"] == seen["mapped"] == "HTTP/1.1 403 Forbidden", "the list never opens the host or a private network"
    assert seen["direct"] == "OSError", "no route out: the network is unreachable"
    assert seen["dns"] == "unresolved"
    assert seen["take_the_port"] in ("OSError",), "the proxy's port is the host's, taken before anything of the task ran"
    assert after["allowed"] == "HTTP/1.1 403 Forbidden", "the no-network phase's list is empty"
    tried = {(entry["host"], entry["port"], entry["allowed"]) for entry in network_report(env)}
    assert {("pypi.org", 443, True), ("deb.debian.org", 80, True), ("files.pythonhosted.org", 443, False), ("127.0.0.1", 4200, False)} <= tried
    assert ("pypi.org", 443, False) in tried, "the refusal after the switch is recorded too"


async def test_a_no_network_trial_gets_no_proxy_settings_and_its_requests_are_refused(make_environment):
    env = make_environment(network_mode=NetworkMode.NO_NETWORK)
    await env.start(force_build=False)
    try:
        seen = await probe(env, "203.0.113.80")
    finally:
        await env.stop(delete=True)
    assert seen["env"] is None
    assert seen["allowed"] == "HTTP/1.1 403 Forbidden" and seen["dns"] == "unresolved"


async def test_an_allowlist_pods_services_talk_over_loopback_and_its_proxy_is_there_before_any_service(make_environment):
    env = make_environment(files={**API_FILES, "docker-compose.yaml": API_COMPOSE}, network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"])
    await env.start(force_build=False)
    try:
        service = (await env.exec(FETCH, env={"URL": "http://api:8000/answer.txt"})).stdout.strip()  # NO_PROXY names the services
        seen = await probe(env, "203.0.113.80")
        from_service = (await podman("exec", env.service_containers["api"], "sh", "-c", "echo $https_proxy")).text
    finally:
        await env.stop(delete=True)
    assert service == "42"
    assert seen["allowed"] == "HTTP/1.1 200 Connection established" and seen["not_listed"] == "HTTP/1.1 403 Forbidden"
    assert seen["take_the_port"] == "OSError"
    assert from_service == "http://127.0.0.1:3128", "the services go out through the same proxy"


async def test_a_trial_cannot_hold_more_than_its_share_of_the_proxys_connections(make_environment):
    """Each connection is a thread of the sweep's process, which no container limit counts."""
    flood = (
        "import socket\n"
        "held = [socket.create_connection(('127.0.0.1', 3128), timeout=10) for _ in range(MAX + 6)]\n"
        "print(held[-1].recv(100).split(b'\\r\\n')[0].decode())\n"
    ).replace("MAX", str(egress.MAX_CONNECTIONS))
    env = make_environment(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"])
    await env.start(force_build=False)
    try:
        over = (await env.exec(f"python3 -c \"{flood}\"")).stdout.strip()
        after = await probe(env, "203.0.113.80")  # the held ones are gone with their process
    finally:
        await env.stop(delete=True)
    assert over == "HTTP/1.1 503 Service Unavailable"
    assert after["allowed"] == "HTTP/1.1 200 Connection established"


async def test_a_tunnel_the_agent_opened_does_not_outlive_its_phase(make_environment):
    hold = (
        "import socket, sys, time\n"
        "s = socket.create_connection(('127.0.0.1', 3128))\n"
        "s.sendall(b'CONNECT pypi.org:443 HTTP/1.1\\r\\n\\r\\n')\n"
        "answer = s.recv(100).split(b'\\r\\n')[0].decode()\n"
        "s.settimeout(None)\n"
        "data = s.recv(100)\n"  # pypi.org says nothing before a TLS hello: this returns when the tunnel ends
        "open(sys.argv[1], 'w').write(f'{answer}|{time.time()}|{len(data)}')\n"
    )
    env = make_environment(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"])
    await env.start(force_build=False)
    try:
        await env.exec(f"cat > /tmp/hold.py <<'PY'\n{hold}PY")
        # This machine's own egress resets a tunnel idle for 10 s: a tunnel that ended before the
        # switch proves nothing, so another is opened (a busy machine may be slow to switch).
        for attempt in range(3):
            await env.set_network_policy(NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"]))
            await env.exec(f"nohup python3 /tmp/hold.py /tmp/tunnel-{attempt} > /dev/null 2>&1 &")
            await asyncio.sleep(1)
            switched_at = time.time()
            await env.set_network_policy(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
            seen = (await env.exec(f"for i in $(seq 100); do [ -s /tmp/tunnel-{attempt} ] && break; sleep 0.1; done; cat /tmp/tunnel-{attempt}")).stdout
            answer, ended_at, data = seen.split("|")
            if float(ended_at) >= switched_at:
                break
    finally:
        await env.stop(delete=True)
    assert answer == "HTTP/1.1 200 Connection established" and data == "0"
    assert float(ended_at) - switched_at < 5, "the switch ended the tunnel, not the outside's idle timeout"


async def test_a_public_trials_connections_are_in_its_report_by_address(make_environment):
    pypi_address = socket.getaddrinfo("pypi.org", 443, type=socket.SOCK_STREAM)[0][4][0]
    env = make_environment()
    await env.start(force_build=False)
    try:
        reached = (await env.exec(f"python3 -c \"import socket; socket.create_connection(('{pypi_address}', 443), timeout=10).close(); print('reached')\"")).stdout.strip()
    finally:
        await env.stop(delete=True)
    assert reached == "reached"
    assert {(entry["host"], entry["port"], entry["protocol"]) for entry in network_report(env)} == {(pypi_address, 443, "tcp")}


FRONTING = r"""
import json, socket, ssl

def tunnel(sni):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
    s.sendall(b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n")
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        context.wrap_socket(s, server_hostname=sni).close()
        return "handshake"
    except (OSError, ssl.SSLError) as e:
        return type(e).__name__

def first_line(request):
    with socket.create_connection(("127.0.0.1", 3128), timeout=30) as s:
        s.sendall(request)
        return s.recv(200).split(b"\r\n")[0].decode()

seen = {
    "own_name": tunnel("pypi.org"),
    "fronted": tunnel("deb.debian.org"),
    "host_header": first_line(b"GET http://pypi.org/debian/ HTTP/1.1\r\nHost: deb.debian.org\r\n\r\n"),
    "control_characters": first_line(b"CONNECT evil\x1b[2J.example:443 HTTP/1.1\r\n\r\n"),
}
seen["names"] = sorted({first_line(f"CONNECT n{i}.example:443 HTTP/1.1\r\n\r\n".encode()) for i in range(230)})
print(json.dumps(seen))
"""


async def test_one_allowed_host_is_no_front_for_another_and_a_flood_of_names_stays_bounded(make_environment):
    env = make_environment(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"])
    await env.start(force_build=False)
    try:
        done = await env.exec(f"cat > /tmp/fronting.py <<'PY'\n{FRONTING}\nPY\npython3 /tmp/fronting.py")
    finally:
        await env.stop(delete=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["own_name"] == "handshake"
    assert seen["fronted"] != "handshake", "a TLS hello for deb.debian.org in a tunnel to pypi.org"
    assert seen["host_header"] == "HTTP/1.1 403 Forbidden"
    assert seen["control_characters"] == "HTTP/1.1 400 Bad Request"
    assert seen["names"] == ["HTTP/1.1 403 Forbidden"]
    entries = network_report(env)
    assert len(entries) == egress.MAX_RECORDED + 1 and entries[-1]["more"] >= 30, entries[-1]
    assert any(entry.get("host") == "deb.debian.org" and not entry["allowed"] and "TLS hello" in entry["why"] for entry in entries), "asked before the flood"
    assert not any("\x1b" in json.dumps(entry) for entry in entries)
