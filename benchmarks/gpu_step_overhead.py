"""Benchmark: per-step overhead of the parameter-server path over a local step, ResNet-18 sized.

    PYTHONPATH=src .venv/bin/python benchmarks/gpu_step_overhead.py --device auto --workers 4

`--workers` processes share one device (one GPU, or this machine's CPU). Each run has two
arms, taking turns `--repeats` times so that load hits them alike:

- local: each process trains its own ResNet-18 with a local torch SGD step (no servers);
- ps: `paramserver launch --workers N --sync bsp` runs the same script, whose model trains
  through `paramserver.DistributedOptimizer` (on cuda: the device-resident flat buffers
  staged through pinned host copies, client/device_staging.py); one shard server.

A step is one iteration of the loop (batch copy, forward, backward, the update: local, or
push + the policy's release + pull), ended by a device synchronize so that its time is real
on cuda. Printed: the median step of each arm over every worker's steps after `--warmup`,
the overhead (ps - local, in ms and as a ratio) and, for the ps arm, the median push, wait
and real compute times the workers reported.

The model is torchvision's `resnet18` with random weights when torchvision is importable;
otherwise the same network written out below (11,689,512 parameters, checked at start): the
output says which. Images are synthetic (random, `--image` pixels square, 1000 classes).
Defaults: on cuda 224 px, batch 32, 30 steps; on cpu 32 px, batch 4, 8 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESNET18_PARAMS = 11_689_512


# --- the model -----------------------------------------------------------------------------------
def resnet18():
    """(model, source): torchvision's resnet18 with random weights, else the written-out one."""
    try:
        from torchvision.models import resnet18 as tv_resnet18
        return tv_resnet18(weights=None), "torchvision.models.resnet18"
    except ImportError:
        return _ResNet18(), "written out (torchvision not importable)"


def _ResNet18():
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            skip = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + skip)

    class ResNet18(nn.Module):
        def __init__(self, classes=1000):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
            for i, (cin, cout, stride) in enumerate(widths, 1):
                setattr(self, f"layer{i}", nn.Sequential(Block(cin, cout, stride),
                                                         Block(cout, cout, 1)))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet18()


# --- one worker process --------------------------------------------------------------------------
def worker(args) -> None:
    import faulthandler

    import torch
    # A worker stuck past the benchmark's timeout prints every thread's stack and exits, so a
    # hang on a device shows where it is instead of only that it happened.
    faulthandler.dump_traceback_later(0.9 * args.timeout, exit=True)
    from torch import nn
    torch.set_num_threads(1)  # the workers share the cores
    torch.manual_seed(int(os.environ.get("RANK", args.rank)))
    device = torch.device(args.device)
    model, source = resnet18()
    count = sum(p.numel() for p in model.parameters())
    assert count == RESNET18_PARAMS, count
    model.to(device)
    images = torch.randn(args.batch, 3, args.image, args.image)
    labels = torch.randint(0, 1000, (args.batch,))
    if device.type == "cuda":
        images, labels = images.pin_memory(), labels.pin_memory()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    loss_fn = nn.CrossEntropyLoss()
    times: list[float] = []

    def one_step(opt) -> None:
        t0 = time.perf_counter()
        x = images.to(device, non_blocking=True)
        y = labels.to(device, non_blocking=True)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step(loss) if args.role == "ps" else opt.step()
        sync()
        times.append(time.perf_counter() - t0)

    if args.role == "local":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(args.steps + args.warmup):
            one_step(opt)
        rank = args.rank
    else:
        import paramserver
        with paramserver.DistributedOptimizer(model) as opt:
            profile = None
            if args.profile and opt.rank == 0:
                import cProfile
                profile = cProfile.Profile()
                profile.enable()
            while not opt.should_stop:
                one_step(opt)
            rank = opt.rank
            if profile is not None:
                import io
                import pstats
                profile.disable()
                text = io.StringIO()
                pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
                (Path(args.times) / "profile-ps-0.txt").write_text(text.getvalue())
    out = Path(args.times) / f"{args.role}-{rank}.json"
    out.write_text(json.dumps({"times": times[args.warmup:], "model": source,
                               "device": str(device)}))


# --- the driver ----------------------------------------------------------------------------------
def worker_args(args, role: str, folder: Path) -> list[str]:
    return [sys.executable, __file__, "--role", role, "--device", args.device,
            "--batch", str(args.batch), "--image", str(args.image), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--times", str(folder), "--timeout", str(args.timeout),
            *(["--profile"] if args.profile else [])]


def run_local(args, folder: Path) -> None:
    procs = [subprocess.Popen(worker_args(args, "local", folder) + ["--rank", str(r)])
             for r in range(args.workers)]
    try:
        for p in procs:
            if p.wait(timeout=args.timeout) != 0:
                raise SystemExit(f"a local worker failed (exit {p.returncode})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run_ps(args, folder: Path) -> None:
    cmd = [sys.executable, "-m", "paramserver", "launch", "--workers", str(args.workers),
           "--sync", "bsp", "--lr", "0.01", "--batch-size", str(args.batch),
           "--steps", str(args.steps + args.warmup), "--heartbeat-timeout", "60",
           "--timeout", str(args.timeout), "--quiet", "--out", str(folder / "run"), "--",
           *worker_args(args, "ps", folder)]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, timeout=args.timeout + 60)
    if proc.returncode != 0:
        for log in sorted((folder / "run" / "logs").glob("*.log")):
            print(f"--- {log.name} (last lines)\n" + "\n".join(
                log.read_text(errors="replace").splitlines()[-25:]), file=sys.stderr)
        raise SystemExit(f"the ps arm failed (launch exit {proc.returncode}); logs above")


def read_times(folder: Path, role: str) -> tuple[list[float], str]:
    docs = [json.loads(p.read_text()) for p in sorted(folder.glob(f"{role}-*.json"))]
    return [t for d in docs for t in d["times"]], docs[0]["model"] if docs else "?"


def ps_records(folder: Path, warmup: int) -> list[dict]:
    lines = (folder / "run" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines)
            if r.get("kind") == "step" and r["step"] >= warmup]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=("driver", "local", "ps"), default="driver",
                   help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--times", help=argparse.SUPPRESS)
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                   help="auto: cuda if available, else cpu (default auto)")
    p.add_argument("--workers", type=int, default=4, help="processes on the device (default 4)")
    p.add_argument("--batch", type=int, help="images per step (default: 32 cuda, 4 cpu)")
    p.add_argument("--image", type=int, help="pixels square (default: 224 cuda, 32 cpu)")
    p.add_argument("--steps", type=int, help="timed steps (default: 30 cuda, 8 cpu)")
    p.add_argument("--warmup", type=int, default=2, help="untimed first steps (default 2)")
    p.add_argument("--repeats", type=int, default=1, help="local/ps pairs, interleaved")
    p.add_argument("--arms", default="local,ps",
                   help="which arms to run (default local,ps; `ps` alone for an A/B of trees)")
    p.add_argument("--profile", action="store_true",
                   help="profile the ps arm's rank 0 (cProfile, by own time) and print it")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds an arm may take; a worker past it prints its stacks and exits")
    args = p.parse_args()
    if args.role != "driver":
        worker(args)
        return
    import torch
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    elif args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here; use --device auto or cpu")
    on_gpu = args.device == "cuda"
    args.batch = args.batch or (32 if on_gpu else 4)
    args.image = args.image or (224 if on_gpu else 32)
    args.steps = args.steps or (30 if on_gpu else 8)
    what = (torch.cuda.get_device_name(0) if on_gpu
            else f"cpu ({os.cpu_count()} cores; no GPU available)")
    print(f"device: {what}; {args.workers} workers, batch {args.batch}, {args.image} px, "
          f"{args.steps} timed steps after {args.warmup}, {args.repeats} repeat(s)")
    local, ps, records, source = [], [], [], "?"
    with tempfile.TemporaryDirectory(prefix="gpu-step-") as tmp:
        for i in range(args.repeats):
            arms = [a for a in ("local", "ps") if a in args.arms.split(",")]
            for role in arms if i % 2 == 0 else arms[::-1]:
                folder = Path(tmp) / f"{role}-{i}"
                folder.mkdir()
                t0 = time.perf_counter()
                (run_local if role == "local" else run_ps)(args, folder)
                print(f"  {role} arm, repeat {i + 1}: {time.perf_counter() - t0:.1f} s",
                      flush=True)
                times, source = read_times(folder, role)
                (local if role == "local" else ps).extend(times)
                if role == "ps":
                    records.extend(ps_records(folder, args.warmup))
                    prof = folder / "profile-ps-0.txt"
                    if prof.exists():
                        print(f"--- cProfile of ps rank 0, repeat {i + 1} (by own time)\n"
                              + "\n".join(prof.read_text().splitlines()[:45]))
    print(f"model: ResNet-18, {RESNET18_PARAMS:,} parameters, {source}")
    med = {arm: statistics.median(times) for arm, times in (("local", local), ("ps", ps))
           if times}
    for arm, times in (("local", local), ("ps", ps)):
        if times:
            print(f"{arm + ' step':<11} {1e3 * med[arm]:9.1f} ms  (median of {len(times)})")
    if len(med) == 2:
        print(f"overhead    {1e3 * (med['ps'] - med['local']):9.1f} ms  "
              f"({med['ps'] / med['local']:.2f}x the local step)")
    for key in ("real_compute_s", "push_s", "wait_s"):
        values = [r[key] for r in records if key in r]
        if values:
            print(f"  ps {key[:-2]:<13} {1e3 * statistics.median(values):9.1f} ms (median)")


if __name__ == "__main__":
    main()
