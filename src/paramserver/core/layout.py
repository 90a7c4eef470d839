"""A model's parameter layout (names, shapes, dtype in parameters() order) and its fingerprint.

Every rank of a user's job must bind the same model to the same flat key space: two models of
equal parameter count but other shapes or names would train on each other's numbers. Each
worker sends its layout with `register`; the coordinator compares it with the job's (the first
worker's) and refuses a differing one naming the first parameter that differs, and writes the
job's layout to the run folder (model_layout.json), so `export` can cut the flat vector into
the script's own parameter names.

On the wire the layout is `{"digest": str, "dtype": str, "params": [[name, [dims...]], ...]}`;
`params` is left out (digest only) when the layout is too large for a control message. Pure:
no I/O; the fingerprint is a hash of the canonical text, so every host computes the same one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# A layout travels in a register header (wire.codec.MAX_HEADER_BYTES = 64 KB): its parameter
# list is sent only up to this many characters of names and dims (a model with thousands of
# tensors sends its digest alone and is compared by it).
MAX_LAYOUT_CHARS = 48 * 1024
MAX_PARAMS = 8192
MAX_NAME = 256
MAX_DIMS = 16
DTYPES = ("float32", "float64", "float16", "bfloat16")


class LayoutError(ValueError):
    """A layout that does not follow the wire form (the text says what is wrong)."""


@dataclass(frozen=True)
class ModelLayout:
    """The layout of one model: `params` ((name, shape), ...) in flat key order; `complete`
    False for a layout that came as its digest only (too large to send)."""

    params: tuple[tuple[str, tuple[int, ...]], ...]
    dtype: str
    digest: str
    complete: bool = True

    @classmethod
    def of(cls, params, dtype: str) -> "ModelLayout":
        """From (name, shape) pairs, e.g. [(n, tuple(p.shape)) for n, p in named_parameters()]."""
        params = tuple((str(n), tuple(int(d) for d in s)) for n, s in params)
        return cls(params, str(dtype), fingerprint(params, str(dtype)))

    @property
    def num_keys(self) -> int:
        total = 0
        for _, shape in self.params:
            size = 1
            for d in shape:
                size *= d
            total += size
        return total

    def to_wire(self) -> dict:
        """The register field: the parameter list when it fits a control message."""
        out = {"digest": self.digest, "dtype": self.dtype}
        chars = sum(len(n) + 8 * len(s) + 8 for n, s in self.params)
        if self.complete and len(self.params) <= MAX_PARAMS and chars <= MAX_LAYOUT_CHARS:
            out["params"] = [[n, list(s)] for n, s in self.params]
        return out

    @classmethod
    def from_wire(cls, doc) -> "ModelLayout":
        """Parse and check a layout from the wire or a model_layout.json (LayoutError)."""
        if not isinstance(doc, dict) or set(doc) - {"digest", "dtype", "params"}:
            raise LayoutError("a layout is a map of digest, dtype and params")
        digest, dtype = doc.get("digest"), doc.get("dtype")
        if not isinstance(digest, str) or not 1 <= len(digest) <= 64:
            raise LayoutError("layout digest must be a string of 1..64 characters")
        if dtype not in DTYPES:
            raise LayoutError(f"layout dtype must be one of {', '.join(DTYPES)}")
        raw = doc.get("params")
        if raw is None:
            return cls((), dtype, digest, complete=False)
        if not isinstance(raw, (list, tuple)) or not 1 <= len(raw) <= MAX_PARAMS:
            raise LayoutError(f"layout params must be a list of 1..{MAX_PARAMS} entries")
        params = []
        for i, entry in enumerate(raw):
            ok = (isinstance(entry, (list, tuple)) and len(entry) == 2
                  and isinstance(entry[0], str) and 0 < len(entry[0]) <= MAX_NAME
                  and isinstance(entry[1], (list, tuple)) and len(entry[1]) <= MAX_DIMS
                  and all(type(d) is int and 0 <= d < 1 << 40 for d in entry[1]))
            if not ok:
                raise LayoutError(f"layout param {i} must be [name, [dims...]] (a name of at "
                                  f"most {MAX_NAME} characters, at most {MAX_DIMS} dims)")
            params.append((entry[0], tuple(entry[1])))
        layout = cls.of(params, dtype)
        if layout.digest != digest:
            raise LayoutError("layout digest does not match its parameters")
        return layout


def fingerprint(params, dtype: str) -> str:
    """16 hex digits over the canonical text of the layout: equal for equal layouts."""
    text = dtype + ";" + ";".join(f"{n}:{'x'.join(map(str, s))}" for n, s in params)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _shown(entry) -> str:
    name, shape = entry
    return f"{name!r} {tuple(shape)}"


def first_difference(job: ModelLayout, other: ModelLayout, job_name: str = "in the job",
                     other_name: str = "here") -> str | None:
    """None when the layouts agree; else what differs first, in words ("parameter 2: ... on
    rank 0, ... on rank 1"), for an error that names it."""
    if job.digest == other.digest:
        return None
    a, b = job_name, other_name
    if job.dtype != other.dtype:
        return f"dtype {job.dtype} {a}, {other.dtype} {b}"
    if not (job.complete and other.complete):
        return (f"layout fingerprint {job.digest} {a}, {other.digest} {b} (a layout too large "
                f"to send is compared by fingerprint only)")
    for i, (x, y) in enumerate(zip(job.params, other.params)):
        if x != y:
            return f"parameter {i}: {_shown(x)} {a}, {_shown(y)} {b}"
    n = min(len(job.params), len(other.params))
    if len(job.params) > n:
        return f"parameter {n}: {_shown(job.params[n])} {a}, missing {b}"
    return f"parameter {n}: missing {a}, {_shown(other.params[n])} {b}"
