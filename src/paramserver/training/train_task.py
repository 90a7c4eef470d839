"""The training task: a worker's loop of pull, forward/backward on its shard, push, clock."""

from __future__ import annotations

import time
import warnings

import numpy as np
import psutil
import torch
from torch import nn

from paramserver.compression.auto import link_rate
from paramserver.compression.wire import WireSpec
from paramserver.compression.ranges import RangeAccumulator, make_plan
from paramserver.emulation.links import link_for
from paramserver.client.device_staging import DeviceStaging, resolve_device, staging_forced
from paramserver.models.flat_binding import GradsBoundCheck, bind_to_flat, point_params_at
from paramserver.client.layer_sched import LayerRequests
from paramserver.training.core.amp import MixedPrecision
from paramserver.client.pacing import Pacer
from paramserver.training.sparse_step import SparseRows, TableRows
from paramserver.client.kv import KVWorker
from paramserver.client.preemption import Preemption
from paramserver.data.ledger_sampler import LedgerSampler
from paramserver.spec.job import TaskSpec
from paramserver.models.workload import build

# Borrowed pull replies are read-only buffers; the model only reads its parameters.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


class HostLoad:
    """CPU percent and free-memory fraction for load-aware predictors, sampled at most every
    `interval` seconds: two psutil calls cost ~0.1 ms (more with cold caches), a real share of a
    few-ms step. cpu_percent covers the time since its previous sample either way."""

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.next_at = 0.0
        self.last = (0.0, 1.0)
        psutil.cpu_percent(interval=None)  # starts the cpu_percent window

    def __call__(self) -> tuple[float, float]:
        now = time.monotonic()
        if now >= self.next_at:
            mem = psutil.virtual_memory()
            self.last = (psutil.cpu_percent(interval=None), mem.available / mem.total)
            self.next_at = now + self.interval
        return self.last


class StepLoop:
    """One worker's training state; `step()` runs one released step and returns its record."""

    def __init__(self, kv: KVWorker, task: TaskSpec):
        self.kv, self.task = kv, task
        job = kv.spec.job
        torch.set_num_threads(task.threads)
        self.ds, self.model, self.keys = build(task, job.dtype)
        self.device = resolve_device(task.device, rank=kv.rank)
        staged = self.device.type != "cpu" or staging_forced()
        if staged:
            self.model.to(self.device)
        # `--compress auto` is chosen here, once: by this worker's emulated link (or its share
        # of the shards' links) and the sizes of the model's tensors (compression/auto.py).
        def rate(link):
            return None if link is None else link.rate
        self.wire = WireSpec.parse(task.compress, task.compress_options, task.pull_compress,
                                   task.pull_refresh).resolve(
            link_rate(rate(link_for(job.links, "w", kv.rank)),
                      [rate(link_for(job.links, "s", i)) for i in range(job.servers)],
                      job.workers),
            [p.keys.size for p in self.keys.params])
        self.compressor = self.wire.compressor()  # None: the dense buffer as it is
        # On a device a codec or a pruner works on the gradient where backward left it: only
        # the payload (or the chosen entries) crosses to the host, never the whole gradient.
        self.from_device = staged and (self.compressor is not None
                                       or self.wire.push_codec() is not None)
        # On cpu, gradients live where a server on this host reads pushes in place (shared
        # memory), and the parameters' buffer is left untouched (empty) until bind_to_flat
        # copies each tensor in and frees it: the worker's peak is the parameters plus one
        # tensor, where a zeroed buffer would hold two copies of the model at once. On cuda
        # the buffers are on the device, staged through pinned host copies (the gradients'
        # the same shared memory, page-locked), or none for pushes encoded on the device.
        self.staging = DeviceStaging(
            self.model, self.keys,
            host_params=None if staged else torch.empty(self.keys.num_keys, dtype=self.keys.dtype),
            host_grads=False if self.from_device else torch.from_numpy(kv.shared_buffer()))
        self.params, self.grads = self.staging.params, self.staging.grads
        bind_to_flat(self.model, self.keys, self.params, self.grads)
        self.staging.watch(self.model)
        self.params_np, self.grads_np = self.staging.host_params_np, self.staging.host_grads_np
        # An elastic job's ranks come and go: the coordinator's ledger, not a rank's shard,
        # says which samples each step trains on (every release names them).
        self.elastic = job.elastic
        if self.elastic:
            train = self.ds.train
            self.sampler = LedgerSampler(train.X, train.y, seed=task.seed, ids=train.ids)
            self.sampler.fallback_rank = kv.rank
        else:
            self.sampler = self.ds.sampler(kv.rank, job.workers, seed=task.seed)
            self._skip(kv.spec.resume_samples)
        # A model with a sparse table (DLRM): each step also pulls its batch's rows and pushes
        # their gradients with the dense gradient, in one push_step.
        table = getattr(self.model, "sparse_table", None)
        self.rows = None if table is None else SparseRows(
            self.model, self.sampler, TableRows(kv, table), self.device)
        self.pacer = Pacer(kv.rank, task.straggler, task.device_time)
        self.loss_fn = nn.CrossEntropyLoss()
        self.amp = MixedPrecision(task.amp, self.device, self.model.parameters())
        self.overflowed = False  # fp16: this step's gradient overflowed; zeros were pushed
        self.codec = WireValues(self.wire, self.keys.num_keys,
                                self.device if self.from_device else None)
        self.plan = make_plan(task.push_range, self.keys.num_keys,
                              [layer.keys for layer in self.keys.layers])
        self.held = None if self.plan is None else RangeAccumulator(
            self.keys.num_keys, self.grads_np.dtype)
        self.grads_bound = GradsBoundCheck(self.model, self.grads)
        schedule = task.schedule
        self.layered = None if schedule == "off" else LayerRequests(
            kv, self.model, self.keys, self.params_np, self.grads_np, schedule, self.staging)
        # Round mode: the next step's pull goes out with this step's push and the server
        # answers it the moment the round is applied, while the release is on its way.
        self.pull_ahead = (task.pull_ahead and self.plan is None
                           and kv.spec.apply_mode == "round" and self.layered is None)
        self.ahead = None  # (min_version, handle) of a pull sent ahead
        # A pull sent ahead to a single shard is not copied: the model computes on the reply
        # in place (the server's arena on this host) and hands it back before pushing, so by
        # the round's last push no worker reads the values the server then updates in place.
        # (Not on a device: the model's parameters live there, not in the reply; nor with
        # delta pulls, which add into our own copy.)
        self.borrowing = (self.pull_ahead and len(kv.shards) == 1 and task.borrow
                          and not staged and self.codec.pull is None)
        self.loan, self.own_params = None, True
        self.t0 = time.monotonic()
        self.nbytes = self.keys.num_keys * self.params.element_size()
        self.host_load = HostLoad()
        self.grads_zeroed = False
        self.data_s = 0.0  # the latest step's time drawing its batch (part of its compute)
        self.sent_entries = 0  # a pruner's last push: bytes of its keys and values

    def _skip(self, samples: int) -> None:
        """A resumed worker draws the batches it drew before, so its data order goes on alike."""
        while samples > 0:
            take = min(samples, 1 << 16)
            self.sampler.next_indices(take)
            samples -= take

    def compute(self, batch: int) -> float:
        """Forward and backward on the next batch (with a sparse table: the batch fetched with
        its rows); dense gradients land in the flat buffer."""
        if self.rows is None:
            drawn = time.perf_counter()
            xb, yb = self.sampler.next_batch(batch)
            self.data_s = time.perf_counter() - drawn
        if not self.grads_zeroed:
            self.grads.zero_()
            self.staging.grads_zeroed()
        self.grads_zeroed = False
        with self.amp.autocast():
            if self.rows is None:
                if self.staging.staged:
                    xb, yb = xb.to(self.device), yb.to(self.device)
                out = self.model(xb.to(self.params.dtype))
            else:
                out, yb = self.rows.forward(self.params.dtype)
            loss = self.loss_fn(out, yb)
        self.amp.backward(loss)
        if self.amp.scaler is not None:
            self.overflowed = not self.amp.finish()  # unscaled in place, or overflowed
            if self.overflowed:
                self.grads.zero_()  # nothing to push: zeros
            # (torch's unscale leaves the version counter alone: the hooks' copies are stale)
            self.staging.grads_replaced()
        if not self.grads_bound():  # never expected; keeps pushes right
            self.keys.flatten_grads(self.model, self.grads)
            self.staging.grads_replaced()
            bind_to_flat(self.model, self.keys, self.params, self.grads)
            self.own_params = True
        if self.layered is None and not self.from_device:
            self.staging.grads_to_host()  # cuda: the last layers' copies (and the device) done
        return float(loss.detach())  # (on a device: waits for backward)

    def prepare_next(self) -> None:
        """Zero the gradient buffer for the next step while the worker waits for its release
        (in BSP a core idles then). Safe once the push is acknowledged: a server on this host
        has read the buffer in place by then."""
        if not self.grads_zeroed:
            self.grads.zero_()
            self.staging.grads_zeroed()
            self.grads_zeroed = True

    def step(self, release, wait_s: float) -> tuple[dict, float]:
        """Run the released step; returns (metrics record, modelled compute seconds)."""
        if self.elastic:
            self.sampler.feed(self.kv.drawn)
        if self.layered is not None:
            return self.step_layered(release, wait_s)
        t_a = time.perf_counter()
        if self.rows is not None:  # on its way while the dense pull is (or was asked ahead)
            self.rows.request(release.batch_size, release.min_version)
        pull_bytes = self.pull(release)
        if self.rows is not None:
            pull_bytes += self.rows.receive()
        t_b = time.perf_counter()
        loss = self.compute(release.batch_size)
        self.kv.completion.give_back(self.loan)
        self.loan = None
        real = time.perf_counter() - t_b
        compute, factor = self.pacer.stretch(release.step, time.monotonic() - self.t0,
                                             release.batch_size, real)
        t_c = time.perf_counter()
        staleness, push_bytes = self.push(release)
        if self.pull_ahead:
            version = release.min_version + 1  # what the release after this round will ask
            self.staging.before_host_write()
            self.ahead = version, self._pull_async(version)
            if self.rows is not None:  # the next batch's rows, likewise
                self.rows.request(release.batch_size, version)
        t_d = time.perf_counter()
        record = {"loss": round(loss, 6), "compute_s": round(compute, 6),
                  "real_compute_s": round(real, 6), "wait_s": round(wait_s, 6),
                  "pull_s": round(t_b - t_a, 6), "push_s": round(t_d - t_c, 6),
                  "data_s": round(self.data_s, 6),
                  "pull_bytes": pull_bytes, "push_bytes": push_bytes,
                  "staleness": int(staleness), "factor": round(factor, 4),
                  "epoch": round(self.sampler.epoch, 4), **self.codec.fields,
                  **self.device_fields(push_bytes)}
        if self.codec.saved:  # what the push and pull formats saved against float32
            record["push_saved_bytes"] = self.nbytes - push_bytes
            record["pull_saved_bytes"] = self.nbytes - pull_bytes
        return record, compute

    def step_layered(self, release, wait_s: float) -> tuple[dict, float]:
        """The step with per-layer requests: pulls waited on by forward, pushes from backward."""
        t_a = time.perf_counter()
        self.layered.begin(release)
        t_b = time.perf_counter()
        loss = self.compute(release.batch_size)
        t_c = time.perf_counter()
        real = t_c - t_b - self.layered.suspend
        compute, factor = self.pacer.stretch(release.step, time.monotonic() - self.t0,
                                             release.batch_size, real)
        t_c2 = time.perf_counter()
        stale = self.layered.finish()
        t_d = time.perf_counter()
        record = {"loss": round(loss, 6), "compute_s": round(compute, 6),
                  "real_compute_s": round(real, 6), "wait_s": round(wait_s, 6),
                  "pull_s": round(t_b - t_a, 6), "push_s": round(t_d - t_c2, 6),
                  "suspend_s": round(self.layered.suspend, 6), "data_s": round(self.data_s, 6),
                  "pull_bytes": self.nbytes, "push_bytes": self.nbytes,
                  "staleness": max(stale.values(), default=0), "factor": round(factor, 4),
                  "epoch": round(self.sampler.epoch, 4), **self.codec.fields,  # (dense)
                  **self.device_fields(self.nbytes)}
        record.update({f"staleness_layer_{i}": s for i, s in sorted(stale.items())})
        return record, compute

    def device_fields(self, push_bytes: int) -> dict:
        """The step record's device figures (staged models only): the bytes this step's push
        copied off the device (`d2h_bytes`: the payload where it was encoded there), the
        buffers held there for the wire (`device_buffer_bytes`, fixed for the job), and on
        cuda the device memory torch holds after the step (`device_mem_bytes`); fp16's loss
        scale and whether this step overflowed."""
        out = self.amp.fields()
        if self.amp.scaler is not None:
            out["amp_overflow"] = int(self.overflowed)
        if not self.staging.staged:
            return out
        out["d2h_bytes"] = int(self.d2h_bytes(push_bytes))
        out["device_buffer_bytes"] = self.staging.device_bytes() + self.codec.device_bytes()
        if self.device.type == "cuda":
            out["device_mem_bytes"] = int(torch.cuda.memory_allocated(self.device))
        return out

    def d2h_bytes(self, push_bytes: int) -> int:
        """Bytes this step's gradient copied from the device to the host."""
        if not self.from_device:
            return self.nbytes + (0 if self.rows is None else self.rows.nbytes())
        if self.codec.push is not None:  # a host codec copies the whole vector first
            return push_bytes if self.codec.push.device_native else self.nbytes
        return self.sent_entries  # a pruner's chosen keys and values

    def pull(self, release) -> int:
        """Fresh parameters (only the step's window under --push-range); returns bytes."""
        if self.plan is None:
            ahead, self.ahead = self.ahead, None
            if ahead is not None and ahead[0] == release.min_version:
                if not self.borrowing:
                    self.kv.wait(ahead[1])
                    self.staging.params_from_host()
                    return self._pulled(ahead[1])
                values, self.loan = self.kv.completion.borrow(ahead[1])
                point_params_at(self.model, self.keys, torch.from_numpy(values))
                self.own_params = False
                return self.nbytes
            if ahead is not None:  # the release asks for another version: ask again
                self.kv.completion.abandon(ahead[1])
                self.codec.abandoned()
            self._own_params()
            self.staging.before_host_write()
            handle = self._pull_async(release.min_version)
            self.kv.wait(handle)
            self.staging.params_from_host()
            return self._pulled(handle)
        w = self.plan.at(release.step)
        self.staging.before_host_write()
        self.kv.pull(w, out=self.params_np[w.lo:w.hi], min_version=release.min_version)
        self.staging.params_from_host(w.lo, w.hi)
        return w.size * self.params_np.itemsize

    def _pull_async(self, min_version: int):
        """The whole model's pull: dense, or (--pull-compress) a delta or a dense refresh."""
        if self.codec.pull is None:
            return self.kv.pull_async(out=self.params_np, min_version=min_version)
        delta = self.codec.next_pull()
        return self.kv.pull_async(out=self.params_np, min_version=min_version, delta=delta,
                                  ref=delta is None)

    def _pulled(self, handle) -> int:
        return handle.nbytes if handle.delta else self.nbytes

    def _own_params(self) -> None:
        """The model computes on its own buffer again (after computing on borrowed values)."""
        if not self.own_params:
            point_params_at(self.model, self.keys, self.params)
            self.own_params = True

    def push(self, release) -> tuple[int, int]:
        """Push this step's gradient, pruned by the compressor or cut to the step's window
        (the rest held back for later); returns (staleness, bytes sent)."""
        tags = {"step": release.step, "batch": release.batch_size, "scale": release.scale}
        if self.plan is not None:
            w = self.plan.at(release.step)
            self.held.add(self.grads_np)
            values = self.held.take(w)
            return self.kv.push(values, w, **tags), values.nbytes
        tags["round_size"] = release.round_size  # the whole step in one push per shard
        tags["round_id"] = release.round_id
        if self.rows is not None:  # dense values and rows in one step, so a round waits for both
            staleness = self.kv.push_step(dense=self.grads_np, rows=self.rows.grads(), **tags)
            return staleness, self.nbytes + self.rows.nbytes()
        if self.codec.push is not None:  # dense, every value through the codec
            values, sent = self.codec.before_push(
                self.grads if self.from_device else self.grads_np)
            handle = self.kv.push_async(values, **tags, codec=self.codec.push, sent=sent)
            staleness = self.kv.wait(handle)
            self.codec.after_push()
            return staleness, handle.nbytes
        if self.compressor is None:
            return self.kv.push(self.grads_np, **tags), self.nbytes
        sparse = self.compressor.compress(self.grads)  # where the gradient is; entries to host
        self.sent_entries = sparse.keys.nbytes + sparse.values.nbytes
        if sparse.is_dense and sparse.encoded is None:
            return self.kv.push(sparse.values, **tags), self.nbytes
        codec = self.compressor.codec
        sent = None if codec is None else np.empty_like(sparse.values)
        handle = self.kv.push_sparse_async(sparse.keys, sparse.values, **tags, codec=codec,
                                           sent=sent)
        if sent is not None:  # each shard's slice re-encoded: what that rounding kept back
            self.compressor.kept(sparse.keys, sparse.values - sent)
        return self.kv.wait(handle), handle.nbytes


class WireValues:
    """A worker's codecs (compression/wire.py): the dense push codec with its residual (what
    the codec lost, sent with the next step's gradient), and the pull codec with its count of
    delta pulls since the last dense one. With a `device`, the residual lives there and the
    pushes are encoded there (the gradient never crosses whole); else numpy on the host."""

    def __init__(self, wire: WireSpec, size: int, device: torch.device | None = None):
        self.push = wire.push_codec()
        self.pull = wire.pull_codec_object()
        self.refresh = wire.pull_refresh
        feedback = self.push is not None and wire.error_feedback

        def buffer():
            if not feedback:
                return None
            if device is None:
                return np.zeros(size, np.float32)
            return torch.zeros(size, dtype=torch.float32, device=device)
        self.residual, self._values, self._sent = buffer(), buffer(), buffer()
        self._since_dense = None  # delta pulls since the last dense one (None: none yet)
        # Constant per job: every step record says which formats its bytes are in.
        self.fields = {"push_codec": wire.label(), "pull_codec": wire.pull_codec or "none"}
        # step records say the bytes saved where a push or pull format is not float32
        self.saved = self.fields != {"push_codec": "none", "pull_codec": "none"}

    def device_bytes(self) -> int:
        """Bytes of the error-feedback buffers held on a device (0 on the host)."""
        bufs = [b for b in (self.residual, self._values, self._sent)
                if isinstance(b, torch.Tensor)]
        return sum(b.nbytes for b in bufs)

    def before_push(self, grads):
        """(values to push, the buffer each chunk's decoded values land in, or None)."""
        if self.residual is None:
            return grads, None
        if isinstance(self.residual, torch.Tensor):
            torch.add(grads, self.residual, out=self._values)
        else:
            np.add(grads, self.residual, out=self._values)
        return self._values, self._sent

    def after_push(self) -> None:
        if isinstance(self.residual, torch.Tensor):
            torch.sub(self._values, self._sent, out=self.residual)
        elif self.residual is not None:
            np.subtract(self._values, self._sent, out=self.residual)

    def next_pull(self):
        """The codec for this pull, or None for a dense one (the first, every refresh-th)."""
        if self._since_dense is None or self._since_dense + 1 >= self.refresh:
            self._since_dense = 0
            return None
        self._since_dense += 1
        return self.pull

    def abandoned(self) -> None:
        """A delta pull's reply was dropped: the shard moved its reference, our copy did not;
        the next pull is dense."""
        self._since_dense = None


def run(kv: KVWorker, task: TaskSpec) -> dict:
    """Train until the coordinator's release says stop; returns this worker's totals."""
    loop = StepLoop(kv, task)
    try:
        return _train(kv, loop)
    finally:
        loop.staging.close()  # page-locked host memory back before the KV unmaps it


def _train(kv: KVWorker, loop: StepLoop) -> dict:
    if kv.rank == 0:  # (a rank 0 joining a running elastic job offers too: the first won)
        kv.init(loop.staging.params_to_host())
    notice = Preemption() if loop.elastic else None
    t_wait = time.perf_counter()
    release = kv.start(len(loop.sampler) if loop.elastic else None)
    wait_s, steps = time.perf_counter() - t_wait, 0
    while not release.stop:
        if notice is not None and notice.given:  # between steps: the release is given back
            kv.bye("preempted")
            break
        record, compute = loop.step(release, wait_s)
        if notice is not None and notice.given:  # its push is in: the step counts, then gone
            kv.leave(release.step, release.batch_size, compute, record, "preempted")
            steps += 1
            break
        cpu, free = loop.host_load()
        t_wait = time.perf_counter()
        release = kv.clock(release.step, release.batch_size, compute, cpu, free, record,
                           while_waiting=loop.prepare_next)
        wait_s, steps = time.perf_counter() - t_wait, steps + 1
    if notice is not None:
        notice.restore()
    return {"rank": kv.rank, "steps": steps, "samples": loop.sampler.samples_drawn,
            "epochs": round(loop.sampler.epoch, 3), "left": kv.left}

