"""Train your own model through the parameter server.

Run it as the workers of a local job:
    paramserver launch --workers 2 --sync bsp --steps 150 -- python examples/train_my_model.py
"""

import torch
from sklearn.datasets import load_digits
from torch import nn

import paramserver

X, y = load_digits(return_X_y=True)
X = torch.tensor(X / 16.0, dtype=torch.float32)
y = torch.tensor(y)

torch.manual_seed(0)  # every worker builds the same model; rank 0's weights are the start
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
opt = paramserver.DistributedOptimizer(model)
gen = torch.Generator().manual_seed(opt.rank)

while not opt.should_stop:
    idx = torch.randint(0, len(X), (opt.batch_size,), generator=gen)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
    loss.backward()
    opt.step(loss=loss)

with torch.no_grad():
    accuracy = (model(X).argmax(1) == y).float().mean().item()
print(f"worker {opt.rank}: training accuracy {accuracy:.3f}")
opt.close()
