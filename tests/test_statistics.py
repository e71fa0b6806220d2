"""The estimators behind a sweep's numbers, checked against known values and against Harbor's own code."""

import math
import random
from datetime import UTC, datetime

import pytest
from harbor.metrics.mean import Mean
from harbor.models.agent.context import AgentContext
from harbor.models.trial.result import StepResult, TrialResult
from harbor.models.verifier.result import VerifierResult
from harbor.utils.pass_at_k import compute_pass_at_k_by_evals
from trial_results import exception_info
from trial_results import trial_result as real_trial_result

from prefect_harbor.stats.compare import compare
from prefect_harbor.stats.estimators import clustered_mean, pass_at_k, pass_at_k_curve, t_quantile
from prefect_harbor.stats.summary import summarize
from prefect_harbor.storage.results import RowResult
from prefect_harbor.trial.outcome import outcome

T0 = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(("df", "expected"), [(1, 12.7062), (2, 4.3027), (6, 2.4469), (10, 2.2281), (30, 2.0423), (1000, 1.9623)])
def test_t_quantiles_match_the_tables(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=5e-5)


def test_one_attempt_per_row_is_the_ordinary_standard_error():
    values = [1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 1.0]
    estimate = clustered_mean([[v] for v in values])
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    assert estimate.mean == pytest.approx(mean)
    assert estimate.se == pytest.approx(sd / math.sqrt(len(values)))
    assert estimate.ci95 == pytest.approx((mean - 2.4469 * estimate.se, mean + 2.4469 * estimate.se), abs=1e-4)
    assert estimate.method == "t interval, standard error of the mean"


def test_attempts_of_a_row_are_clustered_so_the_interval_does_not_shrink_by_repetition():
    rows = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    clustered = clustered_mean(rows)
    as_if_independent = clustered_mean([[v] for row in rows for v in row])
    # Identical attempts add no information: the clustered error is that of the 4 rows, not of 12 draws.
    assert clustered.se == pytest.approx(clustered_mean([[1.0], [0.0], [1.0], [0.0]]).se)
    assert clustered.se > as_if_independent.se * 1.5
    assert (clustered.n, clustered.clusters, clustered.method) == (12, 4, "t interval, standard error clustered by row (CR1)")
    # By hand: G/(G-1) * sum over rows of (sum of deviations)^2 / N^2.
    assert clustered.se == pytest.approx(math.sqrt(4 / 3 * (4 * 1.5**2) / 144))


def test_no_interval_with_one_row_and_nothing_without_values():
    assert clustered_mean([[1.0, 0.0]]).ci95 is None
    assert clustered_mean([[], []]) is None


@pytest.mark.parametrize(("n", "c", "k"), [(10, 3, 1), (10, 3, 5), (5, 0, 2), (5, 5, 3), (7, 6, 2), (3, 1, 3)])
def test_pass_at_k_is_one_minus_the_chance_that_k_draws_all_fail(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_curve_stops_at_the_fewest_attempts():
    assert list(pass_at_k_curve([(3, 1), (2, 0)])) == [1, 2]
    assert pass_at_k_curve([]) == {}


def trial_result(task: str, trial: str, reward: float | None, error: str | None = None, agent: str = "oracle") -> TrialResult:
    """A real Harbor TrialResult, as a finished trial's result.json holds it."""
    return real_trial_result(
        task, trial, agent, verifier_result=None if reward is None else VerifierResult(rewards={"reward": reward}),
        exception_info=None if error is None else exception_info(error, T0, error), started_at=T0, finished_at=T0,
    )  # fmt: skip


def as_rows(trials: list[tuple[str, int, TrialResult]]) -> list[dict]:
    """The same trials as this sweep records them: each through the row mapping (``outcome``), one dataset row per task."""
    rows = []
    for index, (task, attempt, trial) in enumerate(trials):
        base = RowResult(row_index=index, row_id=task, attempt=attempt, task=task, status="failure", trial_name=trial.trial_name)
        rows.append(outcome(base, trial).model_dump())
    return rows


def test_pass_at_k_matches_harbors_own_estimator_on_the_same_trials():
    generator = random.Random(29)
    trials = []
    for number in range(12):
        task, skill = f"task-{number}", generator.random()
        for attempt in range(1, 11):
            failed = generator.random() < 0.1  # an agent error: no verifier result, Harbor counts a 0
            reward = None if failed else float(generator.random() < skill)
            trials.append((task, attempt, trial_result(task, f"{task}__{attempt}", reward, "NonZeroAgentExitCodeError" if failed else None)))
    harbor = compute_pass_at_k_by_evals([trial for *_, trial in trials])
    (harbor_curve,) = harbor.values()
    ours = summarize(as_rows(trials), attempts=10)

    assert sorted(harbor_curve) == [2, 4, 5, 8, 10]  # Harbor reports these k; ours has every k from 1
    assert set(harbor_curve) <= set(ours.pass_at_k) and list(ours.pass_at_k) == list(range(1, 11))
    for k, value in harbor_curve.items():
        assert ours.pass_at_k[k] == pytest.approx(value, abs=1e-12), k
    assert ours.pass_at_k[1] == pytest.approx(sum(t.verifier_result is not None and t.verifier_result.rewards["reward"] == 1 for *_, t in trials) / len(trials))
    for task, figures in ours.per_task.items():  # one row per task: the row's pass@k is the task's
        (task_curve,) = compute_pass_at_k_by_evals([t for name, _, t in trials if name == task]).values()
        assert figures.pass_at_k[10] == pytest.approx(task_curve[10])


def test_pass_at_k_is_not_given_for_rewards_other_than_zero_or_one_as_harbor_refuses_them():
    trials = [("a", 1, trial_result("a", "a1", 0.5)), ("a", 2, trial_result("a", "a2", 1.0))]
    assert compute_pass_at_k_by_evals([t for *_, t in trials]) == {}
    ours = summarize(as_rows(trials))
    assert ours.pass_at_k == {} and "0 or 1" in ours.pass_at_k_note and "0.5" in ours.pass_at_k_note
    assert ours.reward.mean == 0.75


def test_the_mean_is_over_scored_attempts_and_cancelled_attempts_count_for_nothing():
    rows = [
        {"row_id": "r1", "attempt": 1, "task": "t", "status": "success", "reward": 1.0},
        {"row_id": "r1", "attempt": 2, "task": "t", "status": "failure", "reward": None},
        {"row_id": "r1", "attempt": 3, "task": "t", "status": "cancelled", "reward": None},
        {"row_id": "r2", "attempt": 1, "task": "u", "status": "success", "reward": 0.0},
        {"row_id": "r2", "attempt": 2, "task": "u", "status": "success", "reward": 1.0},
        {"row_id": "r2", "attempt": 3, "task": "u", "status": "success", "reward": 1.0},
    ]
    stats = summarize(rows, attempts=3)
    assert (stats.rows, stats.trials, stats.scored, stats.attempts) == (2, 6, 4, 3)
    assert stats.reward.mean == pytest.approx(0.75) and stats.reward.clusters == 2
    # r1 finished 2 attempts (1 pass), r2 3 (2 passes): k goes up to 2, the fewest finished.
    assert stats.pass_at_k == pytest.approx({1: (0.5 + 2 / 3) / 2, 2: (1.0 + 1.0) / 2})
    assert stats.per_task["t"].pass_at_k == {1: 0.5, 2: 1.0}
    assert stats.verifier_flagged == 0


def test_tokens_and_cost_sum_every_attempt_and_every_step_as_harbor_does():
    single = trial_result("a", "a1", 1.0).model_copy(update={"agent_result": AgentContext(n_input_tokens=100, n_cache_tokens=40, n_output_tokens=10, cost_usd=0.01)})
    steps = trial_result("b", "b1", 1.0).model_copy(update={"step_results": [
        StepResult(step_name="one", agent_result=AgentContext(n_input_tokens=7, n_cache_tokens=1, n_output_tokens=3, cost_usd=0.002)),
        StepResult(step_name="two", agent_result=AgentContext(n_input_tokens=5, n_output_tokens=2, cost_usd=0.003)),
    ]})  # fmt: skip
    rows = as_rows([("a", 1, single), ("b", 1, steps), ("b", 2, trial_result("b", "b2", None, "AgentTimeoutError"))])
    assert (rows[1]["input_tokens"], rows[1]["cached_tokens"], rows[1]["output_tokens"]) == steps.compute_token_cost_totals()[:3] == (12, 1, 5)
    assert rows[1]["cost_usd"] == pytest.approx(0.005)
    stats = summarize(rows)
    assert stats.tokens.model_dump() == pytest.approx({"input_tokens": 112, "cached_tokens": 41, "output_tokens": 15, "cost_usd": 0.015})
    assert stats.per_task["b"].tokens.input_tokens == 12 and stats.per_task["a"].tokens.cost_usd == pytest.approx(0.01)


def test_flagged_verifier_output_is_counted_when_the_column_is_there():
    rows = [
        {"row_id": "a", "status": "success", "reward": 1.0, "verifier_tampering": "reward.txt rewritten after test.sh"},
        {"row_id": "b", "status": "success", "reward": 1.0, "verifier_tampering": None},
        {"row_id": "c", "status": "success", "reward": 1.0, "verifier_tampering": True},
        {"row_id": "d", "status": "success", "reward": 1.0, "verifier_tampering": False},
    ]
    assert summarize(rows).verifier_flagged == 2
    assert summarize([{k: v for k, v in r.items() if k != "verifier_tampering"} for r in rows]).verifier_flagged == 0


def test_harbors_mean_metric_counts_a_trial_without_reward_as_zero():
    # What the viewer's job result shows (Harbor's Mean), against the sweep's mean over scored attempts.
    assert Mean().compute([{"reward": 1.0}, None]) == {"mean": 0.5}
    assert summarize([{"row_id": "a", "status": "success", "reward": 1.0}, {"row_id": "b", "status": "failure", "reward": None}]).reward.mean == 1.0


def test_a_comparison_pairs_rows_and_names_what_changed():
    def run(rewards: dict[str, float | None]) -> list[dict]:
        return [
            {"row_id": row, "task": row.split("-")[0], "attempt": 1, "status": "failure" if reward is None else "success", "reward": reward}
            for row, reward in rewards.items()
        ]

    before = run({"a-1": 1.0, "a-2": 1.0, "b-1": 1.0, "b-2": 0.0, "c-1": 1.0, "gone-1": 1.0})
    after = run({"a-1": 0.0, "a-2": 1.0, "b-1": 1.0, "b-2": 1.0, "c-1": None, "new-1": 1.0})
    comparison = compare(before, after, "A", "B")
    assert comparison.paired_rows == 4 and (comparison.only_in_baseline, comparison.only_in_candidate) == (1, 1)
    assert comparison.difference.difference.mean == pytest.approx(0.0)
    assert comparison.per_task["a"].difference.mean == -0.5 and comparison.per_task["b"].difference.mean == 0.5
    assert comparison.worse_tasks() == {"a": -0.5}
    assert [c.row_id for c in comparison.changed] == ["a-1", "b-2", "c-1", "gone-1", "new-1"]
    assert comparison.newly_failing() == ["c-1"]
    assert comparison.phrase() == "1 task worse than run A: a −0.5; 1 row newly failing"


def test_a_row_run_more_times_with_the_same_outcome_has_not_changed():
    once = [{"row_id": "a-1", "task": "a", "attempt": 1, "status": "success", "reward": 1.0}, {"row_id": "b-1", "task": "b", "attempt": 1, "status": "success", "reward": 1.0}]
    thrice = [{"row_id": "a-1", "task": "a", "attempt": k, "status": "success", "reward": 1.0} for k in (1, 2, 3)]
    thrice += [
        {"row_id": "b-1", "task": "b", "attempt": k, "status": status, "reward": 1.0 if status == "success" else None}
        for k, status in ((1, "success"), (2, "failure"), (3, "success"))
    ]
    assert [c.row_id for c in compare(once, thrice, "A", "B").changed] == ["b-1"]
