"""Reading and rewriting Dockerfiles: references, FROM lines, pinning, heredoc lowering."""

import base64

import pytest

from prefect_harbor.sandbox.bootstrap import debian_suite
from prefect_harbor.sandbox.dockerfile import (
    EMPTY_STAGE,
    copy_from_images,
    create_workdirs,
    external_bases,
    lower_heredocs,
    parse_from_lines,
    pin_bases,
    pin_copy_sources,
    with_arg_defaults,
)  # fmt: skip
from prefect_harbor.sandbox.images import bootstrapped_name, normalize_reference


@pytest.mark.parametrize(
    ("written", "normalized"),
    [
        ("debian:bookworm", "docker.io/library/debian:bookworm"),
        ("ubuntu", "docker.io/library/ubuntu:latest"),
        ("acme/tool:1", "docker.io/acme/tool:1"),
        ("ghcr.io/acme/tool", "ghcr.io/acme/tool:latest"),
        ("localhost:5000/x:2", "localhost:5000/x:2"),
        ("python@sha256:abc", "docker.io/library/python@sha256:abc"),
    ],
)
def test_references_read_as_docker_reads_them(written, normalized):
    assert normalize_reference(written) == normalized


def test_bootstrapped_bases_live_under_a_registry_nobody_pulls_from():
    assert bootstrapped_name("debian:bookworm-slim") == "prefect-harbor.local/library/debian:bookworm-slim"


def test_from_lines_with_platform_stages_and_global_args():
    text = "ARG BASE=python:3.13-slim\n# comment\nFROM --platform=linux/amd64 $BASE AS build\nRUN x \\\n  y\nFROM build\nFROM scratch\nFROM ${BASE}\n"
    froms = parse_from_lines(text)
    assert [(f.image, f.stage, f.platform) for f in froms] == [
        ("python:3.13-slim", "build", "linux/amd64"), ("build", None, None), ("scratch", None, None), ("python:3.13-slim", None, None),
    ]  # fmt: skip
    assert external_bases(froms) == ["python:3.13-slim"]


@pytest.mark.parametrize(("text", "reason"), [("FROM\n", "cannot read 'FROM'"), ("ARG B\nFROM $B AS x\n", "names no image")])
def test_a_from_line_it_cannot_pin_is_an_error_not_skipped(text, reason):
    """Skipped, it would reach the build unpinned, and the build would ask a registry for it."""
    with pytest.raises(ValueError, match=reason):
        parse_from_lines(text)


def test_pinning_rewrites_only_external_bases_and_keeps_the_rest():
    text = "FROM ubuntu:24.04 AS build\nRUN make\nFROM build\nCOPY --from=build /a /a\n"
    pinned = pin_bases(text, {"ubuntu:24.04": "prefect-harbor.local/library/debian:bookworm"}, ["RUN add-ca"])
    assert pinned.splitlines() == [
        "FROM prefect-harbor.local/library/debian:bookworm AS build", "RUN add-ca", "RUN make", "FROM build", "COPY --from=build /a /a",
    ]  # fmt: skip


def test_heredocs_are_lowered_to_plain_instructions():
    text = "FROM x\nRUN <<EOT\necho one\necho two\nEOT\nRUN <<EOT python3\nprint(1)\nEOT\nCOPY --chown=a:a --chmod=600 <<'EOF' /etc/app.conf\nkey=$VALUE\nEOF\nUSER a\n"
    lowered = lower_heredocs(text).splitlines()
    assert lowered[0] == "FROM x" and lowered[-1] == "USER a" and len(lowered) == 5

    def body(line: str) -> str:
        return base64.b64decode(line.split("echo ", 1)[1].split(" ", 1)[0]).decode()

    assert lowered[1].startswith('RUN eval "$(echo ') and body(lowered[1]) == "echo one\necho two\n"
    assert lowered[2].endswith("| base64 -d | python3") and body(lowered[2]) == "print(1)\n"
    assert body(lowered[3]) == "key=$VALUE\n"  # a quoted delimiter: no expansion
    assert "chown a:a /etc/app.conf" in lowered[3] and "chmod 600 /etc/app.conf" in lowered[3]


def test_every_workdir_of_the_final_stage_is_followed_by_a_copy_that_creates_it_as_the_user_in_effect():
    text = "FROM debian AS build\nUSER agent\nWORKDIR /b\nFROM build\nWORKDIR /a\nUSER root\nWORKDIR /c\nUSER 1000:1000\nWORKDIR d\nUSER agent\n"
    assert create_workdirs(text).splitlines() == [
        "FROM debian AS build", "USER agent", "WORKDIR /b",  # an earlier stage's WORKDIR is left alone
        f"FROM scratch AS {EMPTY_STAGE}",
        "FROM build", "WORKDIR /a", f"COPY --from={EMPTY_STAGE} --chown=agent . ./",  # the USER the final stage inherits
        "USER root", "WORKDIR /c", f"COPY --from={EMPTY_STAGE} . ./",
        "USER 1000:1000", "WORKDIR d", f"COPY --from={EMPTY_STAGE} --chown=1000:1000 . ./",
        "USER agent",
    ]  # fmt: skip
    assert create_workdirs("FROM debian\nRUN true\n") == "FROM debian\nRUN true\n"


def test_copy_from_and_mount_from_an_image_that_is_no_stage_are_found_and_pinned_like_a_base():
    text = (
        "FROM debian:bookworm AS build\nFROM debian:bookworm\n"
        "COPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx /bin/\n"
        "COPY --from=build /a /a\nCOPY --from=0 /b /b\nCOPY --chown=1 --from=BUILD /c /c\nCOPY --from=${IMG} /d /d\nCOPY x y\n"
        "RUN --mount=type=cache,target=/c --mount=type=bind,from=ghcr.io/astral-sh/uv:0.8.15,source=/uv,target=/u /u --version\n"
        "RUN --mount=from=build,source=/a,target=/a true\n"
    )
    assert copy_from_images(text, parse_from_lines(text)) == ["ghcr.io/astral-sh/uv:0.8.15"]
    pinned = pin_copy_sources(text, {"ghcr.io/astral-sh/uv:0.8.15": "localhost/prefect-harbor/task:abc"})
    assert "COPY --from=localhost/prefect-harbor/task:abc /uv /uvx /bin/" in pinned.splitlines()
    assert "RUN --mount=type=cache,target=/c --mount=type=bind,from=localhost/prefect-harbor/task:abc,source=/uv,target=/u /u --version" in pinned
    assert pinned.replace("localhost/prefect-harbor/task:abc", "ghcr.io/astral-sh/uv:0.8.15") == text


def test_global_arg_defaults_are_set_as_build_args_would_set_them():
    text = "ARG SUITE=bookworm\nFROM debian:${SUITE}-slim\nARG SUITE=inner\n"
    assert with_arg_defaults(text, {"SUITE": "trixie"}) == "ARG SUITE=trixie\nFROM debian:${SUITE}-slim\nARG SUITE=inner\n"
    assert parse_from_lines(with_arg_defaults(text, {"SUITE": "trixie"}))[0].image == "debian:trixie-slim"
    with pytest.raises(ValueError, match="no global ARG OTHER"):
        with_arg_defaults(text, {"OTHER": "x"})


@pytest.mark.parametrize(
    ("reference", "suite"),
    [
        ("debian:bullseye-slim", "bullseye"), ("debian:13.0-slim", "trixie"), ("debian:12", "bookworm"), ("docker.io/library/debian:latest", "stable"),
        ("debian:bookworm-20240110-slim", None), ("ubuntu:24.04", None), ("debian:99-slim", None),
    ],
)  # fmt: skip
def test_debian_references_name_the_suite_debootstrap_makes(reference, suite):
    assert debian_suite(reference) == suite


def test_from_lines_are_read_as_the_builder_reads_them_with_an_escape_directive_and_comments_in_continuations():
    """A FROM read wrongly would be pinned wrongly, and the build would ask a registry for it."""
    text = '# escape=`\nARG BASE="debian:bookworm"\nFROM `\n# a comment\n $BASE `\n\n AS build\nFROM "debian:bookworm-slim"\nRUN echo C:\\\n'
    froms = parse_from_lines(text)
    assert [(f.index, f.end, f.image, f.stage) for f in froms] == [(2, 6, "debian:bookworm", "build"), (7, 7, "debian:bookworm-slim", None)]
    pinned = pin_bases(text, {"debian:bookworm": "local/a", "debian:bookworm-slim": "local/b"})
    assert pinned.splitlines()[2:] == ["FROM local/a AS build", "FROM local/b", "RUN echo C:\\"]


def test_an_image_mounted_behind_a_comment_in_a_continuation_is_found_and_pinned():
    text = 'FROM debian:bookworm\nRUN \\\n# c\n --mount=type=bind,from=ghcr.io/acme/uv:1,source=/uv,target=/u /u\nCOPY --from="ghcr.io/acme/uv:1" /uv /uv\n'
    assert copy_from_images(text, parse_from_lines(text)) == ["ghcr.io/acme/uv:1"]
    pinned = pin_copy_sources(text, {"ghcr.io/acme/uv:1": "localhost/p/task:abc"})
    assert "ghcr.io" not in pinned and pinned.splitlines()[1:] == [
        "RUN --mount=type=bind,from=localhost/p/task:abc,source=/uv,target=/u /u", "", "", "COPY --from=localhost/p/task:abc /uv /uv",
    ]  # fmt: skip


def test_heredocs_the_parser_finds_anywhere_in_an_instruction_are_lowered():
    """buildah 1.28 reads no heredocs: a body left in the file would be read by it as instructions."""
    text = "FROM x\nRUN cat <<EOF > /a \\\n && cat <<-'B' > /b\n$x\nEOF\n\tb\n\tB\nCOPY <<ONE <<TWO /d/\none\nONE\ntwo\nTWO\n"
    lowered = lower_heredocs(text).splitlines()
    assert len(lowered) == 3 and not any("<<" in line for line in lowered)
    script = base64.b64decode(lowered[1].split("echo ", 1)[1].split(" ", 1)[0]).decode()
    assert script == "cat <<EOF > /a  && cat <<-'B' > /b\n$x\nEOF\n\tb\nB\n"  # the shell reads the heredocs itself
    assert "> /d/ONE" in lowered[2] and "> /d/TWO" in lowered[2]
