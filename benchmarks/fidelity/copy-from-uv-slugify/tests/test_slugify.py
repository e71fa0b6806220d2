import sys
import unittest

sys.path.insert(0, "/app")
from slugify import slugify  # noqa: E402


class SlugifyTests(unittest.TestCase):
    def test_plain_words(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_punctuation_and_spaces_collapse(self):
        self.assertEqual(slugify("  Hello, World! 2024 "), "hello-world-2024")

    def test_no_hyphens_at_the_ends_or_doubled(self):
        self.assertEqual(slugify("--Already -- hyphenated--"), "already-hyphenated")

    def test_accents_are_folded_to_ascii(self):
        self.assertEqual(slugify("Crème Brûlée"), "creme-brulee")

    def test_runs_on_the_images_python(self):
        self.assertEqual(sys.version_info[:2], (3, 13))


if __name__ == "__main__":
    unittest.main()
