"""Small text statistics used by the reporting jobs."""

from .core import mean_word_length, top_words, words

__all__ = ["mean_word_length", "top_words", "words"]
