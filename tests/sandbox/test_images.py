"""Task images built by podman from real Dockerfiles: semantics, caching, bases, failures, resources."""

import logging
import re
import uuid
from pathlib import Path

import pytest
from tasks_factory import BASE_DOCKERFILE, BASE_IMAGE

from prefect_harbor.sandbox import BaseImageNotFoundError, ImageBuildError, prepare_task_image
from prefect_harbor.sandbox.engine import podman
from prefect_harbor.sandbox.images import ImageResolver, image_resolver, present_images
from prefect_harbor.sandbox.standins import shipped_stand_in

#: Each test starts podman (builds, containers): the integration tier.
pytestmark = pytest.mark.integration


FULL_SEMANTICS = """\
ARG BASE=debian:bookworm-slim
FROM --platform=linux/amd64 $BASE AS builder
ARG GREETING=hi
RUN echo "$GREETING from the builder stage" > /built.txt
FROM ${BASE}
RUN useradd --create-home agent
COPY --from=builder /built.txt /opt/built.txt
COPY --chown=agent:agent files/ /home/agent/files/
ADD files/a.txt /opt/added.txt
RUN <<EOT
echo heredoc-1 > /opt/heredoc.txt
echo heredoc-2 >> /opt/heredoc.txt
EOT
USER agent
WORKDIR /home/agent
"""


def environment_dir(root: Path, dockerfile: str, **files: str) -> Path:
    directory = root / "environment"
    directory.mkdir(parents=True)
    (directory / "Dockerfile").write_text(dockerfile)
    for name, content in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(content)
    return directory


def fresh_resolver(**kwargs) -> ImageResolver:
    """A resolver that remembers nothing from earlier tests (podman's storage still does)."""
    ImageResolver._known.clear()
    ImageResolver._stood_in.clear()
    ImageResolver._shipped.clear()
    return image_resolver(**{"extra_ca_certs": [], **kwargs})


async def test_multi_stage_copy_chown_add_arg_user_and_heredocs(make_environment):
    env = make_environment(dockerfile=FULL_SEMANTICS)
    (env.environment_dir / "files").mkdir()
    (env.environment_dir / "files" / "a.txt").write_text("added\n")
    await env.start(force_build=False)
    try:
        result = await env.exec("id -un; pwd; cat /opt/built.txt /opt/added.txt /opt/heredoc.txt; stat -c %U files/a.txt")
    finally:
        await env.stop(delete=True)
    assert result.stdout.split("\n")[:7] == ["agent", "/home/agent", "hi from the builder stage", "added", "heredoc-1", "heredoc-2", "agent"], result


async def test_an_unchanged_task_is_never_rebuilt_and_its_tests_do_not_count(tmp_path):
    task = tmp_path / "task"
    probe = uuid.uuid4().hex  # podman's storage outlives test runs: a content never built before
    context = environment_dir(task, BASE_DOCKERFILE + f"RUN echo {probe} > /probe\n")
    first = fresh_resolver()
    tag = await first.ensure_built(context, "probe", timeout_sec=600)
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text("echo changed")
    again = fresh_resolver()
    assert await again.ensure_built(context, "probe", timeout_sec=600) == tag
    assert again.builds == 0, "an unchanged image was built again"
    (context / "Dockerfile").write_text(BASE_DOCKERFILE + f"RUN echo {probe}-changed > /probe\n")
    changed = fresh_resolver()
    assert await changed.ensure_built(context, "probe", timeout_sec=600) != tag and changed.builds == 1


async def test_present_images_tells_built_from_missing_names_in_one_call_and_builds_nothing(tmp_path):
    probe = uuid.uuid4().hex
    context = environment_dir(tmp_path / "task", BASE_DOCKERFILE + f"RUN echo {probe} > /probe\n")
    resolver = fresh_resolver()
    named = await resolver.ensure_built(context, "probe", timeout_sec=600, build=False)
    assert await present_images({named}) == set() and resolver.builds == 0, "naming an image built it"
    assert await resolver.ensure_built(context, "probe", timeout_sec=600) == named
    missing = f"localhost/prefect-harbor/task:{uuid.uuid4().hex[:20]}"
    assert await present_images({named, missing, BASE_IMAGE}) == {named, BASE_IMAGE}
    assert await present_images(set()) == set()


async def test_a_base_that_cannot_be_found_names_the_reference_and_the_fix(tmp_path):
    context = environment_dir(tmp_path, "FROM registry.invalid/nobody/nothing:1\n")
    with pytest.raises(BaseImageNotFoundError, match=r"'registry.invalid/nobody/nothing:1'.*prefect-harbor images bootstrap.*base_images"):
        await fresh_resolver().ensure_built(context, "missing", timeout_sec=60)


async def test_a_stand_in_base_is_used_with_a_warning(tmp_path, caplog):
    context = environment_dir(tmp_path, "FROM ubuntu:24.04\nRUN test -f /etc/debian_version\n")
    with caplog.at_level(logging.WARNING):
        tag = await fresh_resolver(base_images={"ubuntu:24.04": BASE_IMAGE}).ensure_built(context, "stand-in", timeout_sec=120)
    assert tag
    assert any("'ubuntu:24.04' is stood in by" in r.getMessage() for r in caplog.records), caplog.text


async def test_a_package_version_the_stand_ins_archive_lacks_fails_naming_the_stand_in(tmp_path):
    """An Ubuntu version pin on the Debian-based ubuntu:24.04 stand-in: the message says it is the stand-in's limit."""
    pinned = f"FROM ubuntu:24.04\nRUN apt-get install -y --no-install-recommends texlive-latex-base=2023.20240207-1  # {uuid.uuid4().hex}\n"
    with pytest.raises(ImageBuildError, match="(?s)Unable to locate package texlive-latex-base.*'ubuntu:24.04' is stood in by.*the stand-in's limit"):
        await fresh_resolver(base_images={"ubuntu:24.04": BASE_IMAGE}).ensure_built(environment_dir(tmp_path, pinned), "pinned", timeout_sec=120)


async def test_a_failed_build_reports_the_tail_of_its_log(tmp_path):
    context = environment_dir(tmp_path, "FROM debian:bookworm-slim\nRUN echo the-step-that-breaks && exit 3\n")
    with pytest.raises(ImageBuildError, match="the-step-that-breaks") as failed:
        await fresh_resolver().ensure_built(context, "broken", timeout_sec=120)
    assert failed.value.log_path is not None and "the-step-that-breaks" in failed.value.log_path.read_text()


@pytest.mark.slow
async def test_apt_pip_and_uv_work_behind_the_hosts_intercepting_proxy(make_environment):
    """This machine's HTTPS egress needs its extra CA: given to the build (and kept for the trial).
    uv reads its own roots unless told to use the system's (``native-tls`` in /etc/uv/uv.toml), which the image is."""
    env = make_environment(
        dockerfile=BASE_DOCKERFILE
        + "RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pip >/dev/null\n"
        + "RUN pip install --quiet --break-system-packages --no-cache-dir six uv && python3 -c 'import six'\n"
        + "RUN uv pip install --quiet --system --break-system-packages --no-cache idna && python3 -c 'import idna'\n"
    )
    await env.start(force_build=False)
    try:
        trial_time = await env.exec("pip download --quiet --no-deps --no-cache-dir -d /tmp/wheels six && ls /tmp/wheels", timeout_sec=120)
        uv_time = await env.exec("uv pip install --quiet --no-cache --target /tmp/uv-target six && ls /tmp/uv-target", timeout_sec=120)
    finally:
        await env.stop(delete=True)
    assert trial_time.return_code == 0 and "six-" in trial_time.stdout, trial_time
    assert uv_time.return_code == 0 and "six.py" in uv_time.stdout, uv_time


async def test_builds_get_the_hosts_proxy_settings_and_the_image_keeps_none(tmp_path, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    context = environment_dir(tmp_path, f'FROM debian:bookworm-slim\nRUN echo "$HTTP_PROXY" > /proxy-at-build  # {uuid.uuid4().hex}\n')
    tag = await fresh_resolver().ensure_built(context, "proxied", timeout_sec=120)
    seen = (await podman("run", "--rm", tag, "cat", "/proxy-at-build")).check("run").text
    kept = (await podman("image", "inspect", "--format", "{{.Config.Env}}", tag)).check("inspect").text
    assert seen == "http://proxy.invalid:3128" and "proxy.invalid" not in kept


async def test_an_unpullable_ubuntu_base_gets_the_shipped_debian_stand_in_with_a_warning_on_every_use(tmp_path, caplog):
    context = environment_dir(tmp_path, "FROM ubuntu:24.04\nRUN test -f /etc/debian_version\n")
    resolver = fresh_resolver()
    with caplog.at_level(logging.WARNING):
        await resolver.ensure_built(context, "ubuntu-task", timeout_sec=300)
        await resolver.ensure_built(context, "ubuntu-task", timeout_sec=300)
    warnings = [r.getMessage() for r in caplog.records if "'ubuntu:24.04' cannot be pulled: stood in by" in r.getMessage()]
    assert len(warnings) == 2 and "Debian 12" in warnings[0], caplog.text


def test_buildpack_deps_is_stood_in_by_an_image_with_its_build_tools_not_by_bare_debian():
    """Tasks on buildpack-deps call gcc, make, git and curl without installing them: bare Debian has none."""
    stand_in = shipped_stand_in("docker.io/library/buildpack-deps:jammy")
    assert stand_in is not None and stand_in.folder is not None and stand_in.image is None
    installed = (stand_in.folder / "Dockerfile").read_text().split()
    assert {"gcc", "g++", "make", "git", "curl", "libc6-dev"} <= set(installed)
    assert shipped_stand_in("docker.io/library/ubuntu:22.04").image == "debian:bookworm"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the build's own deadline: on a cold machine CPython 3.13 compiles from source (~4 CPU-minutes)
@pytest.mark.parametrize(
    "base, check, said",
    [
        (
            # What four Terminal-Bench 2.0 tasks need of it: bookworm's userland (libgl1-mesa-glx, OpenSSL 3.0's
            # "CN = " output), Python 3.13 in /usr/local, pip that upgrades itself, and no compiler in -slim.
            "python:3.13-slim-bookworm",
            "python -c 'import sys; assert sys.version_info[:2] == (3, 13) and sys.prefix == \"/usr/local\", sys.version' "
            "&& grep -q 'VERSION_CODENAME=bookworm' /etc/os-release && ! command -v gcc && pip install -q --upgrade pip "
            "&& openssl version | grep -q '^OpenSSL 3.0' && apt-get update -qq && apt-get install -y -qq --no-install-recommends libgl1-mesa-glx > /dev/null",
            "CPython 3.13 compiled from Debian's source package python3.13 into /usr/local on Debian 12 (bookworm)'s userland",
        ),
        ("buildpack-deps:jammy", "printf 'int main(void){return 0;}\\n' > t.c && make t && ./t && git --version && curl --version", "build tools"),
        (
            "ghcr.io/laude-institute/t-bench/python-3-13",
            "python -c 'import sys; assert sys.version_info[:2] == (3, 13)' && grep -q bookworm /etc/os-release "
            "&& command -v tmux asciinema && python -m pytest --version && test \"$PWD\" = /app",
            "CPython 3.13 on Debian 12",
        ),
        (
            "ghcr.io/laude-institute/t-bench/deveval:latest",
            "git --version && make --version && cmake --version && javac -version && mvn -v && node --version && npm --version "
            "&& python -m pytest --version && python -c 'import pytest_cov' && command -v tmux asciinema",
            "DevEval's toolchains",
        ),
    ],
)
async def test_an_unpullable_base_gets_a_stand_in_that_does_what_tasks_expect_of_it(tmp_path, caplog, base, check, said):
    """Built once from Debian's mirror (a minute or a few, then cached by content), with a warning naming it."""
    context = environment_dir(tmp_path, f"FROM {base}\nRUN {check}\n")
    with caplog.at_level(logging.WARNING):  # the host's CA certificates, as a sweep has them: stand-ins install from PyPI
        await fresh_resolver(extra_ca_certs=None).ensure_built(context, "stand-in-task", timeout_sec=1800)
    assert f"'{base}' cannot be pulled: stood in by" in caplog.text and said in caplog.text


def write_task(root: Path, dockerfile: str | None, docker_image: str | None) -> Path:
    """A task folder with an optional Dockerfile and an optional prebuilt ``docker_image``, as Terminal-Bench 2.0 tasks have both."""
    (root / "environment").mkdir(parents=True)
    (root / "task.toml").write_text("[environment]\n" + (f'docker_image = "{docker_image}"\n' if docker_image else ""))
    if dockerfile is not None:
        (root / "environment" / "Dockerfile").write_text(dockerfile)
    return root


async def test_a_prebuilt_image_that_cannot_be_had_is_built_from_the_tasks_dockerfile_with_a_warning_naming_both(tmp_path, caplog):
    unpullable = "registry.invalid/alexgshaw/fix-git:20251031"
    task = write_task(tmp_path / "tb2-shaped", BASE_DOCKERFILE, unpullable)
    fresh_resolver()
    with caplog.at_level(logging.WARNING):
        prepared = await prepare_task_image(task, {"extra_ca_certs": []}, logging.getLogger("test"))
    assert prepared.image.startswith("localhost/prefect-harbor/task:") and prepared.source.built
    assert str(prepared.source) == f"built from environment/Dockerfile (docker_image {unpullable!r} is not in local storage and cannot be pulled)"
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert f"docker_image {unpullable!r} is not in local storage and cannot be pulled: building the task's own environment/Dockerfile" in warning
    without_dockerfile = write_task(tmp_path / "image-only", None, unpullable)
    refused = r"the task's \[environment\] docker_image 'registry.invalid/alexgshaw/fix-git:20251031' .* no environment/Dockerfile .* Fix: pull"
    with pytest.raises(BaseImageNotFoundError, match=refused):
        await prepare_task_image(without_dockerfile, {"extra_ca_certs": []}, logging.getLogger("test"))


async def test_a_prebuilt_image_that_can_be_had_is_used_and_force_build_builds_the_dockerfile_instead(tmp_path):
    task = write_task(tmp_path / "local-image", BASE_DOCKERFILE, BASE_IMAGE)
    prebuilt = await prepare_task_image(task, {"extra_ca_certs": []}, logging.getLogger("test"))
    assert (prebuilt.image, str(prebuilt.source)) == (BASE_IMAGE, f"prebuilt docker_image {BASE_IMAGE!r}")
    forced = await prepare_task_image(task, {"extra_ca_certs": []}, logging.getLogger("test"), force_build=True)
    assert forced.image.startswith("localhost/prefect-harbor/task:") and str(forced.source) == "built from environment/Dockerfile (force_build)"


async def test_every_workdir_of_the_final_stage_exists_in_the_image_owned_as_dockers_builder_makes_it(tmp_path):
    """buildah 1.28 makes a WORKDIR only when a later step writes into it; podman then refuses --workdir for it."""
    probe = uuid.uuid4().hex
    context = environment_dir(
        tmp_path,
        f"FROM debian:bookworm-slim\nRUN useradd --create-home agent  # {probe}\nWORKDIR /first\nUSER agent\nWORKDIR /home/agent/work\nWORKDIR /app\n",
    )
    tag = await fresh_resolver().ensure_built(context, "workdir-last", timeout_sec=300)
    done = await podman("run", "--rm", "--workdir", "/app", "--user", "root", tag, "stat", "-c", "%n %U", "/first", "/home/agent/work", ".")
    assert done.check("run").text.splitlines() == ["/first root", "/home/agent/work agent", ". agent"]


async def test_copy_from_an_image_gets_the_base_image_chain_and_uvs_stand_in_has_the_tags_release(tmp_path, caplog):
    """COPY --from=ghcr.io/astral-sh/uv:X (and a RUN --mount from it) is found like a FROM base: here by uv X's
    own binaries from its PyPI wheel."""
    context = environment_dir(
        tmp_path,
        "FROM debian:bookworm-slim\nCOPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx /bin/\n"
        "RUN --mount=type=bind,from=ghcr.io/astral-sh/uv:0.8.15,source=/uvx,target=/mnt/uvx test -x /mnt/uvx && touch /mounted"
        f"  # {uuid.uuid4().hex}\n",  # built afresh: a cached image would not show how it builds
    )
    with caplog.at_level(logging.WARNING):
        tag = await fresh_resolver().ensure_built(context, "copy-from-uv", timeout_sec=600)
    seen = await podman("run", "--rm", tag, "sh", "-c", "test -x /bin/uvx && test -f /mounted && uv --version")
    assert seen.check("run").text.startswith("uv 0.8.15")
    assert "'ghcr.io/astral-sh/uv:0.8.15' cannot be pulled: stood in by" in caplog.text and "uv 0.8.15's /uv and /uvx from its PyPI wheel" in caplog.text


async def test_the_ubuntu_stand_in_has_the_ubuntu_user_that_ubuntu_24_04_has(tmp_path, caplog):
    context = environment_dir(tmp_path, "FROM ubuntu:24.04\nUSER ubuntu\nRUN touch /home/ubuntu/owned\n")
    with caplog.at_level(logging.WARNING):
        tag = await fresh_resolver().ensure_built(context, "ubuntu-user", timeout_sec=300)
    assert (await podman("run", "--rm", tag, "id")).check("run").text == "uid=1000(ubuntu) gid=1000(ubuntu) groups=1000(ubuntu)"
    assert "'ubuntu:24.04' cannot be pulled: stood in by" in caplog.text and "`ubuntu` user (uid 1000)" in caplog.text


@pytest.mark.parametrize(
    ("tag", "build_args", "said"),
    [
        ("3.13-slim-bookworm", ("bookworm", "trixie", "13", "1"), "python3.13 into /usr/local on Debian 12 (bookworm)'s userland, pip from ensurepip, no compiler (slim)"),
        ("3.11-slim", ("trixie", "bookworm", "11", "1"), "CPython 3.11 compiled from Debian's source package python3.11 into /usr/local on Debian 13 (trixie)'s userland"),
        ("3.9.18-bullseye", ("bullseye", "bullseye", "9", "0"), "on Debian 11 (bullseye)'s userland, pip from ensurepip, with gcc, g++, make"),
        ("3.12-slim", ("trixie", "trixie", "13", "1"), "NOT the tag's Python 3.12: Debian's archive has no source of it, 3.13 is the nearest"),
        ("3.14", ("trixie", "forky", "14", "0"), "CPython 3.14 compiled from Debian's source package python3.14"),
        ("3-slim", ("trixie", "forky", "14", "1"), "CPython 3.14"),
        ("3.13-alpine", ("trixie", "trixie", "13", "1"), "Debian, not Alpine"),
    ],
)
def test_the_python_stand_in_is_the_tags_cpython_on_the_tags_suite_as_the_official_image_is_built(tag, build_args, said):
    stand_in = shipped_stand_in(f"docker.io/library/python:{tag}")
    assert tuple(stand_in.build_args[k] for k in ("SUITE", "SOURCE_SUITE", "PYTHON_MINOR", "SLIM")) == build_args and said in stand_in.what, stand_in.what


@pytest.mark.slow
async def test_a_debian_release_tag_is_bootstrapped_from_debians_mirror_on_first_use(tmp_path, caplog):
    """debian:13-slim is trixie's minbase tree (shared with the python 3.13 stand-in: bootstrapped once per host)."""
    alias = "prefect-harbor.local/library/debian:13-slim"
    await podman("untag", alias, alias)  # this one name of ours alone (without the second, untag drops every name of the image)
    context = environment_dir(tmp_path, "FROM debian:13-slim\nRUN grep -q '^13' /etc/debian_version\n")
    try:
        with caplog.at_level(logging.INFO):
            await fresh_resolver().ensure_built(context, "debian-13", timeout_sec=1800)
        assert f"bootstrapped {alias!r} from Debian's mirror (its current trixie)" in caplog.text
    finally:
        await podman("untag", alias, alias)


async def test_a_fork_loop_in_a_run_step_is_held_to_the_process_limit(tmp_path):
    """podman 4.3 has no --pids-limit for builds: the build slot's cgroup holds its RUN steps to pids_limit,
    and the host keeps its processes."""
    # The loop ends its children before it says how far it got: the limit holds buildah's helper too, and
    # on a busy machine a helper that could not start a thread while the loop held every pid lost the line.
    fork_loop = (
        "RUN perl -e '$| = 1; my @kids; for (1 .. 400) { my $child = fork(); last unless defined $child; "
        "if ($child == 0) { sleep 5; exit 0 } push @kids, $child } kill 9, @kids; waitpid($_, 0) for @kids; "
        f'print "started ", scalar(@kids), "\\n"; exit 1\'  # {uuid.uuid4().hex}\n'
    )
    context = environment_dir(tmp_path, f"FROM debian:bookworm-slim\n{fork_loop}")
    with pytest.raises(ImageBuildError) as failed:
        await fresh_resolver(pids_limit=64).ensure_built(context, "forks", timeout_sec=300)
    assert failed.value.log_path is not None
    log = failed.value.log_path.read_text()
    started = re.search(r"^started (\d+)$", log, re.MULTILINE)
    assert started is not None, f"the fork loop never said how far it got; the build's log ends:\n{log[-3000:]}"
    assert int(started[1]) < 64, f"the loop ran unbounded: {started[0]}"


async def test_a_build_past_its_timeout_is_stopped_and_leaves_no_builder_behind(tmp_path):
    token = uuid.uuid4().hex
    context = environment_dir(tmp_path, f"FROM debian:bookworm-slim\nRUN echo {token} && sleep 300\n")
    resolver = fresh_resolver()
    tag = await resolver.ensure_built(context, "slow", timeout_sec=8, build=False)  # its name; other builds may run beside it
    with pytest.raises(ImageBuildError, match="took longer than the task's build_timeout_sec"):
        await resolver.ensure_built(context, "slow", timeout_sec=8)
    left = await podman("ps", "--all", "--quiet", "--filter", f"label=io.prefect-harbor.build={tag}")
    assert left.text == "", "a builder container outlived its build"


async def test_a_file_only_its_owner_may_read_is_built_into_the_image_as_dockers_builder_reads_it(tmp_path):
    """The builder's root is nobody on the host: it reads a copy of the context made for it, modes kept."""
    context = environment_dir(tmp_path, f"FROM debian:bookworm-slim\nCOPY secret.txt /opt/secret.txt\nRUN echo {uuid.uuid4().hex}\n", **{"secret.txt": "mine\n"})
    (context / "secret.txt").chmod(0o600)
    tag = await fresh_resolver().ensure_built(context, "private", timeout_sec=300)
    shown = await podman("run", "--rm", tag, "stat", "-c", "%a %u %s", "/opt/secret.txt")
    assert shown.text == "600 0 5", shown


async def test_identical_mount_lines_of_two_tasks_each_mount_their_own_stage(tmp_path):
    """buildah's layer cache keys a RUN by its text, not by what it mounts: the guard names the mounted
    stage by the image's content, so the second task does not get the first one's layer. The mount
    sits behind a comment line inside the continuation, which buildah reads as part of the RUN."""
    run = uuid.uuid4().hex
    words: dict[str, str] = {}
    for word in ("first", "second"):
        dockerfile = (
            f"FROM debian:bookworm-slim AS builder\nRUN echo {word} > /word  # {run}\nFROM debian:bookworm-slim\n"
            f"RUN \\\n# a comment inside the continuation\n --mount=type=bind,from=builder,source=/word,target=/w cp /w /word  # {run}\n"
        )
        tag = await fresh_resolver().ensure_built(environment_dir(tmp_path / word, dockerfile), f"mount-{word}", timeout_sec=300)
        words[word] = (await podman("run", "--rm", tag, "cat", "/word")).check("run").text.strip()
    assert words == {"first": "first", "second": "second"}


@pytest.mark.parametrize(
    "line",
    ["COPY --from={tag} /secret /stolen", "COPY --from=${{X}} /secret /stolen", "FROM {tag}", "COPY --from=prefect-harbor.local/builder:trixie-1 /usr/bin/buildah /b"],
    ids=["copy-from-another-tasks-image", "copy-from-a-variable", "from-another-tasks-image", "copy-from-the-builder"],
)
async def test_a_task_cannot_read_another_tasks_image_or_the_builders(tmp_path, line):
    """Red-team finding: the resolver pinned any image on the host, and an unpinned --from=${X} reached the builder's shared storage."""
    victim = await fresh_resolver().ensure_built(
        environment_dir(tmp_path / "victim", f"FROM debian:bookworm-slim\nRUN echo victim-{uuid.uuid4().hex} > /secret\n"), "victim", timeout_sec=300
    )
    hostile = f"FROM debian:bookworm-slim\nARG X={victim}\n" + line.format(tag=victim) + "\n"
    with pytest.raises(ImageBuildError, match="another task|through a variable"):
        await fresh_resolver().ensure_built(environment_dir(tmp_path / "hostile", hostile), "hostile", timeout_sec=300)
