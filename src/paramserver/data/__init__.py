"""Datasets by name (`--dataset NAME`): loaders, worker shards and the changing-size batch sampler."""

from __future__ import annotations

import inspect
from typing import Callable

from paramserver.data.base import Dataset, Split
from paramserver.data.clicks import load_clicks
from paramserver.data.digits import load_digits
from paramserver.data.idx import IdxFormatError, read_idx, write_idx
from paramserver.data.mnist import load_mnist
from paramserver.data.core.sampler import BatchSampler
from paramserver.data.synthetic import load_synthetic
from paramserver.core.options import check_known
from paramserver.core.registry import Registry

DATASETS: Registry[Callable[..., Dataset]] = Registry("dataset")
DATASETS.register("digits")(load_digits)
DATASETS.register("mnist")(load_mnist)
DATASETS.register("synthetic")(load_synthetic)
DATASETS.register("clicks")(load_clicks)
DEFAULT_DATASET = "digits"


def dataset_options(name: str) -> list[str]:
    """The keyword options the loader registered as `name` accepts (for --help and errors)."""
    params = inspect.signature(DATASETS.get(name)).parameters
    return [p for p in params if p not in ("data_dir", "seed")]


def load_dataset(name: str = DEFAULT_DATASET, data_dir=None, seed: int = 0, **options) -> Dataset:
    """Load the dataset registered as `name`; an unknown option fails listing the accepted ones."""
    loader = DATASETS.get(name)
    check_known(f"dataset {name!r}", options, dataset_options(name))
    return loader(data_dir=data_dir, seed=seed, **options)


__all__ = ["BatchSampler", "DATASETS", "DEFAULT_DATASET", "Dataset", "IdxFormatError", "Split",
           "dataset_options", "load_dataset", "read_idx", "write_idx"]
