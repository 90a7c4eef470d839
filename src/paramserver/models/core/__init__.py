"""The models' pure part: a model's parameters laid out as one flat key space and copied in and
out (keyspace: `ModelKeys`), and the exact ROC AUC the evaluator scores with (auc). No I/O, no
clock reads, no threads, no draws (tests/house/test_layers.py gates this folder whole); models/
around it builds the networks, whose initial weights are drawn from torch's generator."""
