"""The data sets' pure part: the changing-size batch sampler over one worker's shard, reshuffled
per epoch from its own seeded generator (sampler: `BatchSampler`, `take_rows`). No I/O, no clock
reads, no threads, no unseeded draws (tests/house/test_layers.py gates this folder whole); data/
around it reads the data sets' files and builds the synthetic ones."""
