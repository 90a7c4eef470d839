"""paramserver: a parameter server for data-parallel deep learning with straggler-aware sync models."""

__version__ = "0.1.0"


def __getattr__(name):
    # The torch-backed API loads on first use, so role processes that never need it stay light.
    if name in ("DistributedOptimizer", "init", "rank", "size"):
        return getattr(user_api(), name)
    if name in ("BatchSampler", "DistributedSampler"):
        from paramserver.client import sampler
        return getattr(sampler, name)
    if name == "DistributedDataParallel":
        from paramserver.client import ddp
        return ddp.DistributedDataParallel
    raise AttributeError(f"module 'paramserver' has no attribute {name!r}")


_wired = False


def user_api():
    """paramserver.client.api with what a script run with plain python joins wired in (once):
    a job of one worker of its own (launch/standalone.py; the client does not import launch)."""
    global _wired
    from paramserver.client import api
    if not _wired:
        from paramserver.launch import standalone
        api.own_job, _wired = standalone, True
    return api
