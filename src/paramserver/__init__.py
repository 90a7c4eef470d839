"""paramserver: a parameter server for data-parallel deep learning with straggler-aware sync models."""

__version__ = "0.1.0"


def __getattr__(name):
    # The torch-backed API loads on first use, so role processes that never need it stay light.
    if name in ("DistributedOptimizer", "init", "rank", "size"):
        from paramserver.client import api
        return getattr(api, name)
    if name in ("BatchSampler", "DistributedSampler"):
        from paramserver.client import sampler
        return getattr(sampler, name)
    raise AttributeError(f"module 'paramserver' has no attribute {name!r}")
