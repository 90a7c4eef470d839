"""Models by name (`--model NAME`), built deterministically from a seed, and their key space."""

from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn

from paramserver.models.dlrm import dlrm
from paramserver.models.core.keyspace import Layer, ModelKeys
from paramserver.models.nets import cnn, logreg, mlp, wide
from paramserver.core.options import check_known
from paramserver.core.registry import Registry

MODELS: Registry[Callable[..., nn.Module]] = Registry("model")
MODELS.register("mlp")(mlp)
MODELS.register("cnn")(cnn)
MODELS.register("logreg")(logreg)
MODELS.register("dlrm")(dlrm)
MODELS.register("wide")(wide)
DEFAULT_MODEL = "mlp"


def model_options(name: str) -> list[str]:
    """The keyword options the model registered as `name` accepts."""
    params = inspect.signature(MODELS.get(name)).parameters
    return [p for p in params if p not in ("input_shape", "num_classes", "sparse_fields")]


def takes_sparse_fields(name: str) -> bool:
    """Whether model `name` looks categorical ids up in a sparse table (DLRM)."""
    return "sparse_fields" in inspect.signature(MODELS.get(name)).parameters


def sparse_tables(model: nn.Module) -> tuple:
    """The sparse tables (spec.job.TableSpec) the job of `model` must carry; () for a model
    whose parameters are all dense."""
    tables = getattr(model, "tables", None)
    return tuple(tables()) if callable(tables) else ()


def _check_option_types(name: str, factory: Callable, options: dict) -> None:
    """Each option of the kind its default is (an int where the default is an int, a number
    where it is a float), named with what was given, before the model code sees it."""
    params = inspect.signature(factory).parameters
    for key, value in options.items():
        default = params[key].default
        if isinstance(default, bool) or default is inspect.Parameter.empty or default is None:
            continue
        if isinstance(default, int) and not (isinstance(value, int)
                                             and not isinstance(value, bool)):
            raise ValueError(f"model {name!r} option {key} takes a whole number (default "
                             f"{default}), got {value!r}")
        if isinstance(default, float) and (isinstance(value, bool)
                                           or not isinstance(value, (int, float))):
            raise ValueError(f"model {name!r} option {key} takes a number (default "
                             f"{default:g}), got {value!r}")


def build_model(name: str, input_shape, num_classes: int, seed: int = 0,
                dtype: torch.dtype = torch.float32, sparse_fields: int = 0,
                shape_only: bool = False, **options) -> nn.Module:
    """Build model `name` for samples of `input_shape` (and `sparse_fields` categorical ids, for
    a model that takes them); same seed, same initial weights.

    The global torch RNG is left as it was, so building a model never perturbs other streams.
    `shape_only` builds it on torch's meta device: shapes and the key space, no memory (how
    the launcher sizes a job of 10^9 parameters without holding them).
    """
    factory = MODELS.get(name)
    check_known(f"model {name!r}", options, model_options(name))
    _check_option_types(name, factory, options)
    if int(num_classes) < 2:
        raise ValueError(f"need at least 2 classes, got {num_classes}")
    if takes_sparse_fields(name):
        options["sparse_fields"] = int(sparse_fields)
    elif sparse_fields:
        raise ValueError(f"model {name!r} cannot use the data set's {sparse_fields} categorical "
                         f"fields; use --model dlrm")
    if shape_only:
        with torch.device("meta"):
            model = factory(tuple(int(d) for d in input_shape), int(num_classes), **options)
        return model.to(dtype)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = factory(tuple(int(d) for d in input_shape), int(num_classes), **options)
    return model.to(dtype)


__all__ = ["DEFAULT_MODEL", "Layer", "MODELS", "ModelKeys", "build_model", "model_options",
           "sparse_tables", "takes_sparse_fields"]
