"""The worker client's pure part: its bookkeeping of requests, replies, chunks and lent frames
(worker_core: `WorkerCore`) and which shard map it follows while servers join and leave
(reshard: `LayoutFollower`). No I/O, no clock reads, no threads (tests/house/test_layers.py
gates this folder whole); client/ around it owns the sockets, the heartbeat thread and the
torch API."""
