"""DLRM on the synthetic click log: the exact AUC, the data set (deterministic, Zipf-shaped, a
learnable signal), the model and its sparse step against a local table, and the summary."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from paramserver.data import load_dataset
from paramserver.data.clicks import ID_SPACE, mix64, power_law_ranks
from paramserver.models import ModelKeys, build_model
from paramserver.models.dlrm import embedding_keys
from paramserver.runlog.metrics import summarize
from paramserver.models.core.auc import roc_auc
from paramserver.training.sparse_step import SparseRows
from paramserver.models.workload import evaluate_sparse


# --- AUC --------------------------------------------------------------------------------------
def pairwise_auc(scores, labels) -> float:
    """Every (positive, negative) pair: a win 1, a tie 1/2."""
    pos = [s for s, y in zip(scores, labels) if y == 1]
    neg = [s for s, y in zip(scores, labels) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("levels", [None, 3, 1])  # continuous, heavy ties, all tied
def test_auc_equals_the_pairwise_count(levels):
    rng = np.random.default_rng(levels or 7)
    for n in (2, 5, 40, 300):
        labels = rng.integers(0, 2, n)
        labels[0], labels[1] = 0, 1  # both classes present
        scores = rng.standard_normal(n) if levels is None else rng.integers(0, levels, n)
        assert roc_auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels), abs=1e-12)


def test_auc_of_perfect_reversed_and_one_class():
    y = np.array([0, 0, 1, 1])
    assert roc_auc([0.1, 0.2, 0.8, 0.9], y) == 1.0
    assert roc_auc([0.9, 0.8, 0.2, 0.1], y) == 0.0
    assert np.isnan(roc_auc([0.1, 0.2], [1, 1]))
    with pytest.raises(ValueError, match="0 or 1"):
        roc_auc([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError, match="2 scores but 3 labels"):
        roc_auc([0.1, 0.2], [0, 1, 1])


# --- the click log ----------------------------------------------------------------------------
SMALL = {"train": 20_000, "test": 4_000}


def test_clicks_are_deterministic_and_fixed_by_data_seed():
    a, b = load_dataset("clicks", **SMALL), load_dataset("clicks", seed=5, **SMALL)
    for split in ("train", "test"):
        x, y = getattr(a, split), getattr(b, split)
        assert torch.equal(x.X, y.X) and torch.equal(x.ids, y.ids) and torch.equal(x.y, y.y)
    c = load_dataset("clicks", data_seed=1, **SMALL)
    assert not torch.equal(a.train.ids, c.train.ids)
    # The test split does not depend on the training split's size.
    assert torch.equal(load_dataset("clicks", train=500, test=4_000).test.ids, a.test.ids)
    assert a.sparse_fields == 8 and a.input_shape == (4,) and a.num_classes == 2
    assert a.train.ids.dtype == torch.int64 and 0 <= int(a.train.ids.min())
    assert int(a.train.ids.max()) < ID_SPACE and int(a.train.ids.max()) > ID_SPACE // 100
    assert 0.3 < float(a.train.y.float().mean()) < 0.7


@pytest.mark.parametrize("exponent", [1.1, 1.5])
def test_id_frequencies_follow_the_power_law(exponent):
    ranks = power_law_ranks(np.random.default_rng(0), 400_000, exponent, ID_SPACE)
    counts = np.sort(np.unique(ranks, return_counts=True)[1])[::-1]
    r = np.arange(5, 200)  # the head, where counts are large enough to measure
    slope = np.polyfit(np.log(r + 1), np.log(counts[r]), 1)[0]
    assert slope == pytest.approx(-exponent, abs=0.12)
    assert ranks.min() >= 1 and ranks.max() <= ID_SPACE


def test_a_larger_exponent_repeats_ids_more():
    spread = [len(np.unique(load_dataset("clicks", exponent=e, **SMALL).train.ids[:, 0]))
              for e in (1.05, 1.3)]
    assert spread[0] > 1.5 * spread[1]


def test_sampler_draws_ids_with_their_samples():
    ds = load_dataset("clicks", **SMALL)
    sampler = ds.sampler(1, 2)
    X, ids, y = sampler.next_sparse_batch(64)
    rows = {tuple(v): (tuple(x), int(t)) for v, x, t in
            zip(ds.train.ids.tolist(), ds.train.X.tolist(), ds.train.y.tolist())}
    for v, x, t in zip(ids.tolist(), X.tolist(), y.tolist()):
        assert rows[tuple(v)] == (tuple(x), t)
    dense = load_dataset("synthetic", samples=200, features=4, classes=2)
    assert dense.train.ids is None and dense.sparse_fields == 0
    with pytest.raises(ValueError, match="no categorical ids"):
        dense.sampler(0, 1).next_sparse_batch(4)


def test_models_and_data_sets_that_do_not_fit_fail_clearly():
    with pytest.raises(ValueError, match="--model dlrm"):
        build_model("mlp", (4,), 2, sparse_fields=8)
    with pytest.raises(ValueError, match="--dataset clicks"):
        build_model("dlrm", (4,), 2)
    with pytest.raises(ValueError, match="dense feature vectors"):
        build_model("dlrm", (1, 8, 8), 2, sparse_fields=3)


# --- the model --------------------------------------------------------------------------------
def test_keys_hash_field_and_id():
    ids = np.array([[5, 5, 7], [5, 9, 7]], dtype=np.int64)
    keys = embedding_keys(ids)
    assert keys.dtype == np.int64 and np.array_equal(keys, embedding_keys(ids.copy()))
    assert keys[0, 0] == keys[1, 0] and keys[0, 2] == keys[1, 2]  # same (field, id)
    assert keys[0, 0] != keys[0, 1]  # same id, another field
    with pytest.raises(ValueError, match="int64"):
        embedding_keys(ids.astype(np.int32))


def test_rows_are_no_module_parameters_and_their_gradient_sums_repeats():
    model = build_model("dlrm", (4,), 2, sparse_fields=3, dim=5, seed=1)
    names = [n for n, _ in model.named_parameters()]
    assert names and all(n.startswith(("bottom.", "top.")) for n in names)
    assert ModelKeys(model).num_keys == sum(p.numel() for p in model.parameters())
    ids = torch.tensor([[1, 2, 3], [1, 4, 3]])
    keys = model.keys_of(ids)
    unique, inverse = np.unique(keys.ravel(), return_inverse=True)
    assert len(unique) == 4
    rows = torch.randn(len(unique), 5, requires_grad=True)
    x, where = torch.randn(2, 4), inverse.reshape(keys.shape)
    out = model(x, model.gather(rows, where))
    assert out.shape == (2, 2)
    out[:, 1].sum().backward()
    # Against a copy of the rows per (sample, field): a repeated key's gradient is their sum.
    per = rows.detach()[torch.from_numpy(where)].clone().requires_grad_()
    model(x, per)[:, 1].sum().backward()
    summed = torch.zeros_like(rows).index_add_(0, torch.from_numpy(inverse), per.grad.view(-1, 5))
    assert torch.allclose(rows.grad, summed)


# --- the sparse step on a local table ---------------------------------------------------------
class LocalTable:
    """An in-process Adagrad table: what the servers keep, for a single-process reference."""

    def __init__(self, dim: int, lr: float = 0.05, init_scale: float = 0.01):
        self.dim, self.lr, self.init_scale = dim, lr, init_scale
        self.slot: dict[int, int] = {}
        self.rows = np.zeros((1024, dim), np.float32)
        self.acc = np.zeros((1024, dim), np.float32)

    def _initial(self, keys: np.ndarray) -> np.ndarray:
        """Uniform in +-init_scale, from a hash of (key, column): the same key, the same row."""
        h = mix64(keys.view(np.uint64)[:, None] ^ mix64(np.arange(1, self.dim + 1)))
        unit = (h >> np.uint64(11)).astype(np.float64) / (1 << 53)
        return ((unit * 2 - 1) * self.init_scale).astype(np.float32)

    def _where(self, keys: np.ndarray) -> np.ndarray:
        get = self.slot.get
        return np.fromiter((get(k, -1) for k in keys.tolist()), np.int64, len(keys))

    def pull(self, keys: np.ndarray) -> np.ndarray:
        where = self._where(keys)
        out = self._initial(keys)
        out[where >= 0] = self.rows[where[where >= 0]]
        return out

    def push(self, keys: np.ndarray, grads: np.ndarray) -> None:
        where = self._where(keys)
        new = where < 0
        if new.any():
            start, count = len(self.slot), int(new.sum())
            while start + count > len(self.rows):  # grow by doubling
                self.rows = np.concatenate([self.rows, np.zeros_like(self.rows)])
                self.acc = np.concatenate([self.acc, np.zeros_like(self.acc)])
            where[new] = np.arange(start, start + count)
            self.rows[where[new]] = self._initial(keys[new])
            self.slot.update(zip(keys[new].tolist(), where[new].tolist()))
        self.acc[where] += grads * grads
        self.rows[where] -= self.lr * grads / (np.sqrt(self.acc[where]) + 1e-10)


class LocalRows:
    """The RowSource of a local table: a request is answered at once."""

    def __init__(self, table: LocalTable):
        self.table = table

    def start(self, keys, min_version):
        return self.table.pull(keys)

    def wait(self, request):
        return request

    def abandon(self, request):
        pass


def train_locally(ds, steps: int, batch: int = 256, lr: float = 0.1, shuffle_labels=False):
    """The worker's step with the servers replaced by a local table and a local SGD."""
    model = build_model("dlrm", ds.input_shape, ds.num_classes, sparse_fields=ds.sparse_fields)
    table = LocalTable(model.dim)
    sampler = ds.sampler(0, 1)
    if shuffle_labels:
        sampler.y = sampler.y[torch.randperm(len(sampler.y), generator=torch.Generator()
                                             .manual_seed(0))]
    rows = SparseRows(model, sampler, LocalRows(table))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(steps):
        rows.fetch(batch)
        opt.zero_grad()
        out, y = rows.forward(torch.float32)
        loss_fn(out, y).backward()
        opt.step()
        for keys, grads in rows.grads().values():
            table.push(keys, grads)
    return evaluate_sparse(model, ds.test.X, ds.test.ids, ds.test.y, table.pull)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker runs (--threads 1): tiny layers, a shared machine
    yield
    torch.set_num_threads(threads)


class RecordingRows:
    """A RowSource that records requests and abandons (rows all zero)."""

    def __init__(self, dim: int):
        self.dim, self.started, self.abandoned = dim, [], []

    def start(self, keys, min_version):
        self.started.append((len(keys), min_version))
        return np.zeros((len(keys), self.dim), np.float32)

    def wait(self, request):
        return request

    def abandon(self, request):
        self.abandoned.append(len(request))


def test_rows_asked_ahead_are_asked_again_without_skipping_or_repeating_a_sample():
    ds = load_dataset("clicks", **SMALL)
    model = build_model("dlrm", ds.input_shape, 2, sparse_fields=ds.sparse_fields, dim=4)
    source = RecordingRows(4)
    rows = SparseRows(model, ds.sampler(0, 1, seed=3), source)
    trained = []

    def train(size, version):
        rows.request(size, version)
        rows.receive()
        trained.append(rows.ready[0])  # the batch's dense features: unique per sample
        out, _ = rows.forward(torch.float32)
        assert out.shape == (size, 2)

    train(8, 0)
    rows.request(8, 1)  # ahead, as the train task does after its push
    train(8, 1)  # the release agrees: nothing asked again
    rows.request(8, 2)
    train(8, 5)  # another version (a restored shard): the same samples asked again
    rows.request(8, 6)
    train(5, 6)  # another batch size (LB-BSP): 5 of the 8 drawn, 3 held
    train(6, 6)  # the 3 held, then 3 new
    assert source.abandoned and len(source.abandoned) == 2
    assert [v for _, v in source.started] == [0, 1, 2, 5, 6, 6, 6]
    reference = ds.sampler(0, 1, seed=3).next_sparse_batch(8 + 8 + 8 + 5 + 6)[0]
    assert torch.equal(torch.cat(trained), reference)


def test_the_signal_is_learnable_and_shuffled_labels_are_not(one_thread):
    ds = load_dataset("clicks", train=60_000, test=10_000)
    accuracy, loss, auc = train_locally(ds, steps=240)  # one epoch: ~0.72
    assert auc > 0.65 and accuracy > 0.58 and loss < 0.69
    _, _, chance = train_locally(ds, steps=240, shuffle_labels=True)
    assert abs(chance - 0.5) < 0.04  # a random function of the features: near 0.5


# --- the summary ------------------------------------------------------------------------------
def test_summary_reports_auc_only_for_models_that_score_it():
    job = {"sync": {"name": "bsp"}, "task": {"model": "dlrm", "dataset": "clicks"}}
    evals = [{"t": 1.0, "kind": "eval", "accuracy": 0.6, "auc": 0.62},
             {"t": 2.0, "kind": "eval", "accuracy": 0.66, "auc": 0.71},
             {"t": 3.0, "kind": "eval", "accuracy": 0.65, "auc": 0.70, "final": True}]
    s = summarize(evals, job)
    assert (s["final_test_auc"], s["best_test_auc"]) == (0.70, 0.71)
    assert s["time_to_auc"]["0.6"] == 1.0 and s["time_to_auc"]["0.7"] == 2.0
    assert s["time_to_auc"]["0.75"] is None
    dense = summarize([{k: v for k, v in e.items() if k != "auc"} for e in evals], job)
    assert (dense["final_test_auc"], dense["best_test_auc"], dense["time_to_auc"]) == (
        None, None, {})
    assert dense["final_test_accuracy"] == 0.65


# --- the job: the table in the spec, then real processes --------------------------------------
CLICKS = {"train": 40_000, "test": 8_000}


def dlrm_config(**options):
    from paramserver.spec.config import TrainConfig
    settings = dict(model="dlrm", dataset="clicks", dataset_options=CLICKS, workers=2,
                    servers=2, batch_size=128, lr=0.1, epochs=1.0, eval_interval=1.0)
    return TrainConfig(**{**settings, **options})


def test_the_job_carries_the_table_and_its_model_options():
    from paramserver.launch.jobs import prepare_spec
    from paramserver.spec.job import JobSpec, TableSpec
    spec = prepare_spec(dlrm_config(model_options={"dim": 8, "row_budget": 5000,
                                                   "admit_after": 2, "table_lr": 0.1}))
    assert spec.tables == (TableSpec("emb", 8, lr=0.1, row_budget=5000, admit_after=2),)
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert prepare_spec(dlrm_config()).tables == (TableSpec("emb", 16),)
    assert prepare_spec(dlrm_config(model="mlp", dataset="digits", dataset_options={})).tables == ()
    with pytest.raises(ValueError, match="sparse table.*--compress"):
        prepare_spec(dlrm_config(compress="topk"))
    with pytest.raises(ValueError, match="tables.emb.evict"):
        prepare_spec(dlrm_config(model_options={"evict": "fifo"}))


# ASP in the slow set (the default suite is at its budget): the same path, table rows
# through two shards, runs by default under BSP; tests/server/test_sparse_ps.py runs ASP rows.
@pytest.mark.parametrize("sync", ["bsp", pytest.param("asp", marks=pytest.mark.slow)])
def test_dlrm_trains_through_two_servers_to_an_auc_well_above_chance(tmp_path, sync):
    from paramserver.launch.jobs import run_training
    from paramserver.runlog.metrics import read_records
    summary = run_training(dlrm_config(sync=sync), tmp_path / "run", quiet=True, timeout=240)
    assert summary["final_test_auc"] > 0.66, summary  # chance is 0.5; one epoch gives ~0.71
    assert summary["samples"] >= CLICKS["train"] and summary["best_test_auc"] >= 0.66
    records = read_records(tmp_path / "run" / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals and all("auc" in e for e in evals) and evals[-1]["final"]
    # The rows live on both shards, split by key hash, none evicted under the default budget.
    rows = {}
    for r in records:
        if r["kind"] == "server":
            rows[r["server"]] = r["table_rows"]
    assert set(rows) == {0, 1} and min(rows.values()) > 0.3 * max(rows.values())
    steps = [r for r in records if r["kind"] == "step"]
    assert {r["worker"] for r in steps} == {0, 1}
    if sync == "bsp":
        assert max(r["staleness"] for r in steps) == 0


def test_a_compare_report_of_click_models_is_scored_by_auc(tmp_path):
    """report.html of dlrm runs: time to the target AUC (default 0.7), AUC columns."""
    import json

    from paramserver.report import build_report, collect, table_rows
    root = tmp_path / "cmp"
    plan = {"scenarios": {"one-slow": {"straggler": "1:3", "description": "slow"}},
            "policies": ["bsp", "asp"], "repeats": 1, "target_accuracy": None}
    root.mkdir()
    (root / "compare.json").write_text(json.dumps(plan))
    for policy, hit in (("bsp", 3.0), ("asp", 1.5)):
        job = {"sync": {"name": policy}, "workers": 2, "batch_size": 8,
               "task": {"model": "dlrm", "dataset": "clicks"}}
        records = [{"t": t, "kind": "step", "worker": w, "step": n, "batch": 8, "compute_s": 0.1,
                    "wait_s": 0.0, "pull_s": 0.0, "push_s": 0.0, "staleness": 0}
                   for n, t in enumerate((1.0, 2.0, 4.0)) for w in (0, 1)]
        records += [{"t": t, "kind": "eval", "accuracy": 0.6, "auc": auc, "samples": 8,
                     "final": t == 5.0}
                    for t, auc in ((0.5, 0.55), (hit, 0.71), (5.0, 0.72))]
        run = root / "runs" / "one-slow" / policy / "rep-0"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run / "summary.json").write_text(json.dumps(summarize(records, job)))
    c = collect(root)
    assert (c.score, c.target) == ("auc", 0.7)
    rows = {r.policy: r for r in table_rows(c)}
    assert (rows["bsp"].tta_median, rows["asp"].tta_median) == (3.0, 1.5)
    assert rows["asp"].speedup == 2.0 and rows["asp"].final_accuracy == 0.72
    page = build_report(root).read_text()
    assert "Time to test AUC 0.7" in page and "final AUC" in page and "0.7200" in page


def test_the_simulator_refuses_to_train_a_model_with_a_sparse_table(tmp_path, capsys):
    from paramserver.cli.main import main
    code = main(["simulate", "--train", "--model", "dlrm", "--dataset", "clicks",
                 "--dataset-opt", "train=500", "--dataset-opt", "test=100", "--workers", "2",
                 "--steps", "2", "--quiet", "--out", str(tmp_path / "sim")])
    assert code == 2 and "sparse table" in capsys.readouterr().err
