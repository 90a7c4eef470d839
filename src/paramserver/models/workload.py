"""The workload every process of a job builds the same way (data set, model, key space) and how
a model is scored. It needs torch but no socket, so the simulator trains and scores with it
without loading the live runtime."""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch
from torch import nn

from paramserver.data import load_dataset
from paramserver.models import ModelKeys, build_model
from paramserver.spec.job import TaskSpec, task_from_dict
from paramserver.models.core.auc import roc_auc


def build(task: TaskSpec | Mapping, dtype: str, shape_only: bool = False):
    """Dataset, model and key space exactly as every process of the job builds them (`task` a
    TaskSpec, or a task table such as the simulator's). `shape_only`: the model on torch's meta
    device, for a process that needs only the key space (see build_model)."""
    if not isinstance(task, TaskSpec):
        task = task_from_dict(task)
    ds = load_dataset(task.dataset, task.data_dir, seed=task.seed, **task.dataset_options)
    model = build_model(task.model, ds.input_shape, ds.num_classes, seed=task.seed,
                        sparse_fields=ds.sparse_fields, shape_only=shape_only,
                        **task.model_options)
    model = model.to(getattr(torch, dtype))
    return ds, model, ModelKeys(model, dtype=getattr(torch, dtype))


@torch.no_grad()
def evaluate(model: nn.Module, X: torch.Tensor, y: torch.Tensor, chunk: int = 4096):
    """(accuracy, mean cross-entropy) of `model` on (X, y)."""
    correct, loss_sum = 0, 0.0
    for i in range(0, len(y), chunk):
        out = model(X[i:i + chunk])
        loss_sum += float(nn.functional.cross_entropy(out, y[i:i + chunk], reduction="sum"))
        correct += int((out.argmax(1) == y[i:i + chunk]).sum())
    return correct / max(len(y), 1), loss_sum / max(len(y), 1)


@torch.no_grad()
def evaluate_sparse(model: nn.Module, X: torch.Tensor, ids: torch.Tensor, y: torch.Tensor,
                    read_rows: Callable[[np.ndarray], np.ndarray], chunk: int = 8192):
    """(accuracy, mean cross-entropy, ROC AUC of the click score) of a model with a sparse
    table (DLRM) on (X, ids, y); `read_rows(unique keys)` gives their rows (one call: the
    servers' pull_rows, or a local table's)."""
    keys = model.keys_of(ids)
    unique, inverse = np.unique(keys.ravel(), return_inverse=True)
    rows = torch.from_numpy(np.asarray(read_rows(unique)))
    inverse = inverse.reshape(keys.shape)
    correct, loss_sum, scores = 0, 0.0, []
    for i in range(0, len(y), chunk):
        out = model(X[i:i + chunk], model.gather(rows, inverse[i:i + chunk]))
        loss_sum += float(nn.functional.cross_entropy(out, y[i:i + chunk], reduction="sum"))
        correct += int((out.argmax(1) == y[i:i + chunk]).sum())
        scores.append((out[:, 1] - out[:, 0]).double().numpy())  # the click's log-odds
    n = max(len(y), 1)
    auc = roc_auc(np.concatenate(scores), y.numpy()) if len(y) else float("nan")
    return correct / n, loss_sum / n, auc
