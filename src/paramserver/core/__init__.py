"""The shared vocabulary of every layer: key ranges, registries, options, units. Pure."""
