"""Rows, and which task each one runs: the dataset stream, task sources, old task formats."""
