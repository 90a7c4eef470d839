"""The worker-side client: KVWorker, its coordinator session and shard requests, the torch API."""
