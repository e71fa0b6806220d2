"""The v0.2 API scan behind `prefect-harbor check --code-dir`."""

from prefect_harbor.cli.migration import scan_for_removed_apis


def test_every_removed_api_is_found_with_file_and_line(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "workflow.py").write_text(
        "from osmosis_ai import HarborBackendV2, MultiTurnMode\n"
        "ok = ctx.sample\n"
        "for s in ctx.samples:\n"
        "    set_sample_reward(s, 1.0)\n"
        "backend = HarborBackendV2(task_dir=p, user_code_dir=q, workflow=W)\n"
        "headers = {'x-rollout-id': 1}\n"
    )
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "lib.py").write_text("HarborBackendV2\n")
    hits = scan_for_removed_apis(tmp_path)
    found = {(hit.path.name, hit.line, hit.replacement.split(" ")[0]) for hit in hits}
    assert (("workflow.py", 1, "HarborBackend")) in found
    assert {hit.line for hit in hits} == {1, 3, 4, 5, 6}, "ctx.sample (v0.3) is not a hit; .venv is skipped"
    assert sum(hit.line == 5 for hit in hits) == 4  # the class and three keywords
    assert "workflow.py:3:" in str(next(h for h in hits if h.line == 3))


def test_a_clean_project_has_no_hits(tmp_path):
    (tmp_path / "w.py").write_text("backend = HarborBackend(tasks_dir=p, task_mode='template', agent='pkg.w:W')\n")
    assert scan_for_removed_apis(tmp_path) == []
