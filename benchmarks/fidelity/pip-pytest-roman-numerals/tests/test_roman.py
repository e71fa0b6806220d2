import sys

import pytest

sys.path.insert(0, "/app")
import roman  # noqa: E402


@pytest.mark.parametrize("n, text", [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (90, "XC"), (400, "CD"), (1994, "MCMXCIV"), (3999, "MMMCMXCIX")])
def test_to_roman(n, text):
    assert roman.to_roman(n) == text
    assert roman.from_roman(text) == n


@pytest.mark.parametrize("n", [0, -1, 4000])
def test_out_of_range(n):
    with pytest.raises(ValueError):
        roman.to_roman(n)


@pytest.mark.parametrize("text", ["", "IIII", "IC", "VX", "MMMM", "abc"])
def test_not_canonical(text):
    with pytest.raises(ValueError):
        roman.from_roman(text)


def test_round_trip():
    assert all(roman.from_roman(roman.to_roman(n)) == n for n in range(1, 4000))
