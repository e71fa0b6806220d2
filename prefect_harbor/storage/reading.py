"""Reading a run folder back, surviving files damaged anyway (by an older version, or by hand):
a damaged part is named in a warning and its rows count as not finished."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from prefect_harbor.storage.durable import DurableFolder
from prefect_harbor.storage.manifest import RunManifest
from prefect_harbor.storage.results import RESULTS_SCHEMA, RowResult


class DamagedFile(ValueError):
    """A file of the run folder cannot be parsed: most likely cut short by a crash."""


def read_results(folder: DurableFolder, damaged: list[str]) -> list[RowResult]:
    """Every row already recorded: from ``results.parquet``, else from the parts. A damaged
    file is named in a warning (and appended to ``damaged``); its rows count as not recorded."""
    return [RowResult.model_validate({**r, "rewards": dict(r["rewards"] or [])}) for r in read_table(folder, damaged).to_pylist()]


def read_table(folder: DurableFolder, damaged: list[str]) -> pa.Table:
    """:func:`read_results` as a table (a run of an older version has its own columns: read them by name)."""
    table = _read_parquet(folder, "results.parquet", damaged) if folder.fs.exists(f"{folder.run_path}/results.parquet") else None
    return _read_parts(folder, damaged) if table is None else table


def read_manifest(folder: DurableFolder) -> RunManifest:
    """The run's manifest; ``DamagedFile`` when it cannot be parsed, ``FileNotFoundError`` when absent."""
    content = folder.read_bytes("manifest.json")
    try:
        return RunManifest.model_validate_json(content)
    except ValidationError as error:
        detail = error.errors()[0]["msg"]
        raise DamagedFile(f"{folder.uri('manifest.json')} is damaged ({len(content)} bytes: {detail}), probably cut short by a crash") from None


def _read_parts(folder: DurableFolder, damaged: list[str]) -> pa.Table:
    try:
        return pq.read_table(f"{folder.run_path}/parts", filesystem=folder.fs)  # one read of them all, the usual case
    except FileNotFoundError:
        return RESULTS_SCHEMA.empty_table()
    except (pa.ArrowException, OSError):
        pass  # a part is damaged: read them one by one to keep the others
    tables = [_read_parquet(folder, f"parts/{name}", damaged) for name in folder.list_names("parts") if not name.startswith((".", "_"))]
    return pa.concat_tables([t for t in tables if t is not None] or [RESULTS_SCHEMA.empty_table()], promote_options="default")


def _read_parquet(folder: DurableFolder, relative: str, damaged: list[str]) -> pa.Table | None:
    """The table in ``relative``, or None (with a warning) when it is damaged."""
    try:
        return pq.read_table(f"{folder.run_path}/{relative}", filesystem=folder.fs)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as error:
        problem = f"{folder.uri(relative)} is damaged ({type(error).__name__}: {error}), probably cut short by a crash"
        damaged.append(problem)
        folder.logger.warning(f"{problem}: its rows are treated as not finished (a --resume runs them again)")
        return None
