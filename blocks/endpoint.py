"""The model endpoint block: where model-backed agents send their requests."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator

from prefect_harbor.spec import Endpoint


class ModelEndpoint(Block):
    """An OpenAI-compatible model endpoint; its API key is stored as a secret."""

    _block_type_name = "Model Endpoint"
    _description = "An OpenAI-compatible model endpoint (base URL, API key, default model) for model-backed agents."

    base_url: str = Field(title="Base URL", description="The endpoint's base URL, e.g. 'http://127.0.0.1:8000/v1'.")
    api_key: SecretStr | None = Field(title="API Key", default=None, description="The API key; stored as a secret and never written to results or archives.")
    model: str | None = Field(title="Default Model", default=None, description="The default model name, e.g. 'openai/gpt-4o-mini'; the backend's model_name when unset.")

    @field_validator("base_url")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("base_url: empty; a model-backed agent cannot be wired to an empty endpoint.")
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url: {value!r} is not an http(s) URL.")
        return value.rstrip("/")

    def spec(self) -> Endpoint:
        """The endpoint as the core takes it (``prefect_harbor.spec``)."""
        return Endpoint(base_url=self.base_url, api_key=self.api_key, model=self.model)
