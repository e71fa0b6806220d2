"""The builder container's command line: its walls, and that it sees no host path but its own (no engine runs here)."""

import asyncio
import io
import tarfile
from pathlib import Path

import pytest

from prefect_harbor.sandbox import builder
from prefect_harbor.sandbox.engine import CONF_DIR
from prefect_harbor.sandbox.private import PrivateFolderError, private_folder
from prefect_harbor.sandbox.seccomp import strict_profile


@pytest.fixture
def argv(tmp_path, monkeypatch) -> list[str]:
    monkeypatch.setenv("PREFECT_HARBOR_BUILDER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(builder, "ensure_network", lambda: "prefect-harbor")
    monkeypatch.setattr(builder, "seccomp_profile", lambda: tmp_path / "profile.json")
    monkeypatch.setattr(builder, "_owned_by_builder", lambda path: path)
    home = builder.builder_home()
    job = builder.BuildJob(
        context=tmp_path / "task" / "environment", dockerfile="FROM x\n", tag="localhost/prefect-harbor/task:abc",
        bases={"prefect-harbor.local/library/debian:bookworm-slim": "f" * 64}, contexts={"prefect-harbor-extra-ca": tmp_path / "ca"},
        labels={"io.prefect-harbor.task": "t"}, build_args={"HTTP_PROXY": "http://10.89.0.1:47200"},
    )  # fmt: skip
    archives = {"f" * 64: home / "bases" / f"{'f' * 64}.tar"}
    return asyncio.run(builder._run_argv("builder:image", "b1", job, home / "build-1", home / "build-1" / "out", archives, 512, home))


def volumes(argv: list[str]) -> list[tuple[str, str]]:
    return [tuple(argv[i + 1].split(":")[:2]) for i, word in enumerate(argv) if word == "--volume"]  # type: ignore[misc]


def test_the_builder_runs_in_its_own_user_namespace_with_the_trials_walls(argv):
    engine = argv[: argv.index("builder:image")]
    assert ["--uidmap", f"0:{builder.BUILDER_IDS[0]}:65536"] == engine[engine.index("--uidmap") : engine.index("--uidmap") + 2]
    assert engine[engine.index("--cap-add") + 1] == "SYS_ADMIN" and engine.count("--cap-add") == 1
    assert engine[engine.index("--network") + 1] == "prefect-harbor"
    assert engine[engine.index("--pids-limit") + 1] == "512"
    assert any(word.startswith("seccomp=") for word in engine) and "--privileged" not in engine
    assert "--http-proxy=false" in engine


def test_the_builder_sees_no_host_path_but_its_own_and_the_builds_inputs(argv, tmp_path):
    home = tmp_path / "home"
    allowed = (home, tmp_path / "profile.json", CONF_DIR / "containers.conf")
    for source, target in volumes(argv):
        assert any(Path(source) == root or Path(source).is_relative_to(root) for root in allowed), (source, target)
    assert ("/context" in {target for _, target in volumes(argv)}) and (str(tmp_path / "task" / "environment"), "/context") not in volumes(argv)


def test_run_steps_get_the_strict_profile_and_the_bases_come_in_by_id(argv):
    script_args = argv[argv.index(builder._BUILD_SCRIPT) + 1 :]
    assert script_args[:4] == ["build", "localhost/prefect-harbor/task:abc", "f" * 64, "prefect-harbor.local/library/debian:bookworm-slim"]
    build = script_args[script_args.index("--") + 1 :]
    assert build[build.index("--isolation") + 1] == "chroot" and "--pull=never" in build
    assert any(word.startswith("seccomp=") for word in build), "RUN steps would hold the builder's own SYS_ADMIN filter"
    assert "prefect-harbor-extra-ca=/contexts/0" in build and "HTTP_PROXY=http://10.89.0.1:47200" in build


def test_a_seccomp_rule_that_repeats_the_default_is_dropped_as_buildahs_libseccomp_requires():
    default = {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "syscalls": [{"names": ["read", "clone3"], "action": "SCMP_ACT_ALLOW"}]}
    rules = strict_profile(default)["syscalls"]
    assert not [rule for rule in rules if rule["action"] == "SCMP_ACT_ERRNO" and rule.get("errnoRet") == 38]
    assert any(rule["names"] == ["unshare"] or "unshare" in rule["names"] for rule in rules if rule.get("errnoRet") == 1)


def test_a_private_folder_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "logs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(PrivateFolderError, match="is a link or belongs to another user"):
        private_folder(tmp_path / "logs", "build logs")
    made = private_folder(tmp_path / "fresh", "build logs")
    assert made.stat().st_mode & 0o777 == 0o700


@pytest.fixture
def builder_without_engine(tmp_path, monkeypatch) -> None:
    """run_build with everything but its podman calls (which each test stands in for) made harmless."""
    monkeypatch.setenv("PREFECT_HARBOR_BUILDER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(builder, "ensure_builder_image", lambda: "builder:image")
    monkeypatch.setattr(builder, "ensure_network", lambda: "prefect-harbor")
    monkeypatch.setattr(builder, "seccomp_profile", lambda: None)
    monkeypatch.setattr(builder, "_owned_by_builder", lambda path: (path.mkdir(parents=True, exist_ok=True), path)[1])
    monkeypatch.setattr(builder, "ensure_watchdog", lambda: None)


@pytest.mark.parametrize("leave", ["link", "folder", "nothing", "retagged"])
def test_an_output_the_builder_left_as_a_link_or_naming_other_images_is_not_loaded(tmp_path, monkeypatch, leave, builder_without_engine):
    """A builder a step took over writes its output folder: podman (host root) must not follow a link out of it."""
    secret = tmp_path / "host-secret"
    secret.write_text("not for the builder")
    calls: list[tuple[str, ...]] = []

    async def engine(*args: str, timeout: float | None = None) -> builder.Completed:
        calls.append(args)
        if args[0] == "run":
            out = next(Path(a.split(":")[0]) for a in args if a.endswith(":/out"))
            if leave == "link":
                (out / "image.tar").symlink_to(secret)
            elif leave == "folder":
                (out / "image.tar").mkdir()
            elif leave == "retagged":  # its own tag, and a base's: podman load would re-point the base
                _docker_archive(out / "image.tar", [b'[{"RepoTags": ["localhost/prefect-harbor/task:x", "prefect-harbor.local/library/debian:bookworm-slim"]}]'])
        return builder.Completed(0, b"", b"")

    monkeypatch.setattr(builder, "podman", engine)
    context = tmp_path / "context"
    context.mkdir()
    done = asyncio.run(builder.run_build(builder.BuildJob(context, "FROM scratch\n", "localhost/prefect-harbor/task:x"), timeout_sec=60, pids_limit=64))
    assert done.returncode != 0 and (b"no image archive" in done.stderr or b"not loaded" in done.stderr)
    assert [call[0] for call in calls] == ["run"], "podman load was handed what the builder left"


def _docker_archive(path: Path, manifests: list[bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for manifest in manifests:
            info = tarfile.TarInfo("manifest.json")
            info.size = len(manifest)
            tar.addfile(info, io.BytesIO(manifest))
    return path


@pytest.mark.parametrize(
    ("manifests", "names"),
    [
        ([b'[{"RepoTags": ["localhost/prefect-harbor/task:x"]}]'], [["localhost/prefect-harbor/task:x"]]),
        ([b'[{"RepoTags": ["localhost/prefect-harbor/task:x", "prefect-harbor.local/library/debian:bookworm-slim"]}]'],
         [["localhost/prefect-harbor/task:x", "prefect-harbor.local/library/debian:bookworm-slim"]]),
        ([b'[{"RepoTags": ["localhost/prefect-harbor/task:x"]}]', b'[{"RepoTags": ["localhost/victim:1"]}]'], None),
        ([b"not json"], None),
        ([], None),
    ],
    ids=["its-own-tag", "a-base-too", "two-manifests", "unreadable", "none"],
)
def test_the_names_an_archive_would_give_are_read_before_it_is_loaded(tmp_path, manifests, names):
    """podman load tags whatever the archive names; run_build loads only an archive naming its own tag alone."""
    assert builder._archive_names(_docker_archive(tmp_path / "image.tar", manifests)) == names


#: What runc printed when a builder could not start on a busy CI machine, and a build's own failure.
RUNC_BUSY = b"Error: runc: runc create failed: unable to start container process: Close_Fd sealing memfd copy: device or resource busy: OCI runtime error\n"
BUILD_FAILED = b"error building at STEP \"RUN make\": exit status 2\n"


@pytest.mark.parametrize(("first", "runs"), [(RUNC_BUSY, 2), (BUILD_FAILED, 1)], ids=["runtime-busy", "build-failed"])
def test_a_builder_the_runtime_could_not_start_is_started_once_more_a_failed_build_is_not(tmp_path, monkeypatch, first, runs, builder_without_engine):
    calls: list[str] = []

    async def engine(*args: str, timeout: float | None = None) -> builder.Completed:
        calls.append(args[0])
        return builder.Completed(1, b"", first) if calls.count("run") == 1 else builder.Completed(1, b"", b"second run")

    monkeypatch.setattr(builder, "podman", engine)
    (tmp_path / "context").mkdir()
    done = asyncio.run(builder.run_build(builder.BuildJob(tmp_path / "context", "FROM scratch\n", "localhost/prefect-harbor/task:x"), timeout_sec=60, pids_limit=64))
    assert calls.count("run") == runs and done.stderr == (b"second run" if runs == 2 else first)
    assert not builder.runtime_could_not_start(b"runc: memfd\n") and builder.runtime_could_not_start(RUNC_BUSY)
