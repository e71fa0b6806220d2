"""The blocks: Prefect's standard block checks, and every configuration rule by name."""

import inspect
import re

import pytest
from paths import EXAMPLE_TASKS
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from pydantic import ValidationError

from prefect_harbor.blocks import HarborBackend, ModelEndpoint, ResultsStorage
from prefect_harbor.blocks.storage import PREFECT_RESULT_TRIES
from prefect_harbor.config import LEGACY_KEYWORDS, TaskSourcePolicy, TrialEnvironment
from prefect_harbor.sandbox import IMPORT_PATH
from prefect_harbor.spec import NativeAgent, WorkflowAgent

TEMPLATE = EXAMPLE_TASKS / "reward-txt"


class _OfflineStandardSuite(BlockStandardTestSuite):
    def test_has_a_documentation_url(self, block):
        pytest.skip("no public documentation site yet; the README documents the blocks")

    def test_has_a_valid_image(self, block):
        pytest.skip("the logo check downloads an image; this machine is offline")


class TestHarborBackendStandard(_OfflineStandardSuite):
    @pytest.fixture
    def block(self):
        return HarborBackend


class TestModelEndpointStandard(_OfflineStandardSuite):
    @pytest.fixture
    def block(self):
        return ModelEndpoint


class TestResultsStorageStandard(_OfflineStandardSuite):
    @pytest.fixture
    def block(self):
        return ResultsStorage


def error_text(**kwargs) -> str:
    with pytest.raises(ValidationError) as caught:
        HarborBackend(**kwargs)
    return str(caught.value)


def test_defaults_follow_osmosis_and_run_in_the_local_sandbox():
    backend = HarborBackend(tasks_dir=TEMPLATE, agent="oracle")
    assert (backend.task_mode, backend.model_name, backend.n_concurrent) == ("template", "openai/osmosis-rollout", 4)
    assert backend.cleanup_successful_trials is True and backend.max_queue_depth is None
    assert backend.environment.import_path == IMPORT_PATH


def test_missing_tasks_dir(tmp_path):
    assert "tasks_dir:" in error_text(tasks_dir=tmp_path / "nope", agent="oracle")


def test_template_mode_needs_a_task_and_dataset_mode_a_root():
    assert "template mode needs one Harbor task" in error_text(tasks_dir=EXAMPLE_TASKS, task_mode="template", agent="oracle")
    assert "use task_mode 'template'" in error_text(tasks_dir=TEMPLATE, task_mode="dataset", agent="oracle")


def test_a_root_without_tasks_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "holds no task directories" in error_text(tasks_dir=tmp_path, task_mode="dataset", agent="oracle")


def test_unknown_native_agent_lists_the_registered_ones():
    text = error_text(tasks_dir=TEMPLATE, agent="orakel")
    assert "unknown native agent 'orakel'" in text and "terminus-2" in text and "mini-swe-agent" in text


def test_native_agent_kwargs_need_a_native_agent():
    assert "native_agent_kwargs" in error_text(tasks_dir=TEMPLATE, agent="pkg.mod:Workflow", native_agent_kwargs={"x": 1})


def test_patch_dockerfile_with_sdk_needs_a_bundle():
    assert "patch_dockerfile_with_sdk: needs a bundle" in error_text(tasks_dir=TEMPLATE, agent="oracle", patch_dockerfile_with_sdk=True)
    HarborBackend(tasks_dir=TEMPLATE, agent="pkg.mod:Workflow", patch_dockerfile_with_sdk=True)


@pytest.mark.parametrize("depth", [0, -3])
def test_max_queue_depth_below_one_is_refused(depth):
    assert "max_queue_depth: must be >= 1" in error_text(tasks_dir=TEMPLATE, agent="oracle", max_queue_depth=depth)


def test_neither_agent_nor_bundle():
    assert "agent: set a native agent, or workflow_agent" in error_text(tasks_dir=TEMPLATE)


def test_the_ui_offers_native_agents_as_a_list_and_workflows_as_an_import_path():
    """An enum is what the Prefect UI's block form enforces (it saves any text, patterns unchecked)."""
    properties = HarborBackend.model_json_schema()["properties"]
    assert properties["agent"]["enum"] == ["terminus-2", "mini-swe-agent", "oracle", "nop"]
    (workflow,) = [branch for branch in properties["workflow_agent"]["anyOf"] if branch.get("type") != "null"]
    assert re.match(workflow["pattern"], "my_project.workflow:MyWorkflow") and not re.match(workflow["pattern"], "orcale")


def test_osmosis_agent_keyword_still_takes_a_workflow_import_path():
    backend = HarborBackend(tasks_dir=TEMPLATE, agent="pkg.mod:Workflow")
    assert (backend.agent, backend.workflow_agent, backend.agent_spec) == (None, "pkg.mod:Workflow", "pkg.mod:Workflow")
    assert backend.is_workflow and backend.has_bundle
    assert HarborBackend.model_validate(backend.model_dump()).workflow_agent == "pkg.mod:Workflow"


def test_the_block_resolves_to_a_frozen_spec_whose_agent_is_native_or_a_workflow():
    """What the core takes: the flat form's agent fields become one of two kinds, and nothing can change it afterwards."""
    native = HarborBackend(tasks_dir=TEMPLATE, agent="oracle", native_agent_kwargs={"k": 1}, archive_max_file_mb=2).spec()
    assert isinstance(native.agent, NativeAgent) and (native.agent.name, native.agent.options, native.agent_name) == ("oracle", {"k": 1}, "oracle")
    assert native.bundle is None and native.limits.archive.file_bytes == 2 * 1024 * 1024
    workflow = HarborBackend(tasks_dir=TEMPLATE, agent="pkg.mod:Workflow", workflow_config="pkg.mod:CONFIG", patch_dockerfile_with_sdk=False).spec()
    assert isinstance(workflow.agent, WorkflowAgent) and (workflow.agent.workflow, workflow.agent.config) == ("pkg.mod:Workflow", "pkg.mod:CONFIG")
    assert workflow.bundle is not None and not workflow.bundle.bake and workflow.sources.mode == "template"
    with pytest.raises(ValidationError, match="frozen"):
        workflow.limits.n_concurrent = 8  # type: ignore[misc]


def test_a_native_agent_and_a_workflow_agent_together_are_refused():
    assert "set one of them" in error_text(tasks_dir=TEMPLATE, agent="oracle", workflow_agent="pkg.mod:Workflow")
    assert "give one of them" in error_text(tasks_dir=TEMPLATE, agent="pkg.a:A", workflow_agent="pkg.b:B")


def test_a_workflow_agent_that_is_not_an_import_path_names_the_field():
    assert "workflow_agent: 'orcale' is not an import path" in error_text(tasks_dir=TEMPLATE, workflow_agent="orcale")


def test_a_template_without_tests_and_without_a_grader_has_no_reward_source(tmp_path):
    (tmp_path / "task.toml").write_text("")
    assert "has no reward source" in error_text(tasks_dir=tmp_path, agent="oracle")
    HarborBackend(tasks_dir=tmp_path, agent="oracle", grader="pkg.grading:MyGrader")


def test_a_dataset_root_without_any_reward_source(tmp_path):
    (tmp_path / "t1").mkdir()
    (tmp_path / "t1" / "task.toml").write_text("")
    assert "there is no reward source" in error_text(tasks_dir=tmp_path, task_mode="dataset", agent="oracle")


@pytest.mark.parametrize("keyword", sorted(LEGACY_KEYWORDS))
def test_v02_keywords_are_rejected_with_their_replacement(keyword):
    text = error_text(tasks_dir=TEMPLATE, agent="oracle", **{keyword: "x"})
    assert f"{keyword}: a pre-v0.3 HarborBackend keyword" in text
    assert LEGACY_KEYWORDS[keyword] in text


def test_choosing_an_environment_type_replaces_the_sandbox():
    assert TrialEnvironment(type="docker").import_path is None
    with pytest.raises(ValidationError, match="exactly one"):
        TrialEnvironment(import_path=None)


def test_model_endpoint_refuses_an_empty_endpoint_and_masks_the_key():
    with pytest.raises(ValidationError, match="empty endpoint"):
        ModelEndpoint(base_url=" ")
    endpoint = ModelEndpoint(base_url="http://127.0.0.1:9/v1/", api_key="sk-test-123")
    assert endpoint.base_url == "http://127.0.0.1:9/v1"
    assert "sk-test-123" not in repr(endpoint) and "sk-test-123" not in endpoint.model_dump_json()


def test_results_storage_builds_fsspec_options_with_revealed_secrets_only_on_request():
    storage = ResultsStorage(url="s3://b/p", endpoint_url="http://127.0.0.1:9000", access_key_id="AK", secret_access_key="SK")
    assert storage.storage_options() == {"key": "AK", "secret": "SK", "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}
    assert "SK" not in storage.model_dump_json()


def test_an_empty_endpoint_from_the_ui_form_means_none():
    """The Prefect UI submits an untouched optional nested block as {} (or with empty values)."""
    backend = HarborBackend(tasks_dir=EXAMPLE_TASKS / "reward-txt", agent="oracle", model_endpoint={})
    assert backend.model_endpoint is None
    assert HarborBackend(tasks_dir=EXAMPLE_TASKS / "reward-txt", agent="oracle", model_endpoint={"base_url": "", "api_key": None}).model_endpoint is None


def test_remote_environments_are_validated_by_harbor_type():
    backend = HarborBackend(tasks_dir=EXAMPLE_TASKS / "reward-txt", agent="oracle", environment={"type": "daytona"})
    assert (backend.environment.type, backend.environment.import_path) == ("daytona", None)
    with pytest.raises(ValueError, match="environment.type: 'dockerr' is not a Harbor environment type; use one of"):
        HarborBackend(tasks_dir=EXAMPLE_TASKS / "reward-txt", agent="oracle", environment={"type": "dockerr"})


def test_a_bundle_needs_the_local_sandbox():
    with pytest.raises(ValueError, match="environment: a workflow bundle is mounted from this host into the local container sandbox"):
        HarborBackend(tasks_dir=EXAMPLE_TASKS / "reward-txt", agent="pkg.mod:Workflow", environment={"type": "modal"})


def test_one_default_mode_everywhere_follows_the_shape_of_tasks_dir():
    """The block, the CLI and code share one default: template for one task, dataset for a folder."""
    from prefect_harbor.cli.commands import sweep

    assert HarborBackend(tasks_dir=EXAMPLE_TASKS, agent="oracle").task_mode == "dataset"
    assert HarborBackend(tasks_dir=EXAMPLE_TASKS / "reward-txt", agent="oracle").task_mode == "template"
    assert HarborBackend.model_fields["task_mode"].default is None
    assert inspect.signature(sweep).parameters["mode"].default is None


@pytest.mark.parametrize(("field", "value"), [("agent", "orcale"), ("agent", "my_pkg.agent:Workflow"), ("workflow_agent", "not a path"), ("max_queue_depth", 0)])
def test_the_block_schema_carries_the_rules_a_form_can_check(field, value):
    """Rules in the JSON schema, where any schema-driven form or API client checks them before a sweep."""
    import jsonschema

    schema = HarborBackend.model_json_schema()
    good = {"tasks_dir": str(TEMPLATE), "agent": "oracle"}
    jsonschema.validate(good, schema)
    jsonschema.validate({"tasks_dir": str(TEMPLATE), "workflow_agent": "my_pkg.agent:Workflow"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**good, field: value}, schema)


@pytest.mark.parametrize("model", [HarborBackend, ModelEndpoint, ResultsStorage, TrialEnvironment, TaskSourcePolicy])
def test_every_form_field_has_a_written_title_and_plain_help(model):
    """The UI shows titles and descriptions as they are: none auto-generated ("N Concurrent"), no raw backticks."""
    for name, field in model.model_fields.items():
        assert field.title, f"{model.__name__}.{name} has no title"
        assert field.description and "`" not in field.description, f"{model.__name__}.{name}'s description"
    assert "`" not in (model.model_json_schema().get("description") or ""), f"{model.__name__}'s description (the form shows a nested model's)"


def test_a_result_key_is_its_path_under_the_results_root_as_in_prefects_file_systems(tmp_path):
    """A sweep's keys are in its run folder, so no folder of Prefect's sits beside the runs (Harbor's viewer would list it as a job)."""
    storage = ResultsStorage(url=str(tmp_path))
    written = storage.write_path("20261204T0000Z-abc/prefect-results/row-0-1.json", b"{}")
    assert written == f"{tmp_path}/20261204T0000Z-abc/prefect-results/row-0-1.json"
    assert storage.read_path("20261204T0000Z-abc/prefect-results/row-0-1.json") == b"{}"
    assert [p.name for p in tmp_path.iterdir()] == ["20261204T0000Z-abc"]


def test_prefects_results_on_s3_are_tried_a_few_times_within_seconds_not_botocores_half_minute():
    """A sweep whose storage went away must not wait on each task run's result write (seen: 24 s for one)."""
    storage = ResultsStorage(url="s3://bucket/evals", endpoint_url="http://127.0.0.1:9", access_key_id="k", secret_access_key="s", options={"anon": False})
    fs, path = storage._prefect_path("run/prefect-results/row-0-1.json")
    assert path == "bucket/evals/run/prefect-results/row-0-1.json"
    assert fs.config_kwargs["retries"] == {"max_attempts": PREFECT_RESULT_TRIES, "mode": "standard"} and fs.config_kwargs["connect_timeout"] == 5
    assert fs.client_kwargs["endpoint_url"] == "http://127.0.0.1:9" and fs.key == "k"
    given = ResultsStorage(url="s3://bucket", options={"config_kwargs": {"connect_timeout": 30}})
    assert given._prefect_path("x")[0].config_kwargs["connect_timeout"] == 30, "a user's own client settings win"
