"""Test helper: the model, torch optimizers, schedules and batches that a launched script and
torch in the test's own process share (tests/optim/test_script_optimizer.py,
tests/optim/test_optimizer_state.py)."""

import textwrap

# What the script and the local reference share: the model, the optimizer and schedule, and
# step k's global batch (rank r of W trains on rows r::W of it).
SETUP = textwrap.dedent("""
    import torch

    def build(kind):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(),
                                    torch.nn.Linear(8, 2))
        named = dict(model.named_parameters())
        weights = [p for n, p in named.items() if n.endswith("weight")]
        biases = [p for n, p in named.items() if not n.endswith("weight")]
        if kind == "adamw":  # no decay on biases; OneCycle moves lr and betas every step
            opt = torch.optim.AdamW([{"params": weights, "weight_decay": 0.1},
                                     {"params": biases, "weight_decay": 0.0}],
                                    lr=0.01, betas=(0.8, 0.95))
            return model, opt, lambda o: torch.optim.lr_scheduler.OneCycleLR(
                o, max_lr=0.05, total_steps=100)
        if kind == "adam":  # no schedule: a resumed job's must go on as if never stopped
            return model, torch.optim.Adam([{"params": weights},
                                            {"params": biases, "lr": 0.02}],
                                           lr=0.01, betas=(0.8, 0.95)), None
        others = {"adagrad": (torch.optim.Adagrad, {"lr_decay": 1e-3}),
                  "rmsprop": (torch.optim.RMSprop, {"momentum": 0.5, "centered": True}),
                  "adamax": (torch.optim.Adamax, {"betas": (0.8, 0.95)}),
                  "amsgrad": (torch.optim.AdamW, {"amsgrad": True, "weight_decay": 0.05})}
        if kind in others:  # two groups each; an exponential schedule moves the lr
            cls, extra = others[kind]
            opt = cls([{"params": weights}, {"params": biases, "lr": 0.005}], lr=0.01,
                      **extra)
            return model, opt, lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.98)
        if kind == "warmup":  # back at the base lr after 5 steps: the servers must see it
            opt = torch.optim.SGD([{"params": weights, "weight_decay": 1e-3},
                                   {"params": biases}], lr=0.1, momentum=0.9)
            return model, opt, lambda o: torch.optim.lr_scheduler.LambdaLR(
                o, lambda s: min(1.0, (s + 1) / 5))
        opt = torch.optim.SGD([{"params": weights, "weight_decay": 1e-3},
                               {"params": biases, "lr": 0.05}],
                              lr=0.1, momentum=0.9, nesterov=True)
        return model, opt, lambda o: torch.optim.lr_scheduler.StepLR(o, 5, gamma=0.5)

    def batch(step, workers):
        g = torch.Generator().manual_seed(step)
        return torch.randn(16 * workers, 5, generator=g), torch.randn(16 * workers, 2,
                                                                       generator=g)
""")
