"""What the launchers decide, pure: whether a worker's exit ends a job and what launch says of
each rank (verdict), which role each task of a scheduler's step runs (task_layout). No I/O, no
clock reads, no threads (tests/house/test_layers.py gates this folder whole); launch/ around it
starts and watches the processes."""
