"""What observe computes, pure: the link-probe verdicts, the stall detector and its report,
the running statistics, the Chrome trace of a run's records. No I/O, no clock reads, no
threads (tests/house/test_layers.py gates this folder whole); observe/ around it follows
files and sockets, serves Prometheus and draws the live view."""
