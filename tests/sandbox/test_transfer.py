"""Copying out of a container: only regular files and directories land, never through a link."""

import io
import logging
import os
import tarfile

import httpx
import pytest

from prefect_harbor.sandbox import transfer
from prefect_harbor.sandbox.transfer import held_still, unpack


def archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as out:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            out.addfile(info, io.BytesIO(data) if data is not None else None)
    buffer.seek(0)
    return buffer


def entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


def test_regular_files_and_directories_land_and_links_do_not(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("host")
    done = unpack(
        archive(
            (entry("agent", tarfile.DIRTYPE), None), (entry("agent/ok.txt"), b"fine"), (entry("agent/sub", tarfile.DIRTYPE), None),
            (entry("agent/sub/deep.txt"), b"deep"), (entry("agent/passwd", tarfile.SYMTYPE, "/etc/passwd"), None),
            (entry("agent/stolen", tarfile.LNKTYPE, str(victim)), None), (entry("agent/../escaped.txt"), b"x"),
            (entry("/abs.txt"), b"x"), (entry("agent/fifo", tarfile.FIFOTYPE), None),
        ),
        tmp_path / "out", strip=1,
    )  # fmt: skip
    out = tmp_path / "out"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["ok.txt", "sub", "sub/deep.txt"]
    assert (out / "ok.txt").read_text() == "fine" and done.written == 3 and len(done.skipped) == 5
    assert victim.read_text() == "host" and not (tmp_path / "escaped.txt").exists()


def test_a_symlink_chain_longer_than_path_max_cannot_lead_out(tmp_path):
    """CVE-2025-4517's shape: links whose resolved path outgrows PATH_MAX, then a file written through them."""
    members = []
    step = "d" * 235
    path = ""
    for letter in "abcdefghijklmnop":
        members += [(entry(f"{path}{step}", tarfile.DIRTYPE), None), (entry(f"{path}{letter}", tarfile.SYMTYPE, step), None)]
        path += f"{letter}/"
    members += [(entry(f"{path}{'l' * 254}", tarfile.SYMTYPE, "../" * 16), None), (entry("escape", tarfile.SYMTYPE, f"{path}{'l' * 254}/.."), None)]
    members += [(entry("escape/" + "../" * 10 + str(tmp_path / "pwned.txt").lstrip("/")), b"pwned")]
    unpack(archive(*members), tmp_path / "out")
    assert not (tmp_path / "pwned.txt").exists()
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_symlink()]


def test_an_existing_file_is_replaced_not_written_through(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("host")
    out = tmp_path / "out"
    out.mkdir()
    os.link(outside, out / "reward.txt")  # a hard link that was somehow there
    unpack(archive((entry("reward.txt"), b"1")), out)
    assert outside.read_text() == "host" and (out / "reward.txt").read_text() == "1"


def test_the_bytes_written_are_capped(tmp_path):
    big = b"x" * (3 * 1024 * 1024)
    done = unpack(archive((entry("a.bin"), big), (entry("b.bin"), big), (entry("small.txt"), b"ok")), tmp_path / "out", max_bytes=4 * 1024 * 1024)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.bin", "small.txt"]
    assert done.bytes == len(big) + 2 and any("copy limit" in s for s in done.skipped)


def test_a_cut_archive_keeps_what_came_before_the_cut(tmp_path):
    whole = archive((entry("first.txt"), b"one"), (entry("second.bin"), b"y" * 100_000)).getvalue()
    done = unpack(io.BytesIO(whole[:20_000]), tmp_path / "out")
    assert (tmp_path / "out" / "first.txt").read_text() == "one" and done.skipped


def test_files_past_the_copy_limit_are_counted_and_the_ones_after_them_still_land(tmp_path):
    """Issue 28: after one file over the limit, the files behind it were dropped without a count."""
    huge = b"h" * (3 * 1024 * 1024)
    small = [(entry(f"logs/{n:04d}.txt"), b"s" * 1000) for n in range(300)]
    done = unpack(archive((entry("logs/huge.bin"), huge), *small), tmp_path / "out", strip=1, max_bytes=1024 * 1024)
    kept = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "huge.bin" not in kept and len(kept) == 300, "the small files after the big one were dropped"
    assert (done.dropped_files, done.dropped_bytes, done.stopped_early) == (1, len(huge), False)


def test_a_copy_that_stops_reading_says_what_it_dropped_at_least(tmp_path):
    files = [(entry(f"{n:04d}.txt"), b"x" * 4000) for n in range(400)]
    done = unpack(archive(*files), tmp_path / "out", max_bytes=400_000, max_read=1_000_000)
    assert done.written == 100 and done.stopped_early
    assert 100 <= done.dropped_files < 300 and done.dropped_bytes == done.dropped_files * 4000
    assert done.skipped_count > len(done.skipped) == 50, "refusals are counted, and only the first are named"


def test_an_empty_stream_is_an_empty_copy(tmp_path):
    done = unpack(io.BytesIO(b""), tmp_path / "out")
    assert done.written == 0 and done.skipped_count == 1


class _Engine:
    """The engine service's answers to pause and unpause, in order; the calls it was asked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **answers: list[int]):
        self.answers, self.calls = {verb: list(codes) for verb, codes in answers.items()}, []
        monkeypatch.setattr(transfer, "engine_call", self.call)
        monkeypatch.setattr(transfer.asyncio, "sleep", self.no_wait)

    async def call(self, method: str, route: str, **_: object) -> httpx.Response:
        verb = route.rsplit("/", 1)[-1]
        self.calls.append(verb)
        codes = self.answers[verb]
        code = codes.pop(0) if len(codes) > 1 else codes[0]
        if code == 509:  # podman's answer for a container that is not running: a 500 with this cause
            return httpx.Response(500, json={"cause": "container state improper", "message": '"exited" is not running, can\'t pause'})
        return httpx.Response(code, json={"cause": "exit status 1", "message": f"{verb} refused"})

    async def no_wait(self, _seconds: float) -> None:
        return None


async def test_a_pause_or_unpause_the_runtime_gives_up_on_is_asked_again(monkeypatch):
    """runc's cgroup v1 freezer gives up on a busy host (HTTP 500): the copy must not run unfrozen for it."""
    engine = _Engine(monkeypatch, pause=[500, 500, 204], unpause=[500, 204])
    async with held_still("c"):
        assert engine.calls == ["pause"] * 3
    assert engine.calls == ["pause"] * 3 + ["unpause"] * 2


async def test_a_container_that_cannot_be_paused_is_copied_running_and_a_warning_says_so(monkeypatch, caplog):
    engine = _Engine(monkeypatch, pause=[500])
    with caplog.at_level(logging.WARNING, logger=transfer.__name__):
        async with held_still("c"):
            pass
    assert engine.calls == ["pause"] * transfer._PAUSE_TRIES, "asked a bounded number of times, never unpaused"
    assert "Copying out of container c while it runs" in caplog.text and "pause refused" in caplog.text


@pytest.mark.parametrize("answer", [509, 409, 404], ids=["exited", "conflict", "gone"])
async def test_a_container_not_running_is_copied_as_it_is_at_once(monkeypatch, caplog, answer):
    """An exited container's pause is a 500 too, "container state improper": asked again, each copy
    out of it waited ~10 s (runs of the whole suite slowed by half)."""
    engine = _Engine(monkeypatch, pause=[answer])
    with caplog.at_level(logging.WARNING, logger=transfer.__name__):
        async with held_still("c"):
            pass
    assert engine.calls == ["pause"] and caplog.text == ""


async def test_an_unpause_that_keeps_failing_is_an_error_naming_the_container(monkeypatch):
    _Engine(monkeypatch, pause=[204], unpause=[500])
    with pytest.raises(Exception, match="resuming container c after a copy"):
        async with held_still("c"):
            pass


async def test_a_container_that_ended_during_the_copy_needs_no_unpause(monkeypatch):
    engine = _Engine(monkeypatch, pause=[204], unpause=[509])
    async with held_still("c"):
        pass
    assert engine.calls == ["pause", "unpause"]
