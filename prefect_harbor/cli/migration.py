"""Find the Osmosis v0.2 APIs that v0.3 removed, as the seed's migration guide lists them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from prefect_harbor.config import LEGACY_KEYWORDS

#: Removed API -> what replaces it (a pattern that needs word boundaries is a regex).
REMOVED_APIS: dict[str, str] = {
    r"\bctx\.samples\b": "ctx.sample (one execution, one sample)",
    r"\bset_sample_reward\b": "ctx.set_reward / sample.reward",
    r"\bregister_sample_source\b": "register the agent/session with the v0.3 integration",
    r"\bget_samples\b": "ctx.sample",
    r"\bMultiTurnMode\b": "removed: one execution is one sample",
    r"x-sample-id": "removed header; the rollout id identifies the sample",
    r"x-rollout-id": "removed header; the chat URL carries the rollout",
    r"\bHarborBackendV2\b": "HarborBackend (the v2 constructor is the v0.3 one)",
    r"\bHarborAgentWorkflowContext\b": "the AgentWorkflow's own context",
    r"\bOsmosisInstalledAgent\b": "removed: the backend installs the bundle itself",
    **{rf"\b{keyword}=": f"HarborBackend keyword: {replacement}" for keyword, replacement in LEGACY_KEYWORDS.items()},
}
_PATTERN = re.compile("|".join(f"(?P<p{i}>{pattern})" for i, pattern in enumerate(REMOVED_APIS)))
_REPLACEMENTS = list(REMOVED_APIS.values())
_SKIPPED_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist"}


@dataclass(frozen=True)
class LegacyUse:
    path: Path
    line: int
    text: str
    replacement: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text.strip()}  -> {self.replacement}"


def scan_for_removed_apis(root: Path) -> list[LegacyUse]:
    """Every line under ``root`` (Python, TOML, YAML, Markdown) using a removed v0.2 API."""
    hits: list[LegacyUse] = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in {".py", ".toml", ".yaml", ".yml", ".md", ".cfg"} or not path.is_file():
            continue
        if _SKIPPED_DIRS.intersection(path.relative_to(root).parts):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            for match in _PATTERN.finditer(line):
                index = int(match.lastgroup.removeprefix("p"))  # type: ignore[union-attr]
                hits.append(LegacyUse(path=path, line=number, text=line, replacement=_REPLACEMENTS[index]))
    return hits
