"""Bounds on what a verifier writes (issue 28): reward files read up to 1 MiB and 1,000 keys,
rewards within the backend's reward_range, messages of a few KiB, outputs read from their end."""

import json
from datetime import UTC, datetime

import pytest
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths
from harbor.models.verifier.result import VerifierResult
from harbor.verifier.verifier import VerifierOutputParseError
from paths import EXAMPLE_TASKS
from tasks_factory import write_separate_verifier_task
from trial_results import trial_result

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.bounds import MESSAGE_CHARS, bounded, read_tail
from prefect_harbor.storage.results import RowResult
from prefect_harbor.trial.bounded_verifier import BoundedVerifier, RewardFileTooLargeError, image_brings_tests
from prefect_harbor.trial.outcome import outcome, verifier_output_tail

BASE = RowResult(row_index=0, row_id="r", status="failure")


def verifier(tmp_path) -> BoundedVerifier:
    paths = TrialPaths(tmp_path / "trial")
    paths.verifier_dir.mkdir(parents=True)
    return BoundedVerifier(task=Task(EXAMPLE_TASKS / "reward-txt"), trial_paths=paths, environment=None)


def test_a_reward_json_over_one_mib_is_refused_before_it_is_read(tmp_path):
    check = verifier(tmp_path)
    check.trial_paths.reward_json_path.write_text(json.dumps({"reward": "x" * (2 << 20)}))
    with pytest.raises(RewardFileTooLargeError, match=r"verifier/reward.json is 2,097,1\d\d bytes; a sweep reads reward files of at most 1,048,576"):
        check._parse_reward_json()


def test_a_reward_txt_over_one_mib_is_refused_too(tmp_path):
    check = verifier(tmp_path)
    check.trial_paths.reward_text_path.write_text("1" + " " * (2 << 20))
    with pytest.raises(RewardFileTooLargeError, match="verifier/reward.txt is"):
        check._parse_reward_text()


def test_a_reward_json_of_more_than_1000_keys_is_refused(tmp_path):
    check = verifier(tmp_path)
    check.trial_paths.reward_json_path.write_text(json.dumps({f"k{n}": 1 for n in range(1001)}))
    with pytest.raises(RewardFileTooLargeError, match="holds 1,001 keys; a sweep reads at most 1,000"):
        check._parse_reward_json()
    check.trial_paths.reward_json_path.write_text(json.dumps({f"k{n}": 1 for n in range(1000)}))
    assert len(check._parse_reward_json()) == 1000


def test_harbors_own_checks_still_apply(tmp_path):
    check = verifier(tmp_path)
    check.trial_paths.reward_json_path.write_text('{"reward": "high"}')
    with pytest.raises(VerifierOutputParseError, match="Non-numeric reward"):
        check._parse_reward_json()


def test_a_separate_verifier_that_brings_its_tests_gets_no_upload_and_the_others_do(tmp_path):
    own = write_separate_verifier_task(tmp_path, "own", "CORRECT")
    fresh = write_separate_verifier_task(tmp_path, "fresh", "CORRECT", own_image=False)
    assert image_brings_tests(Task(own), None) and not image_brings_tests(Task(fresh), None)
    assert not image_brings_tests(Task(EXAMPLE_TASKS / "reward-txt"), None)


def scored(rewards: dict, reward_range="finite", spec="reward") -> RowResult:
    result = trial_result(started_at=datetime.now(UTC), finished_at=datetime.now(UTC), verifier_result=VerifierResult(rewards=rewards))
    return outcome(BASE, result, spec, reward_range)


def test_a_reward_outside_the_reward_range_is_a_verifier_error_naming_it():
    """Issue 28: {"reward": 1e308} was accepted, and one such row made the sweep's mean 5.6e306."""
    row = scored({"reward": 1e308}, [0, 1])
    assert (row.status, row.err_category, row.reward) == ("failure", "verifier_error", None)
    assert "reward = 1e+308 is outside the backend's reward_range [0, 1]" in row.err_message
    assert scored({"reward": 1e308}).reward == 1e308, "the default stays 'finite'"
    assert scored({"reward": 1.0}, [0, 1]).reward == 1.0


def test_the_reward_range_applies_to_the_keys_the_reward_is_made_of():
    assert scored({"a": 1, "b": 0.5, "runtime_ms": 3400}, [0, 1], "mean(a, b)").reward == 0.75
    row = scored({"a": 2, "b": 0}, [0, 1], "mean(a, b)")
    assert row.err_category == "verifier_error" and "a = 2 is outside" in row.err_message


def test_a_bad_reward_range_is_a_configuration_error():
    with pytest.raises(ValueError, match=r"reward_range: \[1.0, 0.0\] is not \[low, high\]"):
        HarborBackend(tasks_dir=EXAMPLE_TASKS, agent="oracle", reward_range=[1, 0])


def test_a_rows_messages_keep_their_last_few_kib_and_say_how_much_was_cut():
    text = "start " + "x" * 100_000 + " the end"
    row = BASE.model_copy(update={"err_message": text, "archive_error": text})
    for message in (row.err_message, row.archive_error, RowResult(row_index=0, row_id="r", status="failure", err_message=text).err_message):
        assert len(message) <= MESSAGE_CHARS and message.endswith(" the end") and message.startswith("[95,982 characters cut]")
    row.err_message = text
    assert len(row.err_message) <= MESSAGE_CHARS
    assert bounded("short") == "short"


def test_the_verifiers_output_is_read_from_its_end(tmp_path):
    (tmp_path / "verifier").mkdir()
    (tmp_path / "verifier" / "test-stdout.txt").write_text("noise\n" * 5_000_000 + "FAILED test_x\n")
    assert read_tail(tmp_path / "verifier" / "test-stdout.txt").endswith("FAILED test_x\n")
    assert verifier_output_tail(tmp_path).endswith("FAILED test_x")
