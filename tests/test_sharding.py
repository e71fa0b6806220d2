"""How a sweep on many hosts splits its rows, and what it refuses before anything starts (flows/sharding.py)."""

import pytest

from prefect_harbor.config import ConfigurationError
from prefect_harbor.flows.sharding import SHARD_DEPLOYMENT, ShardSplit, refuse_unshareable, shard_count
from prefect_harbor.rows.dataset import DatasetRow


def row(row_id: str, task: str | None) -> DatasetRow:
    return DatasetRow(id=row_id, metadata={"harbor_task_id": task} if task else {})


def test_a_tasks_rows_share_a_shard_and_tasks_are_dealt_out_in_turn():
    split = ShardSplit(2, ("a", "b", "c"))
    shards = {row_id: split.shard_of(index, row(row_id, task)) for index, (row_id, task) in enumerate([("1", "a"), ("2", "b"), ("3", "a"), ("4", "c")])}
    assert shards == {"1": 0, "2": 1, "3": 0, "4": 0}
    assert (split.tasks_of(0), split.tasks_of(1)) == (["a", "c"], ["b"])


def test_rows_without_a_task_id_go_by_position():
    split = ShardSplit(3, ())
    assert [split.shard_of(index, row(str(index), None)) for index in range(5)] == [0, 1, 2, 0, 1]


@pytest.mark.parametrize("root", ["results", "/data/results", "file:///data/results"])
def test_a_local_results_root_is_refused_for_many_hosts_naming_the_fix(root):
    with pytest.raises(ConfigurationError, match=r"results: a sweep on 2 shards .* local path .* s3:// .* Results Storage block"):
        refuse_unshareable(2, root, "nightly", None, None)


def test_blocks_must_be_saved_to_be_handed_to_other_hosts():
    with pytest.raises(ConfigurationError, match="save it as a Harbor Backend block and give backend_block"):
        refuse_unshareable(2, "s3://bucket/evals", None, None, None)
    with pytest.raises(ConfigurationError, match="save it as a Results Storage block"):
        refuse_unshareable(2, "s3://bucket/evals", "nightly", object(), None)
    refuse_unshareable(2, "s3://bucket/evals", "nightly", object(), "results-s3")


@pytest.mark.integration
@pytest.mark.usefixtures("prefect_server")
async def test_a_sweep_on_many_hosts_without_the_shard_deployment_fails_before_anything_starts_naming_the_fix(tmp_path):
    from paths import EXAMPLE_DATASET, EXAMPLE_TASKS

    from prefect_harbor.blocks import HarborBackend
    from prefect_harbor.flows import evaluation_sweep

    await HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials")).save("shards-no-deployment", overwrite=True)
    with pytest.raises(ConfigurationError, match=r"sweep-shard/shard deployment is not on this Prefect server; deploy it with .*prefect worker start"):
        await evaluation_sweep(dataset=str(EXAMPLE_DATASET), backend_block="shards-no-deployment", results="s3://nowhere/evals", shards=2)
    assert not (tmp_path / "trials").exists()


@pytest.mark.parametrize("shards", [0, -2, True, "two", "Auto", 2.5])
async def test_a_shard_count_that_is_not_one_is_refused_naming_the_field(shards):
    with pytest.raises(ConfigurationError, match=r"^shards: .* is not a host count; give 1 \(this host\), more, or 'auto'"):
        await shard_count(shards)


async def test_one_shard_is_this_host_alone_and_asks_no_server():
    assert await shard_count(1) is None  # no server here: asking one would fail


@pytest.mark.integration
@pytest.mark.usefixtures("prefect_server")
async def test_auto_counts_the_workers_online_on_the_shards_pool_and_refuses_none_naming_the_pool():
    """``shards="auto"``: one shard per worker whose heartbeat the server has (what a started worker sends)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    flow_name, name = SHARD_DEPLOYMENT.split("/")
    async with get_client() as client:
        await client.create_work_pool(WorkPoolCreate(name="shards-auto-pool", type="process"), overwrite=True)
        deployment = await client.create_deployment(await client.create_flow_from_name(flow_name), name, work_pool_name="shards-auto-pool")
        try:
            with pytest.raises(ConfigurationError, match=r"shards: 'auto' .* shards-auto-pool work pool, and none is; .*--pool shards-auto-pool"):
                await shard_count("auto")
            for worker in ("host-a", "host-b"):
                await client.send_worker_heartbeat("shards-auto-pool", worker)
            assert await shard_count("auto") == 2
            assert await shard_count(3) == 3  # a number is taken as given
        finally:
            await client.delete_deployment(deployment)
