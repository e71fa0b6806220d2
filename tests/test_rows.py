"""Dataset ingestion: the row contract, malformed rows and unusable datasets."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefect_harbor.rows.dataset import DatasetError, DatasetRow, RowProblem, iter_rows, scan_dataset


def write_jsonl(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return str(path)


def test_rows_follow_the_osmosis_contract(tmp_path):
    url = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"id": "a", "prompt": [{"role": "user", "content": "hi"}], "label": "x", "metadata": {"harbor_task_id": "t"}},
            {"id": 7, "prompt": "plain string"},
        ],
    )
    first, second = list(iter_rows(url))
    assert first == DatasetRow(id="a", prompt=[{"role": "user", "content": "hi"}], label="x", metadata={"harbor_task_id": "t"})
    assert first.task_id == "t"
    assert second.id == "7"
    assert second.prompt == [{"role": "user", "content": "plain string"}]
    assert second.metadata == {}


def test_malformed_rows_become_problems_not_errors(tmp_path):
    url = write_jsonl(tmp_path / "d.jsonl", ['{"id": "ok"}', "{not json", "[1, 2]", {"id": "bad", "prompt": 5}, {"id": "x", "surprise": 1}])
    rows = list(iter_rows(url))
    assert [type(r).__name__ for r in rows] == ["DatasetRow", "RowProblem", "RowProblem", "RowProblem", "RowProblem"]
    assert "not valid JSON" in rows[1].reason
    assert "not a JSON object" in rows[2].reason
    assert rows[3].id == "bad" and "prompt" in rows[3].reason
    assert "surprise" in rows[4].reason


def test_ids_are_derived_from_content_and_stable(tmp_path):
    url = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "same"}, {"prompt": "same"}, {"prompt": "other"}])
    ids = [row.id for row in iter_rows(url)]
    assert ids == [row.id for row in iter_rows(url)]
    assert ids[1] == f"{ids[0]}-2"
    assert len(set(ids)) == 3 and all(i.startswith("row-") for i in ids)


@pytest.mark.parametrize("duplicate", ["a", "row-1", "row-0123456789ab"], ids=["plain", "row-prefixed", "derived-looking"])
def test_duplicate_ids_reject_the_dataset_up_front(tmp_path, duplicate):
    """Explicit ids are never renamed, even ones shaped like the ids the sweep derives."""
    url = write_jsonl(tmp_path / "d.jsonl", [{"id": duplicate}, {"id": "b"}, {"id": duplicate}])
    with pytest.raises(DatasetError, match=f"rows 0 and 2 share the id '{duplicate}'"):
        scan_dataset(url)


def test_parquet_rows_with_json_string_columns(tmp_path):
    path = tmp_path / "d.parquet"
    table = pa.table(
        {
            "id": ["p1", "p2"],
            "prompt": [json.dumps([{"role": "user", "content": "q"}]), "just text"],
            "metadata": [json.dumps({"harbor_task_id": "t"}), None],
        }
    )
    pq.write_table(table, path)
    rows = list(iter_rows(str(path)))
    assert rows[0].prompt == [{"role": "user", "content": "q"}] and rows[0].task_id == "t"
    assert rows[1].prompt == [{"role": "user", "content": "just text"}] and rows[1].metadata == {}


def test_unreadable_and_unknown_datasets_are_configuration_errors(tmp_path):
    with pytest.raises(DatasetError, match="cannot open dataset"):
        scan_dataset(str(tmp_path / "missing.jsonl"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DatasetError, match="unknown dataset format"):
        scan_dataset(str(tmp_path / "d.csv"))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match="not a readable Parquet"):
        scan_dataset(str(tmp_path / "bad.parquet"))


def test_scan_fingerprints_the_rows(tmp_path):
    first = scan_dataset(write_jsonl(tmp_path / "a.jsonl", [{"id": "a"}, "{oops"]))
    second = scan_dataset(write_jsonl(tmp_path / "b.jsonl", [{"id": "a", "label": 1}, "{oops"]))
    assert (first.rows, first.problems) == (2, 1)
    assert first.fingerprint != second.fingerprint
    assert isinstance(list(iter_rows(str(tmp_path / "a.jsonl")))[1], RowProblem)
