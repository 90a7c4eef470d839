"""What the report concludes, pure: the diagnosis of each run's waits and the timeline of a
run's records. No I/O, no clock reads, no threads (tests/house/test_layers.py gates this folder
whole); report/ around it reads run folders and writes the page, figures and tables."""
