"""Your own model, DataLoader and test split, compared under several sync policies.

Rank 0 scores the held-out split every few steps and reports it with opt.report(); that is
the evaluation `paramserver compare` takes the time to target from:
    paramserver compare --sync bsp,lbbsp,r2sp --workers 3 --steps 150 --no-single \\
        -- python examples/compare_my_model.py
It runs under `paramserver launch` as well.
"""

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import paramserver

EVERY = 5  # steps between rank 0's test evaluations

torch.set_num_threads(1)  # the workers share this machine's cores
X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y)
order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
test, train = order[:360], order[360:]  # the same split on every rank
data = TensorDataset(X[train], y[train])

torch.manual_seed(0)  # rank 0's weights start the job; the others receive them on first pull
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

with paramserver.DistributedOptimizer(model) as opt:
    loader = DataLoader(data, batch_sampler=paramserver.BatchSampler(len(data), opt, seed=0))
    for step, (x, target) in enumerate(loader):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step(loss=loss)
        if opt.rank == 0 and step % EVERY == 0 and not opt.should_stop:
            with torch.no_grad():
                logits = model(X[test])
                accuracy = (logits.argmax(1) == y[test]).float().mean().item()
                test_loss = nn.functional.cross_entropy(logits, y[test]).item()
            opt.report(test_accuracy=accuracy, test_loss=test_loss)
