"""The agent: one chat completion against the endpoint the rollout is given."""

import httpx
from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.context import AgentWorkflowContext, get_rollout_context
from osmosis_ai.rollout.types import AgentWorkflowOutput


class ArithmeticWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> AgentWorkflowOutput:
        rollout = get_rollout_context()
        if rollout is None or not rollout.chat_completions_url:
            raise RuntimeError("no model endpoint was given to this rollout")
        config = self.config
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        async with httpx.AsyncClient(timeout=60) as client:
            response = await client.post(
                f"{rollout.chat_completions_url.rstrip('/')}/chat/completions",
                headers=headers,
                json={
                    "model": getattr(config, "model", "osmosis-rollout"),
                    "messages": list(ctx.prompt),
                    "temperature": getattr(config, "temperature", 0.0),
                },
            )
            response.raise_for_status()
        body = response.json()
        reply = body["choices"][0]["message"]
        usage = body.get("usage") or {}
        return AgentWorkflowOutput(
            messages=[*ctx.prompt, {"role": "assistant", "content": reply.get("content") or ""}],
            metrics={"prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0)},
        )
