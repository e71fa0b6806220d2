"""Bundle builds: Osmosis's wheel contract, the content-addressed cache, and every refusal by name."""

from __future__ import annotations

import dataclasses
import shutil
import zipfile
from pathlib import Path

import pytest
from paths import OSMOSIS_PROJECT

from prefect_harbor.agents import pyenvs
from prefect_harbor.agents.bundles import BundleError, BundleSpec, build_bundle, check_bundle_imports, inspect_bundle, project_dir_for, shim_source
from prefect_harbor.agents.pyenvs import prepare_env
from prefect_harbor.config import ConfigurationError

PROJECT = OSMOSIS_PROJECT
SPEC = BundleSpec(
    code_dir=PROJECT,
    workflow="arithmetic_agent.workflow:ArithmeticWorkflow",
    grader="arithmetic_agent.grader:ExactMatchGrader",
    workflow_config="arithmetic_agent.config:workflow_config",
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A private copy of the example project, free to be edited."""
    return Path(shutil.copytree(PROJECT, tmp_path / "project"))


def test_a_bundle_carries_the_osmosis_entry_points_and_requirements(project: Path, tmp_path: Path):
    bundle, cached = build_bundle(dataclasses.replace(SPEC, code_dir=project), tmp_path / "cache")
    assert not cached
    assert (bundle.agent_script, bundle.grader_script) == ("arithmetic-agent-agent", "arithmetic-agent-grade")
    assert any(r.startswith("osmosis-ai") for r in bundle.requirements)
    shim = zipfile.ZipFile(bundle.wheel).read("arithmetic_agent/bundle_main.py").decode()
    assert "from arithmetic_agent.workflow import ArithmeticWorkflow as _bundled_workflow" in shim
    assert "runner.agent_main(_bundled_workflow, _bundled_workflow_config)" in shim
    assert "runner.grader_main(_bundled_grader, None)" in shim


def test_an_unchanged_project_is_a_cache_hit_and_a_change_rebuilds(project: Path, tmp_path: Path):
    spec = dataclasses.replace(SPEC, code_dir=project)
    first, _ = build_bundle(spec, tmp_path / "cache")
    again, cached = build_bundle(spec, tmp_path / "cache")
    assert cached and again.wheel == first.wheel
    (project / "arithmetic_agent" / "extra.py").write_text("VALUE = 1\n")
    changed, cached = build_bundle(spec, tmp_path / "cache")
    assert not cached and changed.wheel != first.wheel


def test_a_different_binding_is_a_different_bundle():
    grader_only = dataclasses.replace(SPEC, workflow=None, workflow_config=None)
    assert "agent_main" in shim_source(SPEC) and "agent_main" not in shim_source(grader_only)


def test_no_pyproject_is_refused(tmp_path: Path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    with pytest.raises(BundleError, match="has no pyproject.toml"):
        build_bundle(dataclasses.replace(SPEC, code_dir=tmp_path), tmp_path / "cache")


def test_several_packages_are_refused(project: Path, tmp_path: Path):
    (project / "second").mkdir()
    (project / "second" / "__init__.py").write_text("")
    with pytest.raises(BundleError, match=r"exactly one Python package .* found \['arithmetic_agent', 'second'\]"):
        build_bundle(dataclasses.replace(SPEC, code_dir=project), tmp_path / "cache")


def test_a_symlink_in_the_project_is_refused(project: Path, tmp_path: Path):
    (project / "link.py").symlink_to(project / "arithmetic_agent" / "config.py")
    with pytest.raises(BundleError, match="link.py is a symlink"):
        build_bundle(dataclasses.replace(SPEC, code_dir=project), tmp_path / "cache")


def test_a_failed_build_reports_uv_output(project: Path, tmp_path: Path):
    pyproject = project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('build-backend = "setuptools.build_meta"', 'build-backend = "no_such_backend"'))
    with pytest.raises(BundleError, match=r"(?s)`uv build` of .* failed \(exit \d+\):\n.*No module named .no_such_backend"):
        build_bundle(dataclasses.replace(SPEC, code_dir=project), tmp_path / "cache")


def test_uv_missing_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch):
    import uv

    def missing() -> str:
        raise FileNotFoundError

    monkeypatch.setattr(uv, "find_uv_bin", missing)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigurationError, match="uv is not installed: install it with `pip install uv`"):
        pyenvs.uv_binary()


def test_a_wheel_without_runner_scripts_is_not_a_bundle(tmp_path: Path):
    wheel = tmp_path / "plain-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("plain-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: plain\nVersion: 1.0\n")
    with pytest.raises(BundleError, match="is not a workflow bundle"):
        inspect_bundle(wheel)
    with pytest.raises(BundleError, match="is not a wheel file"):
        inspect_bundle(tmp_path / "missing.whl")


def test_the_project_is_inferred_from_the_workflow_without_importing_it(project: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(project))
    assert project_dir_for("arithmetic_agent.workflow:ArithmeticWorkflow", "agent") == project
    with pytest.raises(BundleError, match="cannot locate package 'no_such_package'.*pass code_dir"):
        project_dir_for("no_such_package.mod:Workflow", "agent")
    with pytest.raises(BundleError, match="is not an import path"):
        project_dir_for("arithmetic_agent.workflow", "agent")


@pytest.mark.integration
def test_imports_are_checked_in_the_bundle_environment(tmp_path: Path):
    """An unresolvable config, or a class of the wrong kind, fails before any trial."""
    bundle, _ = build_bundle(SPEC, tmp_path / "cache")
    env, _ = prepare_env(bundle.requirements)
    check_bundle_imports(bundle, env, SPEC)
    wrong = dataclasses.replace(SPEC, workflow="arithmetic_agent.grader:ExactMatchGrader", grader_config="arithmetic_agent.config:missing")
    with pytest.raises(BundleError) as raised:
        check_bundle_imports(bundle, env, wrong)
    assert "workflow: 'arithmetic_agent.grader:ExactMatchGrader' is not an osmosis AgentWorkflow subclass" in str(raised.value)
    assert "grader_config: 'arithmetic_agent.config:missing' cannot be imported" in str(raised.value)
