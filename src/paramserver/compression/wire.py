"""What a worker's values cost on the wire (issue 22): `--compress`, `--compress-opt`,
`--pull-compress` and `--pull-refresh` read once into a WireSpec.

    --compress bf16                     dense pushes, every value as bf16 (error feedback on)
    --compress uniform8 --compress-opt block=64
    --compress topk --compress-opt fraction=0.01 --compress-opt codec=bf16
                                        top-k with bf16 values (`codec.KEY=VALUE`: its options)
    --pull-compress bf16 --pull-refresh 20
                                        pulls as bf16 deltas, a dense pull every 20th

    --compress auto --compress-opt bf16_at=500mbit
                                        each worker by its --link rate (compression/auto.py)

A `--compress` name is a pruner (compressor) or a codec; pruners take `codec=NAME`. A dense
codec push keeps what the codec lost in a residual (`error_feedback=false` drops it). `auto`
stays unresolved until a worker knows its link and tensors (`resolve`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from paramserver.compression import CODECS, COMPRESSORS, make_codec, make_compressor
from paramserver.compression.auto import AutoOptions, AutoPlan, plan
from paramserver.compression.base import Compressor
from paramserver.compression.codec import Codec
from paramserver.compression.mixed import MixedCodec, runs_of

DEFAULT_PULL_REFRESH = 20


def _known() -> str:
    return (f"pruners: {', '.join(COMPRESSORS.names())}; codecs: "
            f"{', '.join(CODECS.names())}; or auto")


@dataclass(frozen=True)
class WireSpec:
    """pruner (a compressor name, "none": dense) and its options; codec (None: float values
    as they are) and its options; for dense codec pushes, whether a residual keeps the codec's
    error; the pull codec (None: dense pulls), its options, and the dense-refresh interval;
    with `--compress auto`, its thresholds (the push format is then a worker's `resolve`)."""

    pruner: str = "none"
    pruner_options: Mapping = field(default_factory=dict)
    codec: str | None = None
    codec_options: Mapping = field(default_factory=dict)
    error_feedback: bool = True
    pull_codec: str | None = None
    pull_codec_options: Mapping = field(default_factory=dict)
    pull_refresh: int = DEFAULT_PULL_REFRESH
    auto: AutoOptions | None = None  # `--compress auto`: chosen per worker by `resolve`
    # codec `mixed`: the [start, stop) runs of the model's small tensors it keeps float32, from
    # the tensors' sizes (`resolve`)
    dense_runs: tuple = ()

    def __post_init__(self):
        for name in ("pruner_options", "codec_options", "pull_codec_options"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @classmethod
    def parse(cls, compress: str = "none", options: Mapping | None = None,
              pull_compress: str = "none", pull_refresh: int = DEFAULT_PULL_REFRESH
              ) -> "WireSpec":
        """The flags' texts, checked (ValueError listing the known names and options)."""
        opts = dict(options or {})
        if not isinstance(pull_refresh, int) or isinstance(pull_refresh, bool) \
                or pull_refresh < 1:
            raise ValueError(f"--pull-refresh must be a whole number >= 1; got {pull_refresh!r}")
        pull = None if pull_compress == "none" else pull_compress
        if pull is not None and pull not in CODECS:
            raise ValueError(f"unknown --pull-compress {pull_compress!r}; codecs: "
                             f"{', '.join(CODECS.names())} (or none)")
        if compress == "auto":
            spec = cls(auto=AutoOptions.parse(opts), pull_codec=pull, pull_refresh=pull_refresh)
        elif compress in COMPRESSORS:
            codec = opts.pop("codec", None)
            codec_opts = {k[len("codec."):]: opts.pop(k) for k in list(opts)
                          if k.startswith("codec.")}
            if codec is not None and codec not in CODECS:
                raise ValueError(f"unknown codec {codec!r} (--compress-opt codec=...); "
                                 f"codecs: {', '.join(CODECS.names())}")
            if codec is None and codec_opts:
                raise ValueError("codec.* options need --compress-opt codec=NAME")
            if compress == "none" and codec is not None:  # a dense codec push
                spec = cls(codec=codec, codec_options=codec_opts,
                           error_feedback=opts.pop("error_feedback", True), pull_codec=pull,
                           pull_refresh=pull_refresh)
                if opts:
                    raise ValueError(f"unknown option(s) {', '.join(sorted(opts))} for "
                                     f"--compress none with a codec")
            else:
                spec = cls(compress, opts, codec, codec_opts, pull_codec=pull,
                           pull_refresh=pull_refresh)
        elif compress in CODECS:
            ef = opts.pop("error_feedback", True)
            spec = cls(codec=compress, codec_options=opts, error_feedback=ef, pull_codec=pull,
                       pull_refresh=pull_refresh)
        else:
            raise ValueError(f"unknown --compress {compress!r}; {_known()}")
        if not isinstance(spec.error_feedback, bool):
            raise ValueError(f"error_feedback must be true or false; got "
                             f"{spec.error_feedback!r}")
        spec.compressor()  # every name and option checked now, before any process starts
        spec.push_codec()
        spec.pull_codec_object()
        return spec

    def resolve(self, rate: float | None, sizes) -> "WireSpec":
        """The spec a worker pushes with: `auto` chosen for its link's `rate` (bits/s; None:
        no emulated link) and its tensors' sizes (values each, key order); others as they are."""
        spec = self if self.auto is None else self.resolved(self.plan(rate, sizes))
        if spec.codec == MixedCodec.name:
            below = spec.codec_options.get("dense_below", 0)
            spec = dataclasses.replace(spec, dense_runs=runs_of(list(sizes), below))
        return spec

    def plan(self, rate: float | None, sizes) -> AutoPlan:
        if self.auto is None:
            raise ValueError("plan() is for --compress auto")
        return plan(list(sizes), rate, self.auto)

    def resolved(self, chosen: AutoPlan) -> "WireSpec":
        w = chosen.worker
        return WireSpec.parse(w.compress, dict(w.options), self.pull_codec or "none",
                              self.pull_refresh)

    @property
    def dense_codec(self) -> bool:
        """Dense pushes through a codec (no pruner)."""
        return self.pruner == "none" and self.codec is not None

    def compressor(self) -> Compressor | None:
        """The pruner, its values through the codec when one is named; None for dense."""
        if self.pruner == "none":
            return None
        codec = None if self.codec is None else make_codec(self.codec, **self.codec_options)
        return make_compressor(self.pruner, codec=codec, **self.pruner_options)

    def push_codec(self) -> Codec | None:
        """A dense push's codec (None: plain values, or a pruner carries the codec)."""
        if not self.dense_codec:
            return None
        codec = make_codec(self.codec, **self.codec_options)
        return codec.dense_runs(self.dense_runs) if self.dense_runs else codec

    def pull_codec_object(self) -> Codec | None:
        if self.pull_codec is None:
            return None
        return make_codec(self.pull_codec, **self.pull_codec_options)

    def label(self) -> str:
        """The push format in a word for metrics: none, bf16, topk, topk+bf16 (auto before a
        worker resolved it)."""
        if self.auto is not None:
            return "auto"
        if self.codec == MixedCodec.name:  # large tensors through `inner`, small ones float32
            return f"{self.codec_options.get('inner', 'uniform8')}+small-fp32"
        if self.pruner == "none":
            return self.codec or "none"
        return self.pruner if self.codec is None else f"{self.pruner}+{self.codec}"
