"""The sweep flow's parameters, as the deployment run form draws them."""

import pytest
from prefect.utilities.callables import parameter_schema

from prefect_harbor.blocks import ResultsStorage
from prefect_harbor.config import ConfigurationError
from prefect_harbor.flows import certify_tasks, evaluation_sweep
from prefect_harbor.flows.configuration import resolve_storage


def test_each_block_has_a_picker_and_a_by_name_field():
    """One way per block in the run form: a picker (a block-type reference) beside a name for the command line."""
    schema = parameter_schema(evaluation_sweep.fn).model_dump()
    for picker, by_name, slug in (("backend", "backend_block", "harbor-backend"), ("storage", "storage_block", "results-storage")):
        (reference,) = [branch["$ref"] for branch in schema["properties"][picker]["anyOf"] if "$ref" in branch]
        assert schema["definitions"][reference.rsplit("/", 1)[1]]["block_type_slug"] == slug
        assert schema["properties"][by_name]["anyOf"][0]["type"] == "string"


@pytest.mark.parametrize("flow", [evaluation_sweep, certify_tasks], ids=["sweep", "certify"])
def test_parameter_help_has_no_raw_backticks(flow):
    """The UI shows descriptions as written: ``x`` would appear with its backticks."""
    schema = parameter_schema(flow.fn).model_dump()
    assert not [name for name, field in schema["properties"].items() if "`" in field.get("description", "")]
    assert all(field.get("description") for field in schema["properties"].values()), "every parameter says what it is in the form"


def test_the_certify_form_picks_its_storage_block_or_takes_its_name():
    schema = parameter_schema(certify_tasks.fn).model_dump()
    (reference,) = [branch["$ref"] for branch in schema["properties"]["storage"]["anyOf"] if "$ref" in branch]
    assert schema["definitions"][reference.rsplit("/", 1)[1]]["block_type_slug"] == "results-storage"
    assert schema["properties"]["runs"]["default"] == 3 and schema["properties"]["tasks_dir"]["type"] == "string"


async def test_storage_given_twice_is_refused_and_a_picked_block_is_used_as_is(tmp_path):
    picked = ResultsStorage(url=str(tmp_path))
    with pytest.raises(ConfigurationError, match="storage: give one of"):
        await resolve_storage(picked, "saved-name")
    assert await resolve_storage(picked, None) is picked
    assert await resolve_storage(None, None) is None


def test_no_flow_and_task_share_a_name():
    """A name picks one thing in the UI's filters, automations and `prefect` commands."""
    import importlib
    import pkgutil

    from prefect import Flow, Task

    import prefect_harbor.flows
    import prefect_harbor.tasks

    names: dict[str, set[str]] = {"flow": set(), "task": set()}
    for package in (prefect_harbor.flows, prefect_harbor.tasks):
        for module in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            for value in vars(importlib.import_module(module.name)).values():
                if isinstance(value, Flow):
                    names["flow"].add(value.name)
                elif isinstance(value, Task):
                    names["task"].add(value.name)
    assert {"evaluation-sweep", "build-bundle", "prewarm", "certify-tasks"} <= names["flow"]
    assert {"build-bundle-wheel", "prewarm-trial", "trial", "inspect-dataset"} <= names["task"], names["task"]
    assert names["flow"] & names["task"] == set()


def test_shards_takes_a_count_or_auto_in_the_form_and_on_the_command_line():
    from typer.testing import CliRunner

    from prefect_harbor.cli.commands import app

    schema = parameter_schema(evaluation_sweep.fn).model_dump()
    shards = schema["properties"]["shards"]
    assert shards["anyOf"][0] == {"type": "integer"} and shards["default"] == 1
    # "auto" as a list to pick from: the form draws a one-value const as a constant nobody can choose.
    auto = schema["definitions"][shards["anyOf"][1]["$ref"].rsplit("/", 1)[1]]
    assert auto["enum"] == ["auto"] and "const" not in auto
    refused = CliRunner().invoke(app, ["sweep", "--tasks-dir", ".", "--dataset", "rows.jsonl", "--shards", "0"])
    assert refused.exit_code == 2 and "'0' is not a host count" in refused.output, refused.output
