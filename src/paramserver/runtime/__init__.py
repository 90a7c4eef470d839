"""The live system: coordinator, shard servers, worker client and the local launcher."""
