"""Train your own model through the parameter server, with your own DataLoader.

Run it as the workers of a local job:
    paramserver launch --workers 2 --sync bsp --steps 150 -- python examples/train_my_model.py
or of an elastic one, which more copies join by hand and a SIGTERM leaves cleanly:
    paramserver launch --workers 2:4 --sync bsp --steps 150 -- python examples/train_my_model.py
    PARAMSERVER_JOIN=$(cat RUN/coordinator.addr) PARAMSERVER_KEYS=RUN/keys \
        python examples/train_my_model.py
"""

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import paramserver

X, y = load_digits(return_X_y=True)
data = TensorDataset(torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y))

torch.manual_seed(0)  # rank 0's weights start the job; the others receive them on first pull
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

# (data_len: an elastic job deals each epoch's samples out to whoever is there)
with paramserver.DistributedOptimizer(model, data_len=len(data)) as opt:  # updates: servers
    loader = DataLoader(data, batch_sampler=paramserver.BatchSampler(len(data), opt, seed=0))
    for x, target in loader:  # batches follow the size the sync policy releases
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step(loss=loss)
    with torch.no_grad():
        accuracy = (model(data.tensors[0]).argmax(1) == data.tensors[1]).float().mean().item()
    print(f"worker {opt.rank}: training accuracy {accuracy:.3f}")
