"""Configs, imported by path inside the sandbox (``module:attr``), never serialized."""

from osmosis_ai.rollout.types import AgentWorkflowConfig, GraderConfig

workflow_config = AgentWorkflowConfig(name="arithmetic", model="osmosis-rollout", temperature=0.0)
grader_config = GraderConfig(name="exact-match", strip=True)
