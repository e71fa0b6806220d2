"""Task images built by podman from real Dockerfiles: semantics, caching, bases, failures, resources."""

import logging
import re
import uuid
from pathlib import Path

import pytest

from prefect_harbor.sandbox import BaseImageNotFoundError, ImageBuildError
from prefect_harbor.sandbox.container import image_resolver
from prefect_harbor.sandbox.engine import podman
from prefect_harbor.sandbox.images import ImageResolver, present_images
from prefect_harbor.sandbox.standins import shipped_stand_in

from tests.tasks_factory import BASE_DOCKERFILE, BASE_IMAGE

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
    return image_resolver(extra_ca_certs=[], **kwargs)


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


async def test_a_failed_build_reports_the_tail_of_its_log(tmp_path):
    context = environment_dir(tmp_path, "FROM debian:bookworm-slim\nRUN echo the-step-that-breaks && exit 3\n")
    with pytest.raises(ImageBuildError, match="the-step-that-breaks") as failed:
        await fresh_resolver().ensure_built(context, "broken", timeout_sec=120)
    assert failed.value.log_path is not None and "the-step-that-breaks" in failed.value.log_path.read_text()


@pytest.mark.slow
async def test_apt_and_pip_work_behind_the_hosts_intercepting_proxy(make_environment):
    """This machine's HTTPS egress needs its extra CA: given to the build (and kept for the trial)."""
    env = make_environment(
        dockerfile=BASE_DOCKERFILE
        + "RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pip >/dev/null\n"
        + "RUN pip install --quiet --break-system-packages --no-cache-dir six && python3 -c 'import six'\n"
    )
    await env.start(force_build=False)
    try:
        trial_time = await env.exec("pip download --quiet --no-deps --no-cache-dir -d /tmp/wheels six && ls /tmp/wheels", timeout_sec=120)
    finally:
        await env.stop(delete=True)
    assert trial_time.return_code == 0 and "six-" in trial_time.stdout, trial_time


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
    assert shipped_stand_in("docker.io/library/ubuntu:24.04").image == "debian:bookworm"


@pytest.mark.slow
@pytest.mark.parametrize(
    "base, check, said",
    [
        ("python:3.13-slim", "python --version && pip --version && ! ls /usr/lib/python3*/EXTERNALLY-MANAGED", "not the tag's Python version"),
        ("buildpack-deps:jammy", "printf 'int main(void){return 0;}\\n' > t.c && make t && ./t && git --version && curl --version", "build tools"),
    ],
)
async def test_an_unpullable_base_gets_a_stand_in_that_does_what_tasks_expect_of_it(tmp_path, caplog, base, check, said):
    """Built once from Debian's mirror (a minute or a few, then cached by content), with a warning naming it."""
    context = environment_dir(tmp_path, f"FROM {base}\nRUN {check}\n")
    with caplog.at_level(logging.WARNING):
        await fresh_resolver().ensure_built(context, "stand-in-task", timeout_sec=1800)
    assert f"'{base}' cannot be pulled: stood in by" in caplog.text and said in caplog.text


async def test_a_fork_loop_in_a_run_step_is_held_to_the_process_limit(tmp_path):
    """podman 4.3 has no --pids-limit for builds: the build slot's cgroup holds its RUN steps to pids_limit,
    and the host keeps its processes."""
    fork_loop = (
        "RUN perl -e 'my $n = 0; for (1 .. 400) { my $child = fork(); last unless defined $child; "
        f'if ($child == 0) {{ sleep 5; exit 0 }} $n++ }} print "started $n\\n"; exit 1\'  # {uuid.uuid4().hex}\n'
    )
    context = environment_dir(tmp_path, f"FROM debian:bookworm-slim\n{fork_loop}")
    with pytest.raises(ImageBuildError) as failed:
        await fresh_resolver(pids_limit=64).ensure_built(context, "forks", timeout_sec=300)
    assert failed.value.log_path is not None
    started = re.search(r"^started (\d+)$", failed.value.log_path.read_text(), re.MULTILINE)
    assert started and int(started[1]) < 64, f"the loop ran unbounded: {started and started[0]}"
