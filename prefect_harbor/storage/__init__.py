"""A run's record in object storage: the run folder's writes and reads, the results table, per-row archives, live control files."""
