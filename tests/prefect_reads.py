"""Reads of one flow run's task runs, artifacts and logs, filtered on the server.

The session's test server holds every test's runs; an unfiltered read returns only the API's
default page (200), so in a full run it can miss the flow run a test looks for."""

from uuid import UUID

from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import Artifact, TaskRun
from prefect.logging.handlers import APILogHandler


async def task_runs_of(client: PrefectClient, flow_run_id: UUID) -> list[TaskRun]:
    return await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


async def artifacts_of(client: PrefectClient, flow_run_id: UUID, key: str | None = None) -> list[Artifact]:
    """The flow run's artifacts (every version of a key), oldest first."""
    found = await client.read_artifacts(
        artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]), key=ArtifactFilterKey(any_=[key]) if key else None)
    )
    return sorted(found, key=lambda artifact: artifact.created or 0)


async def logs_of(client: PrefectClient, flow_run_id: UUID) -> list[str]:
    """The messages the flow run and its task runs logged, once this process's log handler has sent what it holds."""
    await APILogHandler.aflush()
    return [log.message for log in await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]
