"""Workflow bundles: an Osmosis v0.3 project built into one wheel that runs in a sandbox.

The wheel follows Osmosis's bundle contract, so a bundle built here and one built by
the Osmosis SDK are interchangeable: the user's project plus a generated
``<package>/bundle_main.py`` that imports the workflow, the grader and their configs by
their ``module:attr`` paths and hands them to ``osmosis_ai.rollout.container.runner``,
exposed as the console scripts ``<package>-agent`` and ``<package>-grade``. Builds are
cached by content: an unchanged project is not rebuilt.

Nothing here imports the user's code on the host; checks that need it run in the
bundle's prepared environment (:func:`check_bundle_imports`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import PathDistribution
from pathlib import Path

import toml

from prefect_harbor.agents.pyenvs import PreparedEnv, uv_binary
from prefect_harbor.config import ConfigurationError

SHIM_MODULE = "bundle_main"
AGENT_ENTRY = f"{SHIM_MODULE}:agent_main"
GRADER_ENTRY = f"{SHIM_MODULE}:grader_main"
#: Never part of a bundle's source (and so never part of its cache key).
IGNORED_NAMES = frozenset({".git", ".hg", ".venv", "venv", "__pycache__", "build", "dist", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox"})

_SHIM_AGENT = "\n\ndef agent_main():\n    runner.agent_main({workflow}, {workflow_config})\n"
_SHIM_GRADER = "\n\ndef grader_main():\n    runner.grader_main({grader}, {grader_config})\n"


class BundleError(ConfigurationError):
    """The workflow project cannot be bundled; the message says what to change."""


@dataclass(frozen=True)
class BundleSpec:
    """What to build: a project and the import paths the bundle binds."""

    code_dir: Path
    workflow: str | None = None
    grader: str | None = None
    workflow_config: str | None = None
    grader_config: str | None = None


@dataclass(frozen=True)
class Bundle:
    """A built (or prebuilt) bundle wheel and what it provides."""

    wheel: Path
    agent_script: str | None
    grader_script: str | None
    requirements: tuple[str, ...]


def split_import_path(value: str, field: str) -> tuple[str, str]:
    module, colon, attr = value.partition(":")
    if not colon or not module or not attr or ":" in attr:
        raise BundleError(f"{field}: {value!r} is not an import path; write it as 'package.module:Name'.")
    return module, attr


def project_dir_for(import_path: str, field: str) -> Path:
    """The project (folder with pyproject.toml) holding the top-level package of ``import_path``.

    Found without importing anything: only the top-level package is located.
    """
    module, _ = split_import_path(import_path, field)
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise BundleError(f"code_dir: cannot locate package {top!r} of {field} {import_path!r} on this machine; pass code_dir (the project folder with pyproject.toml).")
    package_dir = Path(next(iter(spec.submodule_search_locations))).resolve()
    for candidate in (package_dir.parent, package_dir.parent.parent):
        if (candidate / "pyproject.toml").is_file():
            return candidate
    raise BundleError(f"code_dir: no pyproject.toml next to package {top!r} ({package_dir.parent}); pass code_dir explicitly.")


def find_package(code_dir: Path) -> str:
    """The project's one importable package (flat or ``src/`` layout)."""
    roots = [code_dir, code_dir / "src"]
    packages = sorted(
        {d.name for root in roots if root.is_dir() for d in root.iterdir() if d.is_dir() and (d / "__init__.py").is_file() and d.name not in IGNORED_NAMES}
    )
    if len(packages) != 1:
        raise BundleError(
            f"code_dir: expected exactly one Python package in {code_dir} (or its src/), found {packages or 'none'}; "
            "point code_dir at a project with one package."
        )
    return packages[0]


def _package_dir(code_dir: Path, package: str) -> Path:
    for root in (code_dir, code_dir / "src"):
        if (root / package / "__init__.py").is_file():
            return root / package
    raise BundleError(f"code_dir: package {package!r} not found in {code_dir}")


def check_project(spec: BundleSpec) -> str:
    """What can be known about a project without building it (pyproject.toml, one package); returns the package."""
    code_dir = spec.code_dir.expanduser().resolve()
    if not (code_dir / "pyproject.toml").is_file():
        raise BundleError(f"code_dir: {code_dir} has no pyproject.toml; point it at the workflow's project folder.")
    package = find_package(code_dir)
    for field in ("workflow", "grader", "workflow_config", "grader_config"):
        if getattr(spec, field):
            split_import_path(getattr(spec, field), field)
    return package


def shim_source(spec: BundleSpec) -> str:
    """The generated ``bundle_main.py``: literal imports, bound at build time."""
    imports, names = [], {}
    for field in ("workflow", "grader", "workflow_config", "grader_config"):
        value = getattr(spec, field)
        if value is None:
            names[field] = "None"
            continue
        module, attr = split_import_path(value, field)
        imports.append(f"from {module} import {attr} as _bundled_{field}")
        names[field] = f"_bundled_{field}"
    source = '"""Generated by prefect-harbor: the bundle\'s entry points."""\n\n' + "\n".join(imports)
    source += "\nfrom osmosis_ai.rollout.container import runner\n"
    if spec.workflow:
        source += _SHIM_AGENT.format(**names)
    if spec.grader:
        source += _SHIM_GRADER.format(**names)
    return source


def build_bundle(spec: BundleSpec, cache_dir: Path, logger: logging.Logger | logging.LoggerAdapter | None = None) -> tuple[Bundle, bool]:
    """Build ``spec`` into a wheel with ``uv build``, or reuse the cached one; returns it and whether it was cached."""
    log = logger or logging.getLogger(__name__)
    code_dir = spec.code_dir.expanduser().resolve()
    if spec.workflow is None and spec.grader is None:
        raise BundleError("agent: a bundle needs a workflow ('module:Class') or a grader.")
    package = check_project(spec)
    shim = shim_source(spec)
    pyproject = (code_dir / "pyproject.toml").read_text()
    try:
        project = tomllib.loads(pyproject).get("project", {})
    except tomllib.TOMLDecodeError as error:
        raise BundleError(f"code_dir: {code_dir / 'pyproject.toml'} is not valid TOML: {error}") from error
    key = _content_key(code_dir, shim, package)
    entry = cache_dir / "bundles" / key
    cached = sorted(entry.glob("*.whl"))
    if len(cached) == 1:
        log.info(f"Bundle cache hit: {cached[0].name} ({key}); {code_dir} is unchanged")
        return inspect_bundle(cached[0]), True
    uv = uv_binary()
    entry.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=entry.parent, prefix=".build-") as scratch:
        stage, output = Path(scratch) / "source", Path(scratch) / "wheel"
        shutil.copytree(code_dir, stage, ignore=shutil.ignore_patterns(*IGNORED_NAMES, "*.pyc"))
        (_package_dir(stage, package) / f"{SHIM_MODULE}.py").write_text(shim)
        staged = tomllib.loads((stage / "pyproject.toml").read_text())
        scripts = staged.setdefault("project", {}).setdefault("scripts", {})
        if spec.workflow:
            scripts[f"{_script_stem(package)}-agent"] = f"{package}.{AGENT_ENTRY}"
        if spec.grader:
            scripts[f"{_script_stem(package)}-grade"] = f"{package}.{GRADER_ENTRY}"
        (stage / "pyproject.toml").write_text(toml.dumps(staged))
        log.info(f"Building the bundle of {project.get('name', package)} from {code_dir} with uv build")
        completed = subprocess.run([str(uv), "build", "--wheel", "--out-dir", str(output), str(stage)], capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            tail = (completed.stderr or completed.stdout).strip()[-3000:]
            raise BundleError(f"code_dir: `uv build` of {code_dir} failed (exit {completed.returncode}):\n{tail}")
        wheels = sorted(output.glob("*.whl"))
        if len(wheels) != 1:
            raise BundleError(f"code_dir: uv build produced {len(wheels)} wheels for {code_dir}; expected one.")
        try:
            output.replace(entry)  # one atomic rename publishes the cache entry
        except OSError:
            if len(sorted(entry.glob("*.whl"))) != 1:  # not a concurrent builder's entry
                raise
    return inspect_bundle(next(entry.glob("*.whl"))), False


def inspect_bundle(wheel: Path) -> Bundle:
    """What a bundle wheel provides, read from its metadata; refuses a wheel that is not a bundle."""
    wheel = wheel.expanduser().resolve()
    if not wheel.is_file() or wheel.suffix != ".whl":
        raise BundleError(f"bundle: {wheel} is not a wheel file; give the path of a .whl built from the workflow project.")
    try:
        dist_info = next(e for e in zipfile.Path(wheel).iterdir() if e.name.endswith(".dist-info"))
    except (zipfile.BadZipFile, StopIteration) as error:
        raise BundleError(f"bundle: {wheel.name} is not a valid wheel ({error or 'no .dist-info'}).") from error
    distribution = PathDistribution(dist_info)
    scripts = {ep.name: ep.value for ep in distribution.entry_points if ep.group == "console_scripts"}
    agent = next((name for name, target in scripts.items() if target.endswith(f".{AGENT_ENTRY}")), None)
    grader = next((name for name, target in scripts.items() if target.endswith(f".{GRADER_ENTRY}")), None)
    if agent is None and grader is None:
        raise BundleError(f"bundle: {wheel.name} is not a workflow bundle (no '<package>-agent' or '<package>-grade' script); build it from the project instead.")
    requirements = tuple(r for r in distribution.requires or [] if "extra ==" not in r)
    return Bundle(wheel=wheel, agent_script=agent, grader_script=grader, requirements=requirements)


_CHECK_SCRIPT = """
import importlib, sys
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.grader import Grader
failures = []
for field, path, base in [a.split("=", 1) + [None] for a in sys.argv[1:]]:
    module, _, attr = path.partition(":")
    try:
        value = getattr(importlib.import_module(module), attr)
    except Exception as error:
        failures.append(f"{field}: {path!r} cannot be imported in the bundle's environment: {type(error).__name__}: {error}")
        continue
    expected = {"workflow": AgentWorkflow, "grader": Grader}.get(field)
    if expected is not None and not (isinstance(value, type) and issubclass(value, expected)):
        failures.append(f"{field}: {path!r} is not an osmosis {expected.__name__} subclass")
print("\\n".join(failures))
sys.exit(1 if failures else 0)
"""


def check_bundle_imports(bundle: Bundle, env: PreparedEnv, spec: BundleSpec) -> None:
    """Import the workflow, grader and configs where they will run: the bundle's environment.

    An unresolvable config or a class of the wrong kind fails here, before any trial.
    """
    refs = [f"{field}={getattr(spec, field)}" for field in ("workflow", "grader", "workflow_config", "grader_config") if getattr(spec, field)]
    if not refs:
        return
    completed = subprocess.run(
        [env.python, "-c", _CHECK_SCRIPT, *refs], capture_output=True, text=True, check=False, env={"PYTHONPATH": str(bundle.wheel), "PATH": "/usr/bin:/bin"}
    )
    if completed.returncode != 0:
        detail = completed.stdout.strip() or completed.stderr.strip()[-2000:]
        raise BundleError(detail)


def _script_stem(package: str) -> str:
    return package.replace("_", "-")


def _content_key(code_dir: Path, shim: str, package: str) -> str:
    digest = hashlib.sha256()
    for part in (shim, package, sys.implementation.cache_tag or ""):
        digest.update(part.encode() + b"\0")
    for path in _source_files(code_dir):
        digest.update(path.relative_to(code_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def _source_files(code_dir: Path) -> Iterator[Path]:
    for path in sorted(code_dir.rglob("*")):
        relative = path.relative_to(code_dir)
        if any(part in IGNORED_NAMES or part.endswith(".egg-info") for part in relative.parts) or path.suffix == ".pyc":
            continue
        if path.is_symlink():
            raise BundleError(f"code_dir: {relative} is a symlink; a bundle's source must be plain files (the cache key cannot see through links).")
        if path.is_file():
            yield path
