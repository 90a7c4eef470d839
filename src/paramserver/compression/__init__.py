"""Gradient compressors for sparse pushes (`make_compressor(name, **options)`), issue 7.

    >>> c = make_compressor("topk", fraction=0.01)
    >>> sparse = c.compress(grad)          # Sparse(keys int64 sorted, values, dense_size)
    >>> kv.push_sparse(sparse.keys, sparse.values, step=s, batch=b)

Schemes: none (identity), topk (static fraction), std (|g| > k*std), dynamic (carried
threshold). Each keeps the unsent part in a residual (error_feedback=True) and can apply
Deep Gradient Compression's momentum correction (momentum > 0); with it the server should
run plain SGD, since the pushed values already carry the momentum.

Value codecs (`make_codec(name, **options)`, issue 22) cut the bytes per value: fp32, fp16,
fp16-scaled, bf16, uniform8, quantile8, sign, randomk, powersgd (compression/codec.py and the
modules beside it). A compressor carries one for its values and charges the codec's error to
its residual:

    >>> c = make_compressor("topk", fraction=0.01, codec=make_codec("bf16"))
    >>> sparse = c.compress(grad)   # .values: what decodes, .encoded: the payload
"""

from __future__ import annotations

from paramserver.compression.base import CompressStats, Compressor, FeedbackOptions
from paramserver.compression.casts import Bf16, Fp16, Fp32, ScaledFp16
from paramserver.compression.codec import Codec, Encoded
from paramserver.compression.dense import Dense
from paramserver.compression.dynamic import DynamicThreshold
from paramserver.compression.encoding import KEY_ENCODINGS, EncodedKeys, decode_keys, encode_keys
from paramserver.compression.mixed import MixedCodec
from paramserver.compression.onebit import Sign
from paramserver.compression.powersgd import PowerSGD
from paramserver.compression.quant8 import Quantile8, Uniform8
from paramserver.compression.randomk import RandomK
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

CODECS: Registry[type[Codec]] = Registry("codec")
for _codec in (Fp32, Fp16, ScaledFp16, Bf16, Uniform8, Quantile8, Sign, RandomK, PowerSGD,
               MixedCodec):
    CODECS.register(_codec.name)(_codec)


def make_codec(name: str, **options) -> Codec:
    """Build the value codec registered as `name`; unknown names or options list the known."""
    return CODECS.get(name)(**options)


def codec_options(name: str) -> dict:
    """name -> (default, help) of every option the codec registered as `name` takes."""
    return option_help(CODECS.get(name))


def make_compressor(name: str, **options) -> Compressor:
    """Build the compressor registered as `name`; unknown names or options list the known."""
    return COMPRESSORS.get(name)(**options)


def compressor_options(name: str) -> dict:
    """name -> (default, help) of every option the compressor registered as `name` takes."""
    return option_help(COMPRESSORS.get(name))


__all__ = ["CODECS", "COMPRESSORS", "Codec", "CompressStats", "Compressor", "Dense",
           "DynamicThreshold", "Encoded", "EncodedKeys", "FeedbackOptions", "KEY_ENCODINGS",
           "Sparse", "StdThreshold", "TopK", "codec_options", "compressor_options",
           "decode_keys", "densify", "encode_keys", "make_codec", "make_compressor"]
