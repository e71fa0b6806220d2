"""``plan``: rows × attempts for compare to detect a difference, from a run's own spread."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_compare_cli import run_folder
from typer.testing import CliRunner

from prefect_harbor.cli.commands import app
from prefect_harbor.stats.planning import detectable, paired_power, plan, rows_needed, spread_of


@pytest.mark.parametrize(("effect", "rows"), [(0.2, 199), (0.5, 34), (0.8, 15)])
def test_rows_needed_are_the_paired_t_tests_published_sample_sizes(effect, rows):
    """Cohen's small, medium and large effects at 80% power and α = 0.05 (G*Power's and statsmodels' 198.2, 33.4, 14.3)."""
    assert rows_needed(effect, 1.0) == rows
    assert paired_power(rows, effect, 1.0) >= 0.8 > paired_power(rows - 1, effect, 1.0)
    assert detectable(rows, 1.0) <= effect < detectable(rows - 1, 1.0)


def test_power_far_in_the_tail_is_a_number_not_nan():
    assert paired_power(300, 0.5, 1.0) == pytest.approx(1.0) and paired_power(10**6, 0.01, 1.0) == pytest.approx(1.0)
    assert rows_needed(1e-4, 1.0) is None, "past a million rows the difference is too small to see"


def test_the_within_row_spread_is_the_pooled_variance_of_each_rows_attempts():
    groups = [[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.5, 0.25]]
    spread = spread_of(groups)
    pooled = sum(np.var(g, ddof=1) * (len(g) - 1) for g in groups) / sum(len(g) - 1 for g in groups)
    assert spread.within == pytest.approx(pooled) and not spread.within_is_bound
    single = spread_of([[1.0], [0.0], [1.0], [1.0]])
    assert single.within_is_bound and single.within == pytest.approx(np.var([1, 0, 1, 1], ddof=1)), "one attempt a row: the whole variance, an upper bound"


def test_a_plan_counts_attempts_as_the_scoring_contract_does():
    records = [
        {"row_id": "a", "status": "success", "reward": 1.0}, {"row_id": "a", "status": "failure", "reward": None, "err_category": "timeout", "err_phase": "agent"},
        {"row_id": "b", "status": "success", "reward": 1.0}, {"row_id": "b", "status": "failure", "reward": None, "err_category": "verifier_error"},
        {"row_id": "c", "status": "cancelled", "reward": None},
    ]  # fmt: skip
    made = plan(records, 0.1, attempts=[1, 4])
    assert (made.spread.rows, made.spread.attempts) == (2, 3), "the agent failure counts as 0; not scored and cancelled do not count"
    assert made.spread.within == pytest.approx(0.5) and [o.attempts for o in made.options] == [1, 4]
    assert made.options[1].rows < made.options[0].rows and made.options[1].trials == made.options[1].rows * 4


def test_the_plan_command_prints_rows_and_trials_per_attempt_count_and_refuses_what_it_cannot_plan(tmp_path):
    folder = run_folder(tmp_path, "a", {f"t-{i}": float(i % 3 == 0) for i in range(12)})
    answer = CliRunner().invoke(app, ["plan", str(folder), "--difference", "0.1", "--json"])
    assert answer.exit_code == 0, answer.output
    made = json.loads(answer.stdout)
    assert [o["attempts"] for o in made["options"]] == [1, 2, 4, 8] and made["spread"]["within_is_bound"] is True
    text = CliRunner().invoke(app, ["plan", str(folder), "--difference", "0.1"])
    assert "Each of the two runs needs" in text.stdout and "an upper bound" in text.stdout and "Assumes the change moves every row alike" in text.stdout
    lone = run_folder(tmp_path, "b", {"t-1": 1.0})
    refused = CliRunner().invoke(app, ["plan", str(lone), "--difference", "0.1"])
    assert refused.exit_code == 2 and "a plan needs a run with at least two counted attempts" in refused.output
