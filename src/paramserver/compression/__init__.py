"""Gradient compressors for sparse pushes (`make_compressor(name, **options)`), issue 7.

    >>> c = make_compressor("topk", fraction=0.01)
    >>> sparse = c.compress(grad)          # Sparse(keys int64 sorted, values, dense_size)
    >>> kv.push_sparse(sparse.keys, sparse.values, step=s, batch=b)

Schemes: none (identity), topk (static fraction), std (|g| > k*std), dynamic (carried
threshold). Each keeps the unsent part in a residual (error_feedback=True) and can apply
Deep Gradient Compression's momentum correction (momentum > 0); with it the server should
run plain SGD, since the pushed values already carry the momentum.
"""

from __future__ import annotations

from paramserver.compression.base import CompressStats, Compressor, FeedbackOptions
from paramserver.compression.dense import Dense
from paramserver.compression.dynamic import DynamicThreshold
from paramserver.compression.encoding import KEY_ENCODINGS, EncodedKeys, decode_keys, encode_keys
from paramserver.compression.sparse import Sparse, densify
from paramserver.compression.std import StdThreshold
from paramserver.compression.topk import TopK
from paramserver.core.options import option_help
from paramserver.core.registry import Registry

COMPRESSORS: Registry[type[Compressor]] = Registry("compressor")
COMPRESSORS.register("none")(Dense)
COMPRESSORS.register("topk")(TopK)
COMPRESSORS.register("std")(StdThreshold)
COMPRESSORS.register("dynamic")(DynamicThreshold)


def make_compressor(name: str, **options) -> Compressor:
    """Build the compressor registered as `name`; unknown names or options list the known."""
    return COMPRESSORS.get(name)(**options)


def compressor_options(name: str) -> dict:
    """name -> (default, help) of every option the compressor registered as `name` takes."""
    return option_help(COMPRESSORS.get(name))


__all__ = ["COMPRESSORS", "CompressStats", "Compressor", "Dense", "DynamicThreshold",
           "EncodedKeys", "FeedbackOptions", "KEY_ENCODINGS", "Sparse", "StdThreshold", "TopK",
           "compressor_options", "decode_keys", "densify", "encode_keys", "make_compressor"]
