"""Dockerfile lines through which the builder itself would reach the host: rewritten or refused before a build."""

import pytest

from prefect_harbor.sandbox.build_guard import Guarded, UnsafeDockerfileError, guard, url_file_name

ESCAPE = """\
FROM debian:bookworm-slim AS linkstage
RUN ln -s / /rootdir
FROM debian:bookworm-slim
RUN --mount=type=bind,from=linkstage,source=/rootdir,target=/hostroot cat /hostroot/etc/shadow > /stolen
"""


def test_a_mount_from_a_stage_is_taken_from_a_copy_made_inside_that_stage(tmp_path):
    text = guard(ESCAPE, tmp_path, "k").text
    assert "FROM scratch AS prefect-harbor-mount-0\nCOPY --from=linkstage /rootdir /mounted\n" in text
    assert "RUN --mount=type=bind,from=prefect-harbor-mount-0,source=/mounted,target=/hostroot cat /hostroot/etc/shadow" in text
    assert text.index("COPY --from=linkstage") > text.index("RUN ln -s / /rootdir"), "the copy must come after the stage it copies"


def test_a_writable_mount_keeps_rw_and_a_cache_mount_from_a_stage_is_lowered_too(tmp_path):
    dockerfile = ESCAPE.replace("target=/hostroot", "target=/hostroot,rw") + "RUN --mount=type=cache,from=linkstage,src=/rootdir,target=/c ls /c\n"
    text = guard(dockerfile, tmp_path, "k").text
    assert "from=prefect-harbor-mount-0,source=/mounted,target=/hostroot,rw cat" in text
    assert "RUN --mount=type=cache,from=prefect-harbor-mount-1,target=/c,id=prefect-harbor-k-/c,source=/mounted ls /c" in text


def test_numbered_stage_references_keep_pointing_at_their_stage_when_stages_are_inserted(tmp_path):
    dockerfile = "FROM debian:bookworm-slim\nRUN touch /a\nFROM debian:bookworm-slim\nRUN --mount=type=bind,from=0,target=/m ls /m\nCOPY --from=0 /a /a\n"
    text = guard(dockerfile, tmp_path, "k").text
    assert "FROM debian:bookworm-slim AS prefect-harbor-stage-0" in text
    assert "COPY --from=prefect-harbor-stage-0 / /mounted" in text and "COPY --from=prefect-harbor-stage-0 /a /a" in text


def test_cache_mounts_are_private_to_the_image_being_built(tmp_path):
    text = guard("FROM debian:bookworm-slim\nRUN --mount=type=cache,target=/root/.cache/pip pip install six\n", tmp_path, "abc").text
    assert "RUN --mount=type=cache,target=/root/.cache/pip,id=prefect-harbor-abc-/root/.cache/pip pip install six" in text


def test_a_context_mount_is_kept_unless_its_source_leaves_the_context(tmp_path):
    (tmp_path / "requirements.txt").write_text("six\n")
    (tmp_path / "out").symlink_to("/")
    kept = "FROM debian:bookworm-slim\nRUN --mount=type=bind,source=requirements.txt,target=/r.txt cat /r.txt\n"
    assert guard(kept, tmp_path, "k").text == kept
    with pytest.raises(UnsafeDockerfileError, match="line 2: RUN --mount source 'out/etc' resolves outside the build context"):
        guard("FROM debian:bookworm-slim\nRUN --mount=type=bind,source=out/etc,target=/e cat /e/shadow\n", tmp_path, "k")


@pytest.mark.parametrize("flag", ["--network=host", "--security=insecure"])
def test_run_flags_that_leave_the_builds_network_or_privileges_are_refused(tmp_path, flag):
    with pytest.raises(UnsafeDockerfileError, match=f"line 2: RUN {flag} would take the step out"):
        guard(f"FROM debian:bookworm-slim\nRUN {flag} true\n", tmp_path, "k")


def test_add_of_urls_becomes_a_copy_of_their_downloads(tmp_path):
    guarded = guard("FROM debian:bookworm-slim\nADD --chown=1:1 https://example.com/a/tool.tar.gz /opt/\nADD http://example.com/x?y=1 /opt/x\nADD local.txt /l\n", tmp_path, "k")
    assert "COPY --from=prefect-harbor-add-0 --chown=1:1 tool.tar.gz /opt/\nCOPY --from=prefect-harbor-add-1 x /opt/x\nADD local.txt /l\n" in guarded.text
    assert guarded.downloads == [("prefect-harbor-add-0", "tool.tar.gz", "https://example.com/a/tool.tar.gz"), ("prefect-harbor-add-1", "x", "http://example.com/x?y=1")]


@pytest.mark.parametrize(
    "line,refusal",
    [
        ('ADD ["http://127.0.0.1:4200/api", "/x"]', "JSON form"),
        ("ADD http://a.example/x local.txt /d/", "mixes URLs and local files"),
        ("ADD http://a.example/x http://a.example/y /d", "needs a destination folder"),
        # An ARG (or ENV) that names a URL: the builder would fetch it from the host's loopback (seen in a red-team run).
        ("ADD ${U1} /attack/a.txt", r"ADD \$\{U1\}: a source named through a variable may be a URL"),
        ("ADD --chown=1:1 $U2 /attack/", r"ADD \$U2: a source named through a variable"),
        ('ADD ["${U3}", "/x"]', r"ADD \$\{U3\}: a source named through a variable"),
    ],
)
def test_add_lines_that_cannot_be_rewritten_are_refused_naming_the_line(tmp_path, line, refusal):
    with pytest.raises(UnsafeDockerfileError, match=f"line 2: .*{refusal}"):
        guard(f"FROM debian:bookworm-slim\n{line}\n", tmp_path, "k")


def test_a_urls_file_name_is_its_last_plain_path_part():
    assert url_file_name("https://example.com/a/b.tar.gz?x=1#f") == "b.tar.gz"
    assert url_file_name("https://example.com/") == "" and url_file_name("https://example.com") == ""
    assert url_file_name("https://example.com/a/%2e%2e") == ""


def test_an_ordinary_dockerfile_is_left_as_it_is(tmp_path):
    plain = "FROM debian:bookworm-slim AS build\nRUN apt-get update\nFROM debian:bookworm-slim\nCOPY --from=build /etc/os-release /x\nCOPY . /app\nWORKDIR /app\n"
    assert guard(plain, tmp_path, "k") == Guarded(text=plain)


async def test_check_refuses_an_unsafe_dockerfile_without_building(tmp_path):
    """`prefect-harbor check` (build=False) names the line, as prewarm would, before anything is built."""
    from prefect_harbor.sandbox import ImageBuildError
    from prefect_harbor.sandbox.images import image_resolver

    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM debian:bookworm-slim\nRUN --network=host true\n")
    with pytest.raises(ImageBuildError, match=r"Dockerfile: line 2: RUN --network=host"):
        await image_resolver(extra_ca_certs=[]).ensure_built(context, "unsafe", timeout_sec=60, build=False)
