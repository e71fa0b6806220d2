"""Bundle steps that run once per sweep, before any trial: build the wheel, prepare its environment."""

from __future__ import annotations

import time
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from prefect_harbor.agents.bundles import Bundle, BundleSpec, build_bundle, check_bundle_imports
from prefect_harbor.agents.harness import BundleRuntime
from prefect_harbor.agents.pyenvs import prepare_env


@task(name="build-bundle-wheel", retries=0, cache_policy=NO_CACHE, persist_result=False)
def build_workflow_bundle(spec: BundleSpec, cache_dir: Path) -> Bundle:
    """Build the workflow project into a wheel with ``uv build``; an unchanged project is a cache hit."""
    logger = get_run_logger()
    started = time.perf_counter()
    bundle, cached = build_bundle(spec, cache_dir, logger)
    logger.info(f"Bundle {bundle.wheel.name} {'reused from the cache' if cached else 'built'} in {time.perf_counter() - started:.2f} s")
    return bundle


@task(name="prepare-bundle-environment", retries=0, cache_policy=NO_CACHE, persist_result=False)
def prepare_bundle_environment(bundle: Bundle, spec: BundleSpec | None, cache_dir: Path) -> BundleRuntime:
    """Install the bundle's requirements once into an environment every trial mounts read-only; check its imports there."""
    logger = get_run_logger()
    started = time.perf_counter()
    env, cached = prepare_env(bundle.requirements, root=cache_dir, logger=logger)
    if spec is not None:
        check_bundle_imports(bundle, env, spec)
    logger.info(f"Bundle environment {env.path} {'reused' if cached else 'prepared'} in {time.perf_counter() - started:.2f} s")
    return BundleRuntime(bundle=bundle, env=env)
