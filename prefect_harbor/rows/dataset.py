"""Dataset rows: the Osmosis row contract, read as a stream from any fsspec URL.

A row is ``{"id"?, "prompt"?, "label"?, "metadata"?}``. A row that does not fit the
contract is not an error for the sweep: it becomes a :class:`RowProblem` that the flow
records as a ``failure`` row with the reason.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterator
from typing import Any

import fsspec
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

ChatMessage = dict[str, Any]


class DatasetRow(BaseModel):
    """One rollout request."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="Stable row id; derived from the row's content when absent.")
    prompt: list[ChatMessage] | None = Field(default=None, description="Chat messages; a string is one user message.")
    label: Any = Field(default=None, description="Ground truth for a grader; never shown to the agent.")
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: Whether ``id`` was derived from the content (then identical rows are numbered, not refused).
    _id_derived: bool = PrivateAttr(default=False)

    @field_validator("prompt", mode="before")
    @classmethod
    def _string_prompt_is_one_user_message(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        return value

    @field_validator("metadata", mode="before")
    @classmethod
    def _null_metadata_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @property
    def task_id(self) -> str | None:
        value = self.metadata.get("harbor_task_id")
        return None if value is None else str(value)


class RowProblem(BaseModel):
    """A row that could not be read; it still gets a result row, with this reason."""

    id: str
    index: int
    reason: str


class DatasetError(ValueError):
    """The dataset as a whole cannot be used (unreadable, unknown format, duplicate ids)."""


def path_safe(text: str, limit: int = 80) -> str:
    """``text`` reduced to characters that are safe in file and object names."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")[:limit] or "row"


def derived_row_id(raw: Any) -> str:
    """A stable id from the row's content: the same row gets the same id in every run."""
    canonical = json.dumps(raw, sort_keys=True, default=str, separators=(",", ":"))
    return "row-" + hashlib.sha256(canonical.encode()).hexdigest()[:12]


def parse_row(raw: Any, index: int) -> DatasetRow | RowProblem:
    if not isinstance(raw, dict):
        return RowProblem(id=derived_row_id(raw), index=index, reason=f"row {index} is not a JSON object")
    data = dict(raw)
    derived = data.get("id") in (None, "")
    data["id"] = derived_row_id(raw) if derived else str(data["id"])
    try:
        row = DatasetRow.model_validate(data)
        row._id_derived = derived
        return row
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'row'}: {e['msg']}" for e in error.errors())
        return RowProblem(id=data["id"], index=index, reason=f"invalid row: {problems}")


def iter_rows(url: str, storage_options: dict[str, Any] | None = None) -> Iterator[DatasetRow | RowProblem]:
    """Stream the rows of a JSONL (``.jsonl``/``.json``) or Parquet dataset.

    Raises :class:`DatasetError` when the dataset cannot be opened at all, or when two
    rows share an id (ids name archives and results: they must be unique). Only ids the
    sweep derived are numbered (``-2``, ``-3``, ...): identical rows without an id are
    repeated rollouts. An id the dataset gives twice is always refused.
    """
    seen: dict[str, int] = {}
    derived: dict[str, int] = {}
    for index, row in _iter_raw(url, storage_options or {}):
        if isinstance(row, DatasetRow) and row._id_derived and row.id in derived:
            # Identical rows without ids are repeated rollouts, not duplicates: number them.
            derived[row.id] += 1
            row = row.model_copy(update={"id": f"{row.id}-{derived[row.id]}"})
        else:
            derived.setdefault(row.id, 1)
        previous = seen.setdefault(row.id, index)
        if previous != index:
            raise DatasetError(
                f"{url}: rows {previous} and {index} share the id {row.id!r}; "
                "give every row a unique 'id'."
            )
        yield row


def _iter_raw(url: str, storage_options: dict[str, Any]) -> Iterator[tuple[int, DatasetRow | RowProblem]]:
    lowered = url.lower()
    try:
        opened = fsspec.open(url, "rb", **storage_options)
        handle = opened.open()
    except (OSError, ValueError, ImportError) as error:
        raise DatasetError(f"cannot open dataset {url}: {error}") from error
    with handle:
        if lowered.endswith(".parquet"):
            yield from _iter_parquet(handle)
        elif lowered.endswith((".jsonl", ".json", ".ndjson")):
            yield from _iter_jsonl(handle)
        else:
            raise DatasetError(f"{url}: unknown dataset format; use a .jsonl or .parquet file.")


def _iter_jsonl(handle: io.BufferedIOBase) -> Iterator[tuple[int, DatasetRow | RowProblem]]:
    index = 0
    for line in handle:
        text = line.decode("utf-8", errors="replace").strip()
        if not text:
            continue
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            yield index, RowProblem(id=derived_row_id(text), index=index, reason=f"row {index} is not valid JSON: {error}")
        else:
            yield index, parse_row(raw, index)
        index += 1


def _iter_parquet(handle: io.BufferedIOBase) -> Iterator[tuple[int, DatasetRow | RowProblem]]:
    try:
        parquet = pq.ParquetFile(handle)
    except Exception as error:  # pyarrow raises its own error types for a bad file
        raise DatasetError(f"not a readable Parquet file: {error}") from error
    index = 0
    for batch in parquet.iter_batches(batch_size=256):
        for raw in batch.to_pylist():
            yield index, parse_row(_decode_json_columns(raw), index)
            index += 1


def _decode_json_columns(raw: dict[str, Any]) -> dict[str, Any]:
    """Parquet writers often store ``prompt``/``metadata`` as JSON strings: accept both."""
    decoded = dict(raw)
    for key in ("prompt", "metadata"):
        value = decoded.get(key)
        if isinstance(value, str) and value[:1] in "[{":
            try:
                decoded[key] = json.loads(value)
            except json.JSONDecodeError:
                pass
    return decoded


class DatasetInfo(BaseModel):
    """What a first pass over the dataset learns: size, fingerprint, unusable rows."""

    url: str
    rows: int
    fingerprint: str = Field(description="sha256 over every parsed row in order; changes when any row does.")
    problems: int
    ids: list[str] = Field(default_factory=list, exclude=True, description="Row ids in order (for live status).")
    task_ids: list[str] = Field(default_factory=list, exclude=True, description="The metadata.harbor_task_id values the rows select (for prewarm).")


def scan_dataset(url: str, storage_options: dict[str, Any] | None = None) -> DatasetInfo:
    """Read the whole dataset once before any trial: a bad file or duplicate ids fail here."""
    digest = hashlib.sha256()
    ids: list[str] = []
    task_ids: set[str] = set()
    problems = 0
    for row in iter_rows(url, storage_options):
        digest.update(row.model_dump_json().encode())
        ids.append(row.id)
        problems += isinstance(row, RowProblem)
        if isinstance(row, DatasetRow) and row.task_id and "harbor_task" not in row.metadata:
            task_ids.add(row.task_id)
    return DatasetInfo(url=url, rows=len(ids), fingerprint=digest.hexdigest(), problems=problems, ids=ids, task_ids=sorted(task_ids))
