"""Prepared environments carry the host interpreter's shared libraries, and keep them to themselves."""

import os
import subprocess
import sys
from pathlib import Path

from prefect_harbor.agents.pyenvs import prepare_env, runtime_libraries


def test_the_interpreters_libraries_are_copied_without_glibc(tmp_path):
    libs = runtime_libraries(Path(sys.base_prefix), tmp_path)
    names = {p.name for p in libs.iterdir()}
    assert "libssl.so.3" in names and "libffi.so.8" in names, names
    assert not {n for n in names if n.startswith(("libc.so", "ld-linux", "libm.so"))}
    assert runtime_libraries(Path(sys.base_prefix), tmp_path) == libs, "the same interpreter must reuse one folder"


def test_the_library_path_reaches_the_interpreter_but_not_the_programs_it_starts(tmp_path):
    env, _ = prepare_env([], root=tmp_path)
    probe = "import os, ssl, subprocess; print(subprocess.run(['sh', '-c', 'echo \"$LD_LIBRARY_PATH\"'], capture_output=True, text=True).stdout.strip())"
    child = subprocess.run(
        [env.python, "-c", probe], capture_output=True, text=True, check=True,
        env={**os.environ, "LD_LIBRARY_PATH": f"{env.libs}:/task/own/libs"},
    )  # fmt: skip
    assert child.stdout.strip() == "/task/own/libs"
    assert env.library_env() == {"LD_LIBRARY_PATH": str(env.libs)}
    assert {"source": str(env.libs), "target": str(env.libs), "type": "bind", "read_only": True} in env.mounts()
