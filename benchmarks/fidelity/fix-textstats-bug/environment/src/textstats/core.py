import re
from collections import Counter

_WORD = re.compile(r"[A-Za-z]+")


def words(text: str) -> list[str]:
    """The words of ``text`` in order, lower-cased."""
    return [w.lower() for w in _WORD.findall(text)]


def mean_word_length(text: str) -> float:
    found = words(text)
    return sum(len(w) for w in found) / len(found)


def top_words(text: str, n: int = 3) -> list[tuple[str, int]]:
    counts = Counter(words(text))
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]
