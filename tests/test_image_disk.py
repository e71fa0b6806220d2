"""The builder's cache stays under its cap, and is never dropped under a running build (no container needed)."""

import asyncio

import pytest

from prefect_harbor.sandbox import image_disk
from prefect_harbor.sandbox.image_disk import CACHE_CAP_VARIABLE, cache_cap_bytes, cache_in_use, check_cache, check_cache_if_due


def fill(home, megabytes):
    for part in image_disk.CACHE_PARTS:
        (home / part).mkdir(parents=True, exist_ok=True)
    (home / "storage" / "layer").write_bytes(b"\1" * (megabytes << 20))
    (home / "bases" / "base.tar").write_bytes(b"\2" * (1 << 20))
    (home / "image.lock").touch()  # not cache: stays


def test_a_cache_over_its_cap_is_dropped_whole_and_the_rest_of_the_home_stays(tmp_path):
    fill(tmp_path, 3)
    checked = check_cache(tmp_path, cap_bytes=2 << 20)
    assert checked.dropped and checked.size_bytes >= 4 << 20
    assert not any((tmp_path / part).exists() for part in image_disk.CACHE_PARTS)
    assert (tmp_path / "image.lock").exists()
    assert "dropped" in checked.describe()


def test_a_cache_under_its_cap_is_kept(tmp_path):
    fill(tmp_path, 1)
    checked = check_cache(tmp_path, cap_bytes=1 << 30)
    assert not checked.dropped and (tmp_path / "storage" / "layer").exists()
    assert checked.describe().startswith("builder cache: 0.0 GB of a 1.07374 GB cap, kept")


def test_the_cache_is_never_dropped_while_a_build_holds_it(tmp_path):
    fill(tmp_path, 3)

    async def check_during_a_build():
        async with cache_in_use(tmp_path):
            return await asyncio.to_thread(check_cache, tmp_path, 1)

    checked = asyncio.run(check_during_a_build())
    assert checked.busy and not checked.dropped and (tmp_path / "storage" / "layer").exists()
    assert check_cache(tmp_path, 1).dropped, "once the build is done, the next check drops it"


def test_a_build_checks_the_cache_at_most_every_ten_minutes(tmp_path, monkeypatch):
    monkeypatch.setattr(image_disk, "_last_check", None)
    fill(tmp_path, 1)
    assert check_cache_if_due(tmp_path) is not None
    assert check_cache_if_due(tmp_path) is None


@pytest.mark.parametrize(("setting", "expected"), [("", 20_000_000_000), ("2.5", 2_500_000_000), ("0", 0)])
def test_the_cap_comes_from_its_variable(monkeypatch, setting, expected):
    monkeypatch.setenv(CACHE_CAP_VARIABLE, setting)
    assert cache_cap_bytes() == expected


@pytest.mark.parametrize("setting", ["twenty", "-1", "nan"])
def test_a_bad_cap_is_refused_naming_the_variable_and_the_fix(monkeypatch, setting):
    monkeypatch.setenv(CACHE_CAP_VARIABLE, setting)
    with pytest.raises(ValueError, match=rf"{CACHE_CAP_VARIABLE}=.*set it to one \(e\.g\. 20\)"):
        cache_cap_bytes()
