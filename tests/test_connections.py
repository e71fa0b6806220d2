"""A public trial's destinations from the host's connection table (a table file stands in for the kernel's)."""

import pytest

from prefect_harbor.sandbox import connections

LINE = "ipv4     2 {proto}      6 95 ESTABLISHED src={src} dst={dst} sport=50004 dport={port} src={dst} dst=10.88.0.1 sport={port} dport=50004 [ASSURED] mark=0 zone=0 use=2"


def line(src, dst, port, proto="tcp"):
    return LINE.format(src=src, dst=dst, port=port, proto=proto)


def test_a_line_gives_the_direction_the_connection_was_opened_in():
    assert connections.parse(line("10.88.0.7", "203.0.113.80", 443)) == ("10.88.0.7", ("tcp", "203.0.113.80", 443))
    assert connections.parse("ipv4 2 unknown 200 567 src=1.2.3.4") is None


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "nf_conntrack"
    path.write_text("")
    monkeypatch.setattr(connections, "TABLE", path)
    return path


def test_a_trial_gets_its_own_new_destinations_once_and_not_a_former_holders(table):
    table.write_text(line("10.88.0.7", "198.51.100.1", 80) + "\n")  # the address's previous trial, still tracked
    seen = []
    stop = connections.watch(["10.88.0.7"], seen.append)
    table.write_text("\n".join([
        line("10.88.0.7", "198.51.100.1", 80),
        line("10.88.0.7", "203.0.113.80", 443),
        line("10.88.0.7", "203.0.113.80", 443),
        line("10.88.0.9", "192.0.2.5", 443),  # another trial
        line("10.88.0.7", "192.0.2.53", 53, proto="udp"),
    ]) + "\n")
    stop()  # the last read
    assert seen == [("tcp", "203.0.113.80", 443), ("udp", "192.0.2.53", 53)]


def test_a_host_without_connection_tracking_observes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(connections, "TABLE", tmp_path / "absent")
    assert not connections.observable()
