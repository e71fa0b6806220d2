"""How the sandbox reads a task's Dockerfile: honoured, ignored and refused lines."""

from pathlib import Path


from prefect_harbor.sandbox.dockerfile import UnsupportedDockerfileError, parse_dockerfile


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return path


def test_workdir_env_user_and_args_are_honoured(tmp_path):
    runtime = parse_dockerfile(
        write(
            tmp_path,
            "ARG BASE=/srv\n"
            "FROM debian:bookworm-slim AS final\n"
            "# a comment\n"
            "ENV A=1 B=\"two words\" \\\n"
            "    C=${BASE}/c\n"
            "ENV LEGACY value with spaces\n"
            "WORKDIR /app\n"
            "WORKDIR sub\n"
            "USER nobody\n"
            "LABEL x=y\nEXPOSE 80\nCMD [\"bash\"]\n",
        )
    )
    assert runtime.base_image == "debian:bookworm-slim"
    assert runtime.env == {"A": "1", "B": "two words", "C": "/srv/c", "LEGACY": "value with spaces"}
    assert runtime.workdir == "/app/sub"
    assert runtime.user == "nobody"
    assert runtime.unsupported == []


def test_only_the_final_stage_reaches_the_runtime(tmp_path):
    runtime = parse_dockerfile(write(tmp_path, "FROM a\nWORKDIR /one\nENV X=1\nFROM b\nWORKDIR /two\n"))
    assert (runtime.base_image, runtime.workdir, runtime.env) == ("b", "/two", {})


def test_filesystem_changing_lines_are_listed_with_their_line_numbers(tmp_path):
    runtime = parse_dockerfile(
        write(tmp_path, "FROM debian\nRUN apt-get update && \\\n    apt-get install -y tmux\nCOPY . /app\nWORKDIR /app\n")
    )
    assert [(i.line, i.keyword) for i in runtime.unsupported] == [(2, "RUN"), (4, "COPY")]
    message = str(UnsupportedDockerfileError(tmp_path / "Dockerfile", runtime.unsupported))
    assert "line 2: RUN apt-get update" in message
    assert "line 4: COPY . /app" in message
    for alternative in ("docker", "rootfs", "ignore_unsupported_dockerfile_instructions"):
        assert alternative in message


def test_unknown_instructions_are_refused_not_ignored(tmp_path):
    runtime = parse_dockerfile(write(tmp_path, "FROM debian\nFROBNICATE now\n"))
    assert [i.keyword for i in runtime.unsupported] == ["FROBNICATE"]
