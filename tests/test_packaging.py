"""The distribution: resolved dependency versions and the one import namespace."""

import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version
from paths import REPO


def test_resolver_trap_is_avoided_s3fs_and_fsspec_are_modern_and_matched():
    # Without a direct lower bound the resolver fell back to s3fs 0.4.2 (no endpoint_url).
    assert Version(version("s3fs")) >= Version("2024.6")
    assert version("s3fs") == version("fsspec"), "s3fs pins the fsspec release it was built for"


def test_the_pinned_framework_lines():
    assert Version(version("prefect")).major == 3
    assert Version("0.25") <= Version(version("harbor")) < Version("0.26")


def test_spine_folders_import_under_one_namespace():
    import prefect_harbor.blocks
    import prefect_harbor.deployments
    import prefect_harbor.flows
    import prefect_harbor.sandbox
    import prefect_harbor.tasks

    for module, folder in [(prefect_harbor.flows, "flows"), (prefect_harbor.tasks, "tasks"), (prefect_harbor.sandbox, "sandbox")]:
        assert Path(module.__file__).parent == REPO / folder


@pytest.mark.integration
def test_the_wheel_installs_nothing_generic_at_the_top_level(tmp_path):
    subprocess.run(
        [str(Path(sys.executable).parent / "uv"), "build", "--wheel", "--out-dir", str(tmp_path), str(REPO)],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("prefect_harbor-*.whl")
    top_level = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert top_level == {"prefect_harbor", f"prefect_harbor-{version('prefect-harbor')}.dist-info"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "prefect_harbor/sandbox/containers.conf" in names
    # Every module of the source tree ships: a new subpackage left out of pyproject.toml's list is
    # importable in the editable install the tests use, and missing from the wheel users install.
    sources = {f"prefect_harbor/{path.relative_to(REPO / 'prefect_harbor')}" for path in (REPO / "prefect_harbor").rglob("*.py")}
    for spine in ("flows", "tasks", "blocks", "deployments", "sandbox"):
        sources |= {f"prefect_harbor/{path.relative_to(REPO)}" for path in (REPO / spine).rglob("*.py")}
    assert sorted(sources - set(names)) == []
