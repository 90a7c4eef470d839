"""The shard server role: a key range's values, optimizer state, pulls and exactly-once pushes."""
