"""Sparse tables: rows of a fixed dimension keyed by 64-bit ids, created on first push.

`init.initial_rows` gives every key the same starting row everywhere, `placement.shard_of`
places keys on shards, and `table.SparseTable` holds one shard's rows with their optimizer
state under a row budget (admission + eviction). All of it is pure: numpy arrays in and out.
"""
