from pathlib import Path

from expected import EXPECTED


def test_the_sum_is_written():
    assert int(Path("/app/sum.txt").read_text().strip()) == EXPECTED
