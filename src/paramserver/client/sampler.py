"""A batch sampler for torch.utils.data.DataLoader that follows the policy's batch size.

    loader = DataLoader(data, batch_sampler=paramserver.BatchSampler(len(data), opt))

Each epoch is one permutation of range(dataset_len) (the same on every rank: seeded by `seed`
and the epoch number), dealt round-robin into disjoint per-rank shards; a rank walks its shard
exactly once per epoch. A batch takes `opt.batch_size` indices, read when the DataLoader asks
for the batch (with num_workers=0 that is after the previous step(); worker processes
prefetch, so their batches lag the policy by the prefetch depth). A batch that reaches the end
of an epoch is filled from the next one, so every batch has the size the policy released; the
iterator ends when the job does (`opt.should_stop`), so it has no len(): the job's budget
(`launch --steps/--max-seconds`), not an epoch count, says how long training runs.

In an elastic job (`launch --workers MIN:MAX`, the optimizer made with `data_len`) ranks come
and go, so no rank owns a shard: each batch is the samples the optimizer's current release
names (positions of the epoch's permutation of the whole set, dealt by the coordinator's
ledger), so every epoch is seen exactly once whoever is there. Such a batch exists only once
its release has come, so a DataLoader that prefetches (num_workers > 0) is refused with a clear
error at its first look ahead.
"""

from __future__ import annotations

import torch
import torch.utils.data.distributed


class BatchSampler:
    """Yields lists of dataset indices, `opt.batch_size` at a time, until the job stops."""

    def __init__(self, dataset_len: int, opt, shuffle: bool = True, seed: int = 0,
                 rank: int | None = None, size: int | None = None):
        if dataset_len < 1:
            raise ValueError(f"dataset_len must be >= 1, got {dataset_len}")
        self.dataset_len, self.opt, self.shuffle, self.seed = dataset_len, opt, shuffle, seed
        self.rank = opt.rank if rank is None else rank
        self.size = opt.size if size is None else size
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} outside a job of {self.size} workers")
        if dataset_len < self.size:
            raise ValueError(f"{dataset_len} samples cannot be split over {self.size} ranks")
        self.epoch = 0
        self._shard = self._deal(0)
        self._pos = 0
        self.elastic = bool(getattr(opt, "elastic", False))
        if self.elastic and getattr(opt, "data_len", None) != dataset_len:
            raise ValueError(f"an elastic job's sampler draws what the coordinator deals: make "
                             f"the optimizer with data_len={dataset_len} (it has "
                             f"{getattr(opt, 'data_len', None)})")

    def _deal(self, epoch: int) -> list[int]:
        """This rank's indices of `epoch`: every index of the dataset is in one rank's shard."""
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(self.dataset_len, generator=gen)
        else:
            order = torch.arange(self.dataset_len)
        return order[self.rank::self.size].tolist()

    @property
    def epochs_done(self) -> float:
        """Epochs of this rank's shard walked so far (fractional)."""
        return self.epoch + self._pos / len(self._shard)

    def __len__(self) -> int:
        """The batches of a rank's share of one epoch at the batch size now in force, as
        torch's DistributedSampler under a DataLoader reports it (`len(train_loader)`: scripts
        print it or size their schedules by it; torch counts every rank's share as the
        largest one). Iterating goes on until the job stops, across epochs, whatever this
        says."""
        share = -(-self.dataset_len // self.size)
        return -(-share // max(1, int(self.opt.batch_size)))

    def take(self, n: int) -> list[int]:
        """The next `n` indices of this rank's stream (crossing into the next epoch if needed)."""
        batch: list[int] = []
        while len(batch) < n:
            if self._pos == len(self._shard):
                self.epoch += 1
                self._shard, self._pos = self._deal(self.epoch), 0
            got = self._shard[self._pos:self._pos + n - len(batch)]
            self._pos += len(got)
            batch += got
        return batch

    def drawn(self) -> list[int]:
        """An elastic job's batch: the indices the optimizer's current release names."""
        from paramserver.data.ledger_sampler import epoch_order
        batch: list[int] = []
        for epoch, lo, hi in self.opt.kv.drawn or ():
            if self.shuffle:
                batch += epoch_order(self.dataset_len, self.seed, epoch)[lo:hi].tolist()
            else:
                batch += range(lo, hi)
            self.epoch = epoch
        return batch

    def __iter__(self):
        last = None  # the release the last batch came from
        while not self.opt.should_stop:
            # (a release naming no samples: a coordinator restarted without a checkpoint of
            # its ledger; the rank's own stream then, not exactly-once)
            named = self.elastic and self.opt.kv.drawn is not None
            if not named:
                yield self.take(self.opt.batch_size)
                continue
            if self.opt.kv.drawn is last:
                # Asked again before step() brought the next release: a DataLoader that
                # prefetches (num_workers > 0) would train the same samples twice.
                raise RuntimeError(
                    "paramserver.BatchSampler: the next batch was asked for before step() "
                    "brought the release naming it (a DataLoader with num_workers > 0 "
                    "prefetches); an elastic job deals each batch when it is released: use "
                    "num_workers=0, or load faster in the dataset itself")
            last = self.opt.kv.drawn
            yield self.drawn()


class DistributedSampler(torch.utils.data.distributed.DistributedSampler):
    """torch's DistributedSampler with the job's size and rank as defaults (torch's own asks a
    process group, which a parameter-server job has none of): each iteration is one epoch of
    this rank's share, `set_epoch` reshuffles, `len()` is the share's size, as in DDP."""

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        from paramserver.client import api
        super().__init__(dataset, num_replicas=api.size() if num_replicas is None
                         else num_replicas, rank=api.rank() if rank is None else rank,
                         shuffle=shuffle, seed=seed, drop_last=drop_last)

    def __iter__(self):
        """This rank's indices of the epoch, ending early once the job has stopped (a budget
        given to launch): the script's loop over its DataLoader ends cleanly mid-epoch. An
        epoch that begins after the stop yields one index, not none, so a script that peeks at
        its loader (DDP's tutorial: `len(next(iter(loader))[0])`) still runs; its step does
        nothing."""
        from paramserver.client import api
        for n, index in enumerate(super().__iter__()):
            if api._joined and api._joined[-1].should_stop and n:
                return
            yield index
