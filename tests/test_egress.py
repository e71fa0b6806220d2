"""The allowlist proxy's decisions without a container: which hosts a phase allows, how a request
names its destination, and what a row says it tried."""

import io
import json
import socket
import ssl
import threading
import time

import pytest
from harbor.models.task.config import NetworkMode, NetworkPolicy

from prefect_harbor.sandbox import egress, tls_hello
from prefect_harbor.sandbox.egress import _Request, allows, proxy_variables
from prefect_harbor.trial.hosts_tried import hosts_tried


def allowlist(*hosts):
    return NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=list(hosts))


@pytest.mark.parametrize(
    ("entries", "host", "expected"),
    [
        (["pypi.org"], "pypi.org", True),
        (["pypi.org"], "PyPI.org.", True),
        (["pypi.org"], "files.pypi.org", False),
        (["pypi.org"], "pypi.org.evil.com", False),
        (["*.debian.org"], "deb.debian.org", True),
        (["*.debian.org"], "debian.org", False),
        (["*.debian.org"], "evildebian.org", False),
        (["192.0.2.1"], "192.0.2.1", True),
        (["192.0.2.1"], "[::ffff:192.0.2.1]", True),
        (["192.0.2.0/24"], "192.0.2.77", True),
        (["192.0.2.0/24"], "192.0.3.1", False),
        (["2001:db8::/32"], "[2001:db8::5]", True),
        (["192.0.2.1"], "3221225985", False),  # a decimal spelling is a name, not the address
        ([], "pypi.org", False),
    ],
)
def test_an_allowlist_allows_exactly_its_names_wildcards_addresses_and_ranges(entries, host, expected):
    assert allows(allowlist(*entries), host) is expected


def test_no_network_allows_nothing():
    assert not allows(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK), "pypi.org")


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n", ("CONNECT", "pypi.org", 443, "")),
        (b"CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n", ("CONNECT", "2001:db8::1", 8443, "")),
        (b"GET http://deb.debian.org/debian/?a=1 HTTP/1.1\r\nHost: deb.debian.org\r\n\r\n", ("GET", "deb.debian.org", 80, "/debian/?a=1")),
    ],
)
def test_a_proxy_request_names_its_destination(head, expected):
    request = _Request.read(io.BytesIO(head))
    assert (request.method, request.host, request.port, request.path) == expected


@pytest.mark.parametrize(
    "head",
    [
        b"GET /local HTTP/1.1\r\nHost: pypi.org\r\n\r\n",  # origin-form: a request for the proxy itself
        b"GET https://pypi.org/ HTTP/1.1\r\n\r\n",
        b"CONNECT pypi.org:http HTTP/1.1\r\n\r\n",
        b"NONSENSE\r\n\r\n",
        b"CONNECT pypi.org:443 HTTP/1.1\r\n",  # the head never ends
    ],
)
def test_a_request_that_names_no_destination_the_proxy_can_check_is_not_one(head):
    assert _Request.read(io.BytesIO(head)) is None


def test_the_origin_server_gets_the_path_and_no_proxy_headers():
    request = _Request.read(io.BytesIO(b"GET http://deb.debian.org/x HTTP/1.1\r\nHost: deb.debian.org\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\n\r\n"))
    assert request.origin_head() == b"GET /x HTTP/1.1\r\nHost: deb.debian.org\r\nConnection: close\r\n\r\n"


def test_the_proxy_variables_spare_the_loopback_and_the_services():
    variables = proxy_variables(["api", "db"])
    assert variables["https_proxy"] == variables["HTTP_PROXY"] == "http://127.0.0.1:3128"
    assert variables["NO_PROXY"] == "localhost,127.0.0.1,::1,api,db"


def test_a_row_lists_each_destination_once_in_the_order_first_asked(tmp_path):
    (tmp_path / "sandbox").mkdir()
    network = [
        {"host": "files.pythonhosted.org", "port": 443, "allowed": True, "first": 2.0},
        {"host": "pypi.org", "port": 443, "allowed": True, "first": 1.0},
        {"host": "evil.example", "port": 443, "allowed": False, "why": "evil.example is not in the task's allowed_hosts", "first": 3.0},
    ]
    (tmp_path / "sandbox" / "trial.json").write_text(json.dumps({"network": network}))
    assert hosts_tried(tmp_path) == ["pypi.org:443", "files.pythonhosted.org:443", "evil.example:443 (refused: evil.example is not in the task's allowed_hosts)"]


def test_a_trial_on_the_public_network_was_not_observed_and_one_that_asked_for_nothing_says_so(tmp_path):
    assert hosts_tried(tmp_path) is None
    (tmp_path / "sandbox").mkdir()
    (tmp_path / "sandbox" / "trial.json").write_text(json.dumps({"network": []}))
    assert hosts_tried(tmp_path) == []


def client_hello(server_hostname):
    """The first TLS record a real client (Python's ssl) sends for ``server_hostname``."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    connection = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        connection.do_handshake()
    return outgoing.read()


def test_a_tls_hello_says_the_name_it_asks_for():
    record = client_hello("Deb.Debian.org")
    assert tls_hello.is_handshake(record)
    assert tls_hello.server_name(record[tls_hello.HEADER : tls_hello.HEADER + tls_hello.record_length(record)]) == "deb.debian.org"
    bare = client_hello(None)
    assert tls_hello.server_name(bare[tls_hello.HEADER :]) is None


@pytest.mark.parametrize("cut", [1, 10, 60, 200])
def test_a_cut_or_forged_hello_is_refused_not_guessed(cut):
    payload = client_hello("pypi.org")[tls_hello.HEADER :]
    with pytest.raises(tls_hello.NotAHello):
        tls_hello.server_name(payload[:cut])
    with pytest.raises(tls_hello.NotAHello):
        tls_hello.server_name(b"\x02" + payload[1:])  # a ServerHello's type
    with pytest.raises(tls_hello.NotAHello):
        tls_hello.record_length(b"\x16\x03\x01\xff\xff")


@pytest.mark.parametrize("host", ["a" * 254, "evil\x1b[2J.example", "with space.example", "-dash.example", ""])
def test_a_request_for_a_name_dns_could_not_hold_is_no_request(host):
    assert _Request.read(io.BytesIO(f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode("latin-1"))) is None


def test_the_host_header_is_read_without_its_port():
    request = _Request.read(io.BytesIO(b"GET http://pypi.org/ HTTP/1.1\r\nHost: Deb.Debian.org:80\r\n\r\n"))
    assert request.host_header() == "deb.debian.org"


def test_a_tunnel_whose_upstream_never_closes_leaves_no_thread_behind(monkeypatch):
    """An allowed host that keeps its end open after the client's: the drain ends it, and close() ends the rest."""
    silent = socket.create_server(("127.0.0.1", 0))
    held = []
    threading.Thread(target=lambda: [held.append(silent.accept()[0]) for _ in range(4)], daemon=True).start()
    monkeypatch.setattr(egress, "_open", lambda host, port: socket.create_connection(silent.getsockname()))
    monkeypatch.setattr(egress, "public_addresses", lambda host, port: ["203.0.113.80"])
    monkeypatch.setattr(egress, "_DRAIN_SEC", 0.5)
    proxy = egress.EgressProxy(allowlist("pypi.org"), lambda attempt: None, lambda attempts, unrecorded: None)
    listener = socket.create_server(("127.0.0.1", 0))
    threads_before = threading.active_count()
    threading.Thread(target=proxy._serve, args=(listener,), daemon=True).start()
    proxy._listener = listener

    def tunnel() -> socket.socket:
        client = socket.create_connection(listener.getsockname(), timeout=10)
        client.sendall(b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n")
        assert client.recv(100).startswith(b"HTTP/1.1 200")
        return client

    finished = tunnel()
    finished.sendall(b"plain bytes, no TLS")
    finished.shutdown(socket.SHUT_WR)  # the client is done; the upstream never is
    finished.settimeout(10)
    assert finished.recv(100) == b"", "the drain ended the tunnel"
    lingering = [tunnel(), tunnel()]
    proxy.close()
    for client in lingering:
        client.settimeout(10)
        assert client.recv(100) == b""
    deadline = time.monotonic() + 10
    while threading.active_count() > threads_before + 1 and time.monotonic() < deadline:  # + the silent server's
        time.sleep(0.05)
    assert threading.active_count() <= threads_before + 1
