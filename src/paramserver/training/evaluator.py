"""Evaluator process: pulls the parameters now and then and scores them on the test split."""

from __future__ import annotations

import logging
import time

import torch

from paramserver.models.flat_binding import point_params_at
from paramserver.models.workload import build, evaluate, evaluate_sparse
from paramserver.client.kv import KVWorker

log = logging.getLogger(__name__)


def run_evaluator(join: str, interval: float = 1.0, keys=None,
                  save_model: str | None = None) -> int:
    """Evaluate every `interval` seconds while the job trains, and once more after it ends;
    `save_model`: write the parameters of that last evaluation there (runlog/model_file), so
    the model file scores exactly the accuracy the metrics log ends with."""
    torch.set_num_threads(1)
    kv = KVWorker(join, role="observer", keys=keys)
    try:
        ds, model, keys = build(kv.spec.job.task, kv.spec.job.dtype)
        X, y = ds.test.X.to(keys.dtype), ds.test.y
        table = getattr(model, "sparse_table", None)  # DLRM: rows from the servers, AUC
        # The model computes on views of the pulled values: no second copy of the parameters.
        flat = torch.empty(keys.num_keys, dtype=keys.dtype)
        point_params_at(model, keys, flat)
        kv.start()  # ready: the coordinator holds the start of training until now
        last = -float("inf")
        while True:
            state = kv.session.status()
            final = bool(state["workers_done"])
            if not state["started"] or (not final and time.monotonic() - last < interval):
                time.sleep(min(interval, 0.1))  # poll often: the final evaluation is prompt
                continue
            last = time.monotonic()
            kv.pull(out=flat.numpy())
            scores = {}
            if table is None:
                accuracy, loss = evaluate(model, X, y)
            else:
                accuracy, loss, auc = evaluate_sparse(
                    model, X, ds.test.ids, y, lambda k: kv.rows.pull(table, k))
                scores["auc"] = round(auc, 6)
            kv.report({"kind": "eval", "accuracy": round(accuracy, 6), "test_loss": round(loss, 6),
                       **scores, "samples": state["samples_done"], "version": kv.version,
                       "final": final, "age_s": time.monotonic() - last})
            if final:
                if save_model and table is None:  # DLRM rows stay on the servers
                    from paramserver.runlog.model_file import named_tensors, write_model
                    write_model(save_model, named_tensors(keys, flat), "pt")
                break
        kv.bye()
    finally:
        kv.close()
    return 0
