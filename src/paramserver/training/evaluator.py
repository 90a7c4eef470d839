"""Evaluator process: pulls the parameters now and then and scores them on the test split."""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from paramserver.training.train_task import build
from paramserver.client.kv import KVWorker

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(model: nn.Module, X: torch.Tensor, y: torch.Tensor, chunk: int = 4096):
    """(accuracy, mean cross-entropy) of `model` on (X, y)."""
    correct, loss_sum = 0, 0.0
    for i in range(0, len(y), chunk):
        out = model(X[i:i + chunk])
        loss_sum += float(nn.functional.cross_entropy(out, y[i:i + chunk], reduction="sum"))
        correct += int((out.argmax(1) == y[i:i + chunk]).sum())
    return correct / max(len(y), 1), loss_sum / max(len(y), 1)


def run_evaluator(join: str, interval: float = 1.0, keys=None) -> int:
    """Evaluate every `interval` seconds while the job trains, and once more after it ends."""
    torch.set_num_threads(1)
    kv = KVWorker(join, role="observer", keys=keys)
    try:
        ds, model, keys = build(kv.spec.job.task, kv.spec.job.dtype)
        X, y = ds.test.X.to(keys.dtype), ds.test.y
        flat = keys.new_buffer()
        kv.start()  # ready: the coordinator holds the start of training until now
        last = -float("inf")
        while True:
            state = kv.status()
            final = bool(state["workers_done"])
            if not state["started"] or (not final and time.monotonic() - last < interval):
                time.sleep(min(interval, 0.1))  # poll often: the final evaluation is prompt
                continue
            last = time.monotonic()
            kv.pull(out=flat.numpy())
            keys.load_flat(model, flat)
            accuracy, loss = evaluate(model, X, y)
            kv.report({"kind": "eval", "accuracy": round(accuracy, 6), "test_loss": round(loss, 6),
                       "samples": state["samples_done"], "version": kv.version, "final": final,
                       "age_s": time.monotonic() - last})
            if final:
                break
        kv.bye()
    finally:
        kv.close()
    return 0
