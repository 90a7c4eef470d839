"""A DLRM-style click model: its dense part is a module like every other model's; its embedding
rows are not module parameters but rows of a sparse table on the servers.

Each sample has `fields` categorical ids and a few dense features. The id of field f is looked
up under the 64-bit key hash(f, id) in one table ("emb", `dim` floats a row); the step pulls the
rows of the batch's keys, and the model gets them as a tensor (batch, fields, dim). The dense
part follows DLRM (Naumov et al., 2019): a bottom MLP maps the dense features to one more
`dim`-vector, the pairwise dot products of the fields' vectors and it are the interaction, and
a top MLP maps [bottom output, interactions] to the class scores (2: no click, click), so the
loss and the evaluation are the ones every model here uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

TABLE = "emb"  # the one table of a DLRM job
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_FIELD = np.uint64(0x9E3779B97F4A7C15)


def embedding_keys(ids: np.ndarray) -> np.ndarray:
    """The table key of each (field, id): a 64-bit hash, as int64. `ids` is (N, fields) int64;
    field f is the column. Different fields' equal ids get unrelated keys."""
    ids = np.asarray(ids)
    if ids.ndim != 2 or ids.dtype != np.int64:
        raise ValueError(f"ids must be int64 (N, fields), got {ids.dtype} {ids.shape}")
    field = np.arange(1, ids.shape[1] + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = ids.astype(np.uint64) ^ (field * _FIELD)
        x = (x ^ (x >> np.uint64(30))) * _M1  # splitmix64's finalizer
        x = (x ^ (x >> np.uint64(27))) * _M2
        x = x ^ (x >> np.uint64(31))
    return x.view(np.int64)


@dataclass(frozen=True)
class TableOptions:
    """How the servers keep the embedding rows (becomes the job's TableSpec)."""

    dim: int = 16
    optimizer: str = "adagrad"
    lr: float = 0.05
    init_scale: float = 0.01
    row_budget: int = 1_000_000
    admit_after: int = 1
    evict: str = "lru"

    def spec(self, name: str = TABLE):
        """The job's TableSpec of this table (spec/job.py checks the values)."""
        from paramserver.spec.job import TableSpec
        return TableSpec(name, self.dim, optimizer=self.optimizer, lr=self.lr,
                         init_scale=self.init_scale, row_budget=self.row_budget,
                         admit_after=self.admit_after, evict=self.evict)


def _widths(text, what: str) -> tuple[int, ...]:
    """'64,32' (or one int) as layer widths."""
    parts = [text] if isinstance(text, int) else str(text).replace("-", ",").split(",")
    try:
        widths = tuple(int(p) for p in parts if str(p).strip())
    except ValueError:
        raise ValueError(f"dlrm option {what} must be widths like 64,32; got {text!r}") from None
    if any(w < 1 for w in widths):
        raise ValueError(f"dlrm option {what} needs widths >= 1; got {text!r}")
    return widths


def _mlp(width: int, widths: tuple[int, ...], out: int | None) -> nn.Sequential:
    layers: list[nn.Module] = []
    for w in widths:
        layers += [nn.Linear(width, w), nn.ReLU()]
        width = w
    if out is not None:
        layers.append(nn.Linear(width, out))
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """forward(dense (B, D), emb (B, fields, dim)) -> class scores (B, num_classes)."""

    sparse_table = TABLE  # the step pulls this table's rows (training/sparse_step.py)

    def __init__(self, dense_features: int, fields: int, num_classes: int, table: TableOptions,
                 bottom: tuple[int, ...], top: tuple[int, ...]):
        super().__init__()
        self.fields, self.dim, self.table = int(fields), int(table.dim), table
        self.bottom = _mlp(int(dense_features), bottom, self.dim)
        vectors = self.fields + 1
        # A buffer (not saved): it moves with the model to its device.
        self.register_buffer("pairs", torch.triu_indices(vectors, vectors, offset=1),
                             persistent=False)
        self.top = _mlp(self.dim + self.pairs.shape[1], top, int(num_classes))

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        if emb.shape[1:] != (self.fields, self.dim):
            raise ValueError(f"expected rows shaped (batch, {self.fields}, {self.dim}), "
                             f"got {tuple(emb.shape)}")
        z = self.bottom(dense)
        vectors = torch.cat([z.unsqueeze(1), emb.to(z.dtype)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([z, dots], dim=1))

    def tables(self) -> tuple:
        """The job's sparse tables this model needs (TableSpecs)."""
        return (self.table.spec(self.sparse_table),)

    @staticmethod
    def keys_of(ids: torch.Tensor | np.ndarray) -> np.ndarray:
        """The table keys (N, fields) of a batch's ids."""
        return embedding_keys(ids.numpy() if isinstance(ids, torch.Tensor) else ids)

    def gather(self, rows: torch.Tensor, inverse: np.ndarray) -> torch.Tensor:
        """The (N, fields, dim) rows of a batch from the rows of its unique keys and the
        batch's positions into them (np.unique's inverse, shaped (N, fields)). Indexing a leaf
        `rows` routes each sample's gradient back to its key's row, summed over repeats."""
        index = torch.from_numpy(np.ascontiguousarray(inverse, dtype=np.int64))
        return rows[index.to(rows.device)]


def dlrm(input_shape: tuple[int, ...], num_classes: int, sparse_fields: int = 0, dim: int = 16,
         bottom="64", top="64,32", table_optimizer: str = "adagrad", table_lr: float = 0.05,
         init_scale: float = 0.01, row_budget: int = 1_000_000, admit_after: int = 1,
         evict: str = "lru") -> DLRM:
    """A DLRM for samples of `input_shape` dense features and `sparse_fields` categorical ids.

    `dim`: floats per embedding row; `bottom`, `top`: hidden widths of the MLPs (64,32). The
    table's rows are kept by the servers with `table_optimizer` (adagrad or sgd) at `table_lr`,
    starting uniform in +-`init_scale`, at most `row_budget` rows over all shards (evicting by
    `evict`, lru or lfu), a key getting its row once pushed in `admit_after` steps."""
    if len(input_shape) != 1:
        raise ValueError(f"dlrm needs dense feature vectors and categorical ids, got samples "
                         f"shaped {input_shape}: train it on --dataset clicks")
    if int(sparse_fields) < 1:
        raise ValueError("dlrm needs a data set with categorical fields (--dataset clicks)")
    table = TableOptions(dim=int(dim), optimizer=str(table_optimizer), lr=float(table_lr),
                         init_scale=float(init_scale), row_budget=int(row_budget),
                         admit_after=int(admit_after), evict=str(evict))
    if table.dim < 1:
        raise ValueError(f"dlrm option dim must be >= 1, got {dim}")
    return DLRM(input_shape[0], int(sparse_fields), num_classes, table,
                _widths(bottom, "bottom"), _widths(top, "top"))
