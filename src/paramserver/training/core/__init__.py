"""The worker's pure part: `--amp` mixed precision on torch's autocast and GradScaler
(amp: `MixedPrecision`). No I/O, no clock reads, no threads, no draws
(tests/house/test_layers.py gates this folder whole); training/ around it runs the worker's
loop, its pacing and the evaluator."""
