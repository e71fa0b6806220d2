"""The results storage block: an fsspec URL plus the credentials to reach it.

Why not Prefect's own ``RemoteFileSystem``: its ``settings`` is a plain dict, so an S3
secret key in it shows in the UI and the API in clear; and ``S3Bucket`` needs
prefect-aws and boto3 semantics where the results are fsspec URLs. This block keeps
fsspec semantics with secrets masked, and hands Prefect a ``RemoteFileSystem`` for its
own result persistence when asked.
"""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import Block
from pydantic import Field, SecretStr


class ResultsStorage(Block):
    """Where sweep results and per-row archives are written (a local path or an fsspec URL)."""

    _block_type_name = "Results Storage"
    _description = "A results root for evaluation sweeps: a local path or an fsspec URL (s3://...), with credentials kept secret."

    url: str = Field(description="The results root, e.g. '/data/results' or 's3://bucket/evals'.")
    endpoint_url: str | None = Field(default=None, description="S3-compatible endpoint (MinIO, SeaweedFS, ...); empty for AWS.")
    access_key_id: SecretStr | None = Field(default=None, description="S3 access key id; empty to use the environment's credentials.")
    secret_access_key: SecretStr | None = Field(default=None, description="S3 secret access key; empty to use the environment's credentials.")
    region: str | None = Field(default=None, description="S3 region, when the server needs one.")
    options: dict[str, Any] = Field(default_factory=dict, description="Extra fsspec storage options (non-secret).")

    def storage_options(self) -> dict[str, Any]:
        """The fsspec options for ``url``, secrets revealed (never log this)."""
        options: dict[str, Any] = dict(self.options)
        if self.access_key_id is not None:
            options["key"] = self.access_key_id.get_secret_value()
        if self.secret_access_key is not None:
            options["secret"] = self.secret_access_key.get_secret_value()
        client_kwargs = dict(options.get("client_kwargs", {}))
        if self.endpoint_url:
            client_kwargs["endpoint_url"] = self.endpoint_url
        if self.region:
            client_kwargs["region_name"] = self.region
        if client_kwargs:
            options["client_kwargs"] = client_kwargs
        return options
