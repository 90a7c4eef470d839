"""The run folder's files: metrics records and their summary, checkpoints, progress."""
