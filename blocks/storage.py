"""The results storage block: an fsspec URL plus the credentials to reach it.

Why not Prefect's own ``RemoteFileSystem``: its ``settings`` is a plain dict, so an S3
secret key in it shows in the UI and the API in clear; and ``S3Bucket`` needs
prefect-aws and boto3 semantics where the results are fsspec URLs. This block keeps
fsspec semantics with secrets masked, and hands Prefect a ``RemoteFileSystem`` for its
own result persistence when asked.
"""

from __future__ import annotations

from typing import Any

import fsspec
from prefect._internal.compatibility.async_dispatch import async_dispatch
from prefect.filesystems import WritableFileSystem
from prefect.utilities.asyncutils import run_sync_in_worker_thread
from pydantic import Field, SecretStr

from prefect_harbor.storage.durable import short_client_retries

#: A sweep's Prefect task results go under this folder of its run folder (``flows/lanes.py``): inside
#: the run, so that Harbor's viewer, which takes every folder of the results root as a job, lists none of theirs.
PREFECT_RESULTS_FOLDER = "prefect-results"
#: Tries of the S3 client for one of Prefect's own result reads or writes (nothing retries them above it).
PREFECT_RESULT_TRIES = 2


class ResultsStorage(WritableFileSystem):
    """Where sweep results and per-row archives are written (a local path or an fsspec URL).

    Also a Prefect result storage, as Prefect's own file systems are: saved, it can be given to
    tasks as ``result_storage``, and a result's key is its path under ``<url>`` (a sweep's
    keys are in its run folder, ``<url>/<run_id>/prefect-results/``).
    """

    _block_type_name = "Results Storage"
    _description = "A results root for evaluation sweeps: a local path or an fsspec URL (s3://...), with credentials kept secret."

    url: str = Field(title="Results Root URL", description="The results root, e.g. '/data/results' or 's3://bucket/evals'.")
    endpoint_url: str | None = Field(title="S3 Endpoint URL", default=None, description="S3-compatible endpoint (MinIO, SeaweedFS, ...); empty for AWS.")
    access_key_id: SecretStr | None = Field(title="S3 Access Key ID", default=None, description="S3 access key id; empty to use the environment's credentials.")
    secret_access_key: SecretStr | None = Field(title="S3 Secret Access Key", default=None, description="S3 secret access key; empty to use the environment's credentials.")
    region: str | None = Field(title="S3 Region", default=None, description="S3 region, when the server needs one.")
    options: dict[str, Any] = Field(title="Extra fsspec Options", default_factory=dict, description="Extra fsspec storage options (non-secret).")

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

    def filesystem(self) -> tuple[fsspec.AbstractFileSystem, str]:
        """The fsspec filesystem and the root path inside it."""
        return fsspec.core.url_to_fs(self.url, **self.storage_options())

    def _prefect_path(self, path: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """Where Prefect's result ``path`` goes. A sweep's task runs write their results here as they
        end: with S3's default client retries, a storage that went away held each for half a minute."""
        fs, root = fsspec.core.url_to_fs(self.url, **short_client_retries(self.url, self.storage_options(), attempts=PREFECT_RESULT_TRIES))
        return fs, f"{root.rstrip('/')}/{path.lstrip('/')}"

    async def aread_path(self, path: str) -> bytes:
        return await run_sync_in_worker_thread(self._read, path)

    @async_dispatch(aread_path)
    def read_path(self, path: str) -> bytes:  # type: ignore[override]  # sync or async by the caller, as Prefect's LocalFileSystem
        return self._read(path)

    async def awrite_path(self, path: str, content: bytes) -> str:
        return await run_sync_in_worker_thread(self._write, path, content)

    @async_dispatch(awrite_path)
    def write_path(self, path: str, content: bytes) -> str:  # type: ignore[override]  # as read_path
        return self._write(path, content)

    def _read(self, path: str) -> bytes:
        fs, full = self._prefect_path(path)
        return fs.cat_file(full)

    def _write(self, path: str, content: bytes) -> str:
        fs, full = self._prefect_path(path)
        try:  # an object store has no folders to make (s3fs's makedirs asks the server four times)
            fs.pipe_file(full, content)
        except FileNotFoundError:
            fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
            fs.pipe_file(full, content)
        return full
