"""advise's prediction, pure: the cluster model, the convergence model and its fit, the
simulated outcome of each candidate, the recommendation and its held-out validation. No I/O,
no clock reads, no threads (tests/house/test_layers.py gates this folder whole); advise/
around it profiles live runs, reads and writes calibrations."""
