"""Dockerfile lines through which the builder itself would reach the host: rewritten or refused before a build."""

import pytest

from prefect_harbor.sandbox.build_guard import Guarded, UnsafeDockerfileError, guard, url_file_name
from prefect_harbor.sandbox.dockerfile import lower_heredocs

ESCAPE = """\
FROM debian:bookworm-slim AS linkstage
RUN ln -s / /rootdir
FROM debian:bookworm-slim
RUN --mount=type=bind,from=linkstage,source=/rootdir,target=/hostroot cat /hostroot/etc/shadow > /stolen
"""


def test_a_mount_from_a_stage_is_taken_from_a_copy_made_inside_that_stage(tmp_path):
    text = guard(ESCAPE, tmp_path, "k").text
    assert "FROM scratch AS prefect-harbor-mount-k-0\nCOPY --from=linkstage /rootdir /mounted\n" in text
    assert "RUN --mount=type=bind,from=prefect-harbor-mount-k-0,source=/mounted,target=/hostroot cat /hostroot/etc/shadow" in text
    assert text.index("COPY --from=linkstage") > text.index("RUN ln -s / /rootdir"), "the copy must come after the stage it copies"


def test_a_writable_mount_keeps_rw_and_a_cache_mount_from_a_stage_is_lowered_too(tmp_path):
    dockerfile = ESCAPE.replace("target=/hostroot", "target=/hostroot,rw") + "RUN --mount=type=cache,from=linkstage,src=/rootdir,target=/c ls /c\n"
    text = guard(dockerfile, tmp_path, "k").text
    assert "from=prefect-harbor-mount-k-0,source=/mounted,target=/hostroot,rw cat" in text
    assert "RUN --mount=type=cache,from=prefect-harbor-mount-k-1,target=/c,id=prefect-harbor-k-/c,source=/mounted ls /c" in text


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


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
async def test_check_refuses_an_unsafe_dockerfile_without_building(tmp_path):
    """`prefect-harbor check` (build=False) names the line, as prewarm would, before anything is built."""
    from prefect_harbor.sandbox import ImageBuildError
    from prefect_harbor.sandbox.images import image_resolver

    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM debian:bookworm-slim\nRUN --network=host true\n")
    with pytest.raises(ImageBuildError, match=r"Dockerfile: line 2: RUN --network=host"):
        await image_resolver(extra_ca_certs=[]).ensure_built(context, "unsafe", timeout_sec=60, build=False)


# Shapes BuildKit's parser (and buildah's) reads differently from a line-by-line reader (issue 39).
COMMENT_IN_CONTINUATION = """\
FROM debian:bookworm-slim AS l
RUN ln -s / /r && echo unique
FROM debian:bookworm-slim
RUN \\
# c
 --mount=type=bind,from=l,source=/r,target=/h,rw sh -c 'cat /h/root/secret'
"""


@pytest.mark.parametrize(
    "dockerfile",
    [
        COMMENT_IN_CONTINUATION,
        COMMENT_IN_CONTINUATION.replace("# c\n", "\n"),  # a blank line inside the continuation
        COMMENT_IN_CONTINUATION.replace("# c\n", "   \n# c\n\n"),
    ],
    ids=["comment", "blank", "both"],
)
def test_a_mount_behind_a_comment_or_blank_line_in_a_continuation_is_lowered(tmp_path, dockerfile):
    text = guard(dockerfile, tmp_path, "k").text
    assert "COPY --from=l /r /mounted" in text
    assert "RUN --mount=type=bind,from=prefect-harbor-mount-k-0,source=/mounted,target=/h,rw sh -c 'cat /h/root/secret'" in text
    assert "from=l,source=/r" not in text and len(text.splitlines()) == len(dockerfile.splitlines()) + 2, "the old physical lines are blanked"


def test_a_file_with_an_escape_directive_is_refused_where_it_needs_a_rewrite_and_kept_where_not(tmp_path):
    escaped = "# escape=`\n" + COMMENT_IN_CONTINUATION.replace("\\\n", "`\n")
    with pytest.raises(UnsafeDockerfileError, match=r"line 5: RUN must be rewritten .* '# escape=`' directive"):
        guard(escaped, tmp_path, "k")
    with pytest.raises(UnsafeDockerfileError, match="line 3: ADD must be rewritten"):
        guard("# escape=`\nFROM debian:bookworm-slim\nADD http`://127.0.0.1:4200/x /q\n", tmp_path, "k")
    plain = "# escape=`\nFROM debian:bookworm-slim\nRUN echo C:\\ `\n && true\n"
    assert guard(plain, tmp_path, "k").text == plain


@pytest.mark.parametrize(
    "line,url",
    [
        ('ADD "http://127.0.0.1:4200/api/x" /q', "http://127.0.0.1:4200/api/x"),
        ("ADD 'http://127.0.0.1:4200/api/x' /q", "http://127.0.0.1:4200/api/x"),
        ("ADD http\\://127.0.0.1:4200/api/x /q", "http://127.0.0.1:4200/api/x"),
        ("ADD \\\n# c\n http://127.0.0.1:4200/api/x /q", "http://127.0.0.1:4200/api/x"),
        # A v4-mapped IPv6 literal stays a URL, fetched (and refused) by remote_sources, not by the builder.
        ('ADD "http://[::ffff:127.0.0.1]:4200/x" /q', "http://[::ffff:127.0.0.1]:4200/x"),
    ],
    ids=["double-quoted", "single-quoted", "escaped-colon", "after-comment", "mapped-ipv6"],
)
def test_an_add_url_is_seen_as_the_builder_reads_it(tmp_path, line, url):
    guarded = guard(f"FROM debian:bookworm-slim\n{line}\n", tmp_path, "k")
    assert guarded.downloads == [("prefect-harbor-add-0", "x", url)]
    assert "\nCOPY --from=prefect-harbor-add-0 x /q\n" in guarded.text and "ADD" not in guarded.text


@pytest.mark.parametrize(
    "line,refusal",
    [
        ('ADD ["\\"http://127.0.0.1:4200/x\\"", "/x"]', "JSON form"),
        ("ADD git@github.com:acme/tool.git /src", "a git repository"),
        ("ADD https://github.com/acme/tool.git#main /src", "a git repository"),
        ('ADD "git://github.com/acme/tool" /src', "only http"),
        ("ADD ftp\\://example.com/x /x", "only http"),
        ("RUN --mount=$M cat /h/x", r"RUN --mount=\$M: a variable in a RUN flag"),
        ('RUN --mount=type=bind,from=0,\\"source=/r,/x\\",target=/h true', "quotes inside a mount"),
        ("ONBUILD RUN --mount=type=bind,from=0,source=/r,target=/h true", "ONBUILD RUN would run unguarded"),
        ("ONBUILD ADD http://127.0.0.1:4200/x /x", "ONBUILD ADD would run unguarded"),
    ],
)
def test_remote_sources_and_flags_the_guard_cannot_rewrite_are_refused(tmp_path, line, refusal):
    with pytest.raises(UnsafeDockerfileError, match=f"line 2: .*{refusal}"):
        guard(f"FROM debian:bookworm-slim\n{line}\n", tmp_path, "k")


def test_a_json_form_run_keeps_its_form_when_its_mount_is_lowered(tmp_path):
    text = guard('FROM debian:bookworm-slim AS l\nFROM debian:bookworm-slim\nRUN --mount=type=bind,from=l,target=/h ["cat", "/h/x"]\n', tmp_path, "k").text
    assert 'RUN --mount=type=bind,from=prefect-harbor-mount-k-0,target=/h,source=/mounted ["cat", "/h/x"]' in text


def test_a_heredoc_body_is_no_instruction_and_hides_none(tmp_path):
    """Decoy text in a body is body; a heredoc after other words (``cat <<EOF``) is lowered too, so buildah,
    which reads no heredocs, does not run its body as instructions the guard never saw."""
    decoy = "FROM debian:bookworm-slim AS l\nFROM debian:bookworm-slim\nRUN cat <<EOF > /x\nRUN --mount=type=bind,from=l,target=/h true\nADD http://127.0.0.1:4200/x /q\nEOF\n"
    lowered = lower_heredocs(decoy)
    assert guard(lowered, tmp_path, "k") == Guarded(text=lowered)
    assert len(lowered.splitlines()) == 3 and "base64 -d" in lowered
    hidden = "FROM debian:bookworm-slim\nRUN echo \\\n <<EOF\nADD http://127.0.0.1:4200/x /q\nEOF\n"
    assert "ADD" not in lower_heredocs(hidden)
    with pytest.raises(UnsafeDockerfileError, match="line 2: a heredoc reached the guard unlowered"):
        guard(hidden, tmp_path, "k")


def test_the_same_mount_in_two_images_mounts_stages_named_by_each_image(tmp_path):
    """buildah's layer cache keys a RUN by its text: two tasks' identical RUN lines must differ when what they mount does."""
    first, second = (guard(COMMENT_IN_CONTINUATION, tmp_path, key).text for key in ("aaa", "bbb"))
    run = [line for line in first.splitlines() if line.startswith("RUN --mount")]
    assert run and run != [line for line in second.splitlines() if line.startswith("RUN --mount")]
    assert "from=prefect-harbor-mount-aaa-0" in first and "from=prefect-harbor-mount-bbb-0" in second


def test_a_cache_mount_whose_id_or_target_climbs_out_is_refused(tmp_path):
    for spec in ("type=cache,target=/../../../e", "type=cache,id=../pip,target=/root/.cache"):
        with pytest.raises(UnsafeDockerfileError, match="may not contain '..'"):
            guard(f"FROM debian\nRUN --mount={spec} true\n", tmp_path, "k")


def test_cache_mounts_are_named_by_the_environment_when_a_cache_key_is_given(tmp_path):
    """A rebuild after an edit (a new image key) keeps its cache; stages added for mounts stay named by content."""
    dockerfile = "FROM debian:bookworm-slim AS l\nFROM debian:bookworm-slim\nRUN --mount=type=cache,target=/c --mount=type=bind,from=l,target=/h true\n"
    before, after = (guard(dockerfile, tmp_path, image_key, "env-1").text for image_key in ("content-1", "content-2"))
    assert "id=prefect-harbor-env-1-/c" in before and "id=prefect-harbor-env-1-/c" in after
    assert "prefect-harbor-mount-content-1-0" in before and "prefect-harbor-mount-content-2-0" in after
