"""The estimators behind a sweep's numbers, checked against known values and against Harbor's own code."""

import math
import random
from datetime import UTC, datetime

import numpy as np
import pytest
from harbor.metrics.mean import Mean
from harbor.models.agent.context import AgentContext
from harbor.models.trial.result import StepResult, TrialResult
from harbor.models.verifier.result import VerifierResult
from harbor.utils.pass_at_k import compute_pass_at_k_by_evals
from scipy import stats
from trial_results import exception_info
from trial_results import trial_result as real_trial_result

from prefect_harbor.stats.compare import compare, holm, paired_test
from prefect_harbor.stats.estimators import (
    ALL_EQUAL,
    BOOTSTRAP,
    BOOTSTRAP_SEED,
    TOO_FEW,
    WILSON,
    WILSON_CLUSTERED,
    clustered_mean,
    mean_difference,
    pass_at_k,
    pass_at_k_curve,
)
from prefect_harbor.stats.summary import summarize
from prefect_harbor.storage.results import RowResult
from prefect_harbor.trial.outcome import outcome

T0 = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.mark.parametrize(("passes", "rows"), [(6, 7), (0, 5), (5, 5), (1, 2), (37, 100), (1, 1)])
def test_one_attempt_per_row_of_0_or_1_is_scipys_wilson_interval(passes, rows):
    estimate = clustered_mean([[1.0]] * passes + [[0.0]] * (rows - passes))
    expected = stats.binomtest(passes, rows).proportion_ci(confidence_level=0.95, method="wilson")
    assert estimate.ci95 == pytest.approx((expected.low, expected.high), abs=1e-12)
    assert estimate.method == WILSON


@pytest.mark.parametrize(
    "rows",
    [
        [[1.0]] * 6 + [[0.0]],  # the demo: 0.857 (95% CI 0.508 to 1.21) under the t interval
        [[1.0, 0.0]],  # --attempts 2 from the run form: 0.5 (95% CI -5.85 to 6.85)
        [[1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 1.0]],  # three tasks x 3 attempts: [-0.77, 2.10]
        [[1.0, 1.0], [1.0, 1.0]],
        [[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]],
    ],
)
def test_an_interval_of_0_or_1_rewards_stays_inside_0_to_1(rows):
    estimate = clustered_mean(rows)
    low, high = estimate.ci95
    assert 0.0 <= low <= estimate.mean <= high <= 1.0


def test_attempts_of_a_row_are_clustered_so_the_interval_does_not_shrink_by_repetition():
    rows = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]] * 3
    clustered = clustered_mean(rows)
    as_if_independent = clustered_mean([[v] for row in rows for v in row])
    # Identical attempts add no information: the clustered error is that of the 12 rows, not of 36 draws.
    assert clustered.se == pytest.approx(clustered_mean([[v] for v, *_ in rows]).se)
    assert clustered.se > as_if_independent.se * 1.5
    assert (clustered.n, clustered.clusters, clustered.method) == (36, 12, WILSON_CLUSTERED)
    # By hand: G/(G-1) * sum over rows of (sum of deviations)^2 / N^2.
    assert clustered.se == pytest.approx(math.sqrt(12 / 11 * (12 * 1.5**2) / 36**2))
    # Worth about its 12 rows: wider than scipy's Wilson interval over 36 independent draws.
    independent = stats.binomtest(18, 36).proportion_ci(method="wilson")
    assert clustered.ci95[0] < independent.low and clustered.ci95[1] > independent.high


def test_attempts_that_disagree_within_every_row_count_as_independent_draws_at_most():
    rows = [[1.0, 0.0]] * 6  # every row's mean is the overall mean: no more than 12 draws' worth
    wilson = stats.binomtest(6, 12).proportion_ci(method="wilson")
    assert clustered_mean(rows).ci95 == pytest.approx((wilson.low, wilson.high))


def test_other_rewards_get_scipys_bootstrap_over_rows_inside_the_rewards_range():
    generator = random.Random(7)
    rows = [[generator.choice((0.2, 0.25, 0.9)) for _ in range(2)] for _ in range(15)]
    estimate = clustered_mean(rows)
    assert estimate.method == BOOTSTRAP
    values = [v for row in rows for v in row]
    assert min(values) <= estimate.ci95[0] < estimate.mean < estimate.ci95[1] <= max(values)
    # The same as scipy's own BCa bootstrap of the pooled mean over resampled rows, with the same seed.
    sums, sizes = np.array([sum(row) for row in rows]), np.array([len(row) for row in rows], dtype=float)
    # Its level widened as Hesterberg's expanded interval: the normal quantile sqrt(15/14) * t(0.975, 14) = 2.2204.
    level = 1 - 2 * stats.norm.cdf(-math.sqrt(15 / 14) * 2.1448)
    expected = stats.bootstrap(
        (np.arange(len(rows)),), lambda i, axis=-1: sums[i].sum(axis=axis) / sizes[i].sum(axis=axis), vectorized=True,
        n_resamples=9_999, method="BCa", confidence_level=level, rng=np.random.default_rng(BOOTSTRAP_SEED),
    ).confidence_interval  # fmt: skip
    assert estimate.ci95 == pytest.approx((expected.low, expected.high))
    assert clustered_mean(rows) == estimate  # seeded: the same figures each time a run's summary is computed


def test_too_few_rows_or_no_spread_give_no_interval_and_say_why():
    few = clustered_mean([[0.5], [0.7], [0.2]])
    assert few.ci95 is None and few.method == TOO_FEW and "at least 10" in few.method
    flat = clustered_mean([[0.5]] * 12)
    assert flat.ci95 is None and flat.method == ALL_EQUAL
    assert clustered_mean([[], []]) is None


def test_a_difference_of_runs_is_never_taken_for_a_0_or_1_reward():
    """Differences of 0 or 1 are not rewards: no Wilson interval (it would claim [0, 0.35] for no change)."""
    assert mean_difference([0.0] * 12).ci95 is None
    assert mean_difference([1.0, 0.0] * 3).method == TOO_FEW
    spread = mean_difference([-1.0, 0.0, 0.0, 1.0, -1.0, -1.0, 0.0, 0.0, -1.0, 0.0, 0.0, -1.0])
    assert -1.0 <= spread.ci95[0] < spread.mean < spread.ci95[1] <= 1.0


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


def test_compare_tests_each_task_with_mcnemars_exact_test_adjusted_by_holm():
    """One task went from 8/8 to 0/8, a coin-flip task's two rows went 1 -> 0 (the issue's case)."""
    def run(rewards: dict[str, float]) -> list[dict]:
        return [{"row_id": row, "task": row.split("-")[0], "attempt": 1, "status": "success", "reward": reward} for row, reward in rewards.items()]

    rows = [f"always-{i}" for i in range(8)] + ["coin-1", "coin-2"]
    comparison = compare(run(dict.fromkeys(rows, 1.0)), run(dict.fromkeys(rows, 0.0)), "A", "B")
    always, coin = comparison.per_task["always"], comparison.per_task["coin"]
    # McNemar's exact test is the exact binomial test of the rows that changed, as scipy computes it.
    assert always.p_value == pytest.approx(stats.binomtest(0, 8, 0.5).pvalue) == pytest.approx(2 / 2**8)
    assert coin.p_value == pytest.approx(stats.binomtest(0, 2, 0.5).pvalue) == pytest.approx(0.5)
    assert (always.p_adjusted, coin.p_adjusted) == pytest.approx((2 * 2 / 2**8, 0.5))  # Holm over two tasks
    assert (always.verdict, coin.verdict, comparison.difference.verdict) == ("worse", "no clear change", "worse")
    assert comparison.regressed() == ["overall", "always"]
    # Every row dropped by 1: no spread to resample, so no interval (not "-1 to -1", not "-1.03 to -0.504").
    assert comparison.difference.difference.ci95 is None and comparison.difference.difference.method == ALL_EQUAL
    assert comparison.phrase() == "2 tasks lower than run A: always −1 (p=0.016), coin −1 (p=0.5, could be chance)"


def test_holm_adjusts_as_the_step_down_method_does():
    assert holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert holm([0.5, 0.8]) == pytest.approx([1.0, 1.0])


def test_continuous_differences_get_a_paired_permutation_test_as_scipys():
    pairs = [(0.2, 0.5), (0.3, 0.6), (0.1, 0.15), (0.4, 0.35), (0.5, 0.9), (0.6, 0.8)]
    test, p = paired_test(pairs)
    before, after = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
    exact = stats.permutation_test((before, after), lambda x, y, axis=-1: np.mean(y - x, axis=axis), permutation_type="samples", vectorized=True)
    assert test == "paired permutation test" and p == pytest.approx(exact.pvalue)  # 2^6 pairings: exact either way


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
    assert comparison.phrase() == "1 task lower than run A: a −0.5 (p=1, could be chance); 1 row newly failing"


def test_a_row_run_more_times_with_the_same_outcome_has_not_changed():
    once = [{"row_id": "a-1", "task": "a", "attempt": 1, "status": "success", "reward": 1.0}, {"row_id": "b-1", "task": "b", "attempt": 1, "status": "success", "reward": 1.0}]
    thrice = [{"row_id": "a-1", "task": "a", "attempt": k, "status": "success", "reward": 1.0} for k in (1, 2, 3)]
    thrice += [
        {"row_id": "b-1", "task": "b", "attempt": k, "status": status, "reward": 1.0 if status == "success" else None}
        for k, status in ((1, "success"), (2, "failure"), (3, "success"))
    ]
    assert [c.row_id for c in compare(once, thrice, "A", "B").changed] == ["b-1"]
