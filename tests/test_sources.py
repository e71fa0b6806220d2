"""Per-row task sources (metadata.harbor_task): parsing, the policy, shared git fetches."""

import asyncio
import shutil

import pytest
from paths import EXAMPLE_TASKS
from tasks_factory import git_task_repo

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.config import TaskSourcePolicy
from prefect_harbor.rows.dataset import DatasetRow
from prefect_harbor.rows.sources import RowRejected, TaskResolver, parse_task_ref
from prefect_harbor.spec import Sources


def sources(**policy) -> Sources:
    return HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", task_sources=TaskSourcePolicy(**policy)).spec().sources


def row(ref, **metadata) -> DatasetRow:
    return DatasetRow(id="r", metadata={"harbor_task": ref, **metadata})


@pytest.fixture(scope="module")
def git_repo(tmp_path_factory):
    """A local git repository holding one task at tasks/hello; yields (file URL, commit)."""
    return git_task_repo(tmp_path_factory.mktemp("repo"), EXAMPLE_TASKS / "reward-txt")


def test_refs_parse_the_osmosis_way():
    assert type(parse_task_ref("./t", {})[0]).__name__ == "LocalTaskId"
    package, warnings = parse_task_ref("acme/task", {})
    assert (package.org, package.name, package.ref) == ("acme", "task", "latest")
    assert "mutable ref 'latest'" in warnings[0]
    assert parse_task_ref("acme/task@sha256:abc", {})[1] == ()
    assert "unpinned" in parse_task_ref("tasks/x", {"git_url": "file:///r"})[1][0]
    with pytest.raises(RowRejected, match="must be a local path .*, a package 'org/name\\[@ref\\]', or a git checkout"):
        parse_task_ref("just-a-name", {})


async def test_the_row_reference_wins_over_the_task_id(tmp_path):
    ref = str(EXAMPLE_TASKS / "multi-key-reward")
    task = await TaskResolver(sources(), tmp_path).resolve(row(ref, harbor_task_id="reward-txt"))
    assert (task.name, task.dynamic) == ("multi-key-reward", True)


async def test_local_paths_outside_allowed_roots_are_refused_by_policy(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    shutil.copytree(EXAMPLE_TASKS / "reward-txt", tmp_path / "elsewhere" / "t")
    with pytest.raises(RowRejected, match="refused by the task source policy"):
        await TaskResolver(sources(), tmp_path).resolve(row(str(tmp_path / "elsewhere" / "t")))
    allowed = sources(allowed_local_roots=[str(tmp_path / "elsewhere")])
    assert (await TaskResolver(allowed, tmp_path).resolve(row(str(tmp_path / "elsewhere" / "t")))).name == "t"


async def test_registry_packages_need_an_allowed_org(tmp_path):
    with pytest.raises(RowRejected, match="registry org 'acme' is refused by the task source policy"):
        await TaskResolver(sources(), tmp_path).resolve(row("acme/task@sha256:abc"))


async def test_git_urls_need_an_allowed_prefix(tmp_path, git_repo):
    url, commit = git_repo
    with pytest.raises(RowRejected, match="allowed_git_url_prefixes"):
        await TaskResolver(sources(), tmp_path).resolve(row("tasks/hello", git_url=url, git_commit_id=commit))


async def test_a_pinned_git_task_is_fetched_once_for_concurrent_rows(tmp_path, git_repo):
    url, commit = git_repo
    resolver = TaskResolver(sources(allowed_git_url_prefixes=[url]), tmp_path / "cache")
    tasks = await asyncio.gather(*(resolver.resolve(row("tasks/hello", git_url=url, git_commit_id=commit)) for _ in range(4)))
    assert len({t.path for t in tasks}) == 1 and len(resolver._fetches) == 1
    assert (tasks[0].path / "task.toml").is_file() and tasks[0].warnings == ()


async def test_an_unreachable_git_task_fails_the_row_with_the_reason(tmp_path):
    resolver = TaskResolver(sources(allowed_git_url_prefixes=["file://"]), tmp_path)
    with pytest.raises(RowRejected, match="could not fetch task 'hello'"):
        await resolver.resolve(row("tasks/hello", git_url=f"file://{tmp_path}/missing", git_commit_id="0" * 40))
