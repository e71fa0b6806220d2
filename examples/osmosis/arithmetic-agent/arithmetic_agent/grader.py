"""The grader: reward 1.0 when the last assistant message is the label."""

from osmosis_ai.rollout.context import GraderContext
from osmosis_ai.rollout.grader import Grader


class ExactMatchGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        replies = [m for m in ctx.sample.messages if m.get("role") == "assistant"]
        answer = str(replies[-1].get("content") or "") if replies else ""
        if getattr(self.config, "strip", True):
            answer = answer.strip()
        ctx.set_reward(1.0 if ctx.label is not None and answer == str(ctx.label).strip() else 0.0)
