"""The simulator's core, pure: the event engine, its link and compute models, membership
schedules and the step columns. No I/O, no clock reads, no threads (tests/house/test_layers.py
gates this folder whole); sim/ around it reads traces, writes records and runs the command."""
