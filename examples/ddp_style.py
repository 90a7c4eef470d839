"""PyTorch's DDP tutorial script (multigpu_torchrun.py: a Trainer with its own epoch loop,
DistributedSampler, set_epoch, len(train_data)), moved to the parameter server. The changed
lines are marked `# paramserver:`; the rest is as the tutorial writes it.

    paramserver launch --workers 2 -- python examples/ddp_style.py 6 2

(total epochs, save every N epochs; the job ends when the scripts do.)
"""

import os
import sys

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import paramserver  # paramserver: instead of torch.distributed and DDP
from paramserver import DistributedSampler  # paramserver: the job's rank and size


def ddp_setup():
    paramserver.init()  # paramserver: instead of init_process_group(backend="nccl")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model  # paramserver: no DDP(model) wrapper
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot_path = snapshot_path
        self.epochs_run = 0

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[RANK{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | "
              f"Steps: {len(self.train_data)}", flush=True)
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.local_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    X, y = load_digits(return_X_y=True)
    train_set = TensorDataset(torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return train_set, model, optimizer


def prepare_dataloader(dataset, batch_size: int):
    return DataLoader(dataset, batch_size=batch_size, pin_memory=False, shuffle=False,
                      sampler=DistributedSampler(dataset))


def main(save_every: int, total_epochs: int, batch_size: int = 32,
         snapshot_path: str = "snapshot.pt"):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    # paramserver: the servers run this optimizer (its class, settings and groups)
    optimizer = paramserver.DistributedOptimizer(optimizer,
                                                 named_parameters=model.named_parameters())
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    with torch.no_grad():
        X, y = dataset.tensors
        accuracy = (model(X).argmax(1) == y).float().mean().item()
    print(f"[RANK{trainer.global_rank}] training accuracy {accuracy:.3f}", flush=True)
    optimizer.close()  # paramserver: instead of destroy_process_group()


if __name__ == "__main__":
    total_epochs, save_every = int(sys.argv[1]), int(sys.argv[2])
    main(save_every, total_epochs, snapshot_path=os.environ.get("SNAPSHOT", "snapshot.pt"))
