"""The issue's check: a user script with its own model (a small CNN) and its own DataLoader
(sklearn's 8x8 digits) runs under `launch` with 3 workers, reaches its target, and the model
launch writes (RUN/model.pt, from the final checkpoint under the script's own parameter names)
loads into a fresh model with the accuracy the workers saw."""

import subprocess
import sys
import textwrap

import pytest
import torch

from paramserver.runlog.model_file import export, read_model

MODEL = """
    import torch
    from torch import nn


    class DigitNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 8, 3, padding=1)
            self.head = nn.Linear(8 * 4 * 4, 10)

        def forward(self, x):
            x = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
            return self.head(torch.flatten(x, 1))


    def digits():
        # sklearn's digits, read from its file (importing sklearn.datasets costs seconds)
        from paramserver.data.digits import read_digits
        images, labels = read_digits()
        return torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16, torch.tensor(labels)


    def accuracy(model, x, y):
        with torch.no_grad():
            return (model(x).argmax(1) == y).float().mean().item()
"""

SCRIPT = """
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    import paramserver
    from mynet import DigitNet, accuracy, digits

    x, y = digits()
    data = TensorDataset(x, y)
    torch.manual_seed(0)
    model = DigitNet()
    with paramserver.DistributedOptimizer(model) as opt:
        for xb, yb in DataLoader(data, batch_sampler=paramserver.BatchSampler(len(data), opt)):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step(loss)
        print(f"rank {opt.rank} accuracy {accuracy(model, x, y):.4f}")
"""


def test_a_user_cnn_trains_under_launch_and_its_exported_model_loads(tmp_path):
    (tmp_path / "mynet.py").write_text(textwrap.dedent(MODEL))
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "paramserver", "launch", "--workers", "3", "--steps", "30",
         "--lr", "0.1", "--optimizer", "momentum", "--quiet", "--out", str(out),
         "--timeout", "120", "--",
         sys.executable, str(tmp_path / "train.py")],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model in {out / 'model.pt'}" in proc.stdout, proc.stdout
    seen = [float(line.rsplit(" ", 1)[1]) for line in proc.stdout.splitlines()
            if " accuracy " in line]
    assert len(seen) == 3 and min(seen) > 0.75, proc.stdout

    sys.path.insert(0, str(tmp_path))
    try:
        from mynet import DigitNet, accuracy, digits
    finally:
        sys.path.remove(str(tmp_path))
    fresh = DigitNet()
    fresh.load_state_dict(read_model(out / "model.pt"))  # strict: the script's own names
    x, y = digits()
    exported = accuracy(fresh, x, y)
    # BSP: every worker ends on the final parameters, which the exported model holds.
    assert seen == [round(exported, 4)] * 3, (exported, seen)

    # Export of the launch run (the command: tests/launch/test_export.py) gives the same tensors.
    for fmt in ("pt", "safetensors"):
        if fmt == "safetensors":
            pytest.importorskip("safetensors", reason="the optional safetensors extra")
        path, what = export(out, tmp_path / f"digits.{fmt}", fmt)
        assert what == f"the final model {out / 'model.pt'}"
        again = read_model(path)
        assert sorted(again) == ["conv.bias", "conv.weight", "head.bias", "head.weight"]
        assert all(torch.equal(again[k], v) for k, v in fresh.state_dict().items())
    # From the final checkpoint itself, cut by the layout the coordinator wrote.
    (out / "model.pt").unlink()
    path, what = export(out, tmp_path / "again.pt", "pt")
    assert what.startswith("checkpoint ")
    assert all(torch.equal(read_model(path)[k], v) for k, v in fresh.state_dict().items())
