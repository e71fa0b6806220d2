import textstats


def test_apostrophes_stay_inside_words():
    assert textstats.words("Don't stop, it's fine") == ["don't", "stop", "it's", "fine"]


def test_leading_and_trailing_quotes_are_not_words():
    assert textstats.words("'quoted' text") == ["quoted", "text"]


def test_mean_word_length_of_nothing_is_zero():
    assert textstats.mean_word_length("") == 0.0
    assert textstats.mean_word_length("  ,, ") == 0.0


def test_mean_word_length():
    assert textstats.mean_word_length("ab abcd") == 3.0


def test_top_words_unchanged():
    assert textstats.top_words("b a b c a b", 2) == [("b", 3), ("a", 2)]
