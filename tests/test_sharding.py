"""How a sweep on many hosts splits its rows, and what it refuses before anything starts (flows/sharding.py)."""

import pytest

from prefect_harbor.config import ConfigurationError
from prefect_harbor.flows.sharding import ShardSplit, refuse_unshareable
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
    refuse_unshareable(1, root, None, None, None)  # one host: anything goes


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
