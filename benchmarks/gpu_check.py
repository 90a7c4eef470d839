"""The GPU acceptance check: every device path end to end, each against the CPU path.

    PYTHONPATH=src .venv/bin/python benchmarks/gpu_check.py            # cuda if there is one

Each row runs one job twice with the same seed and the same steps: the reference on the CPU
path (the model on cpu, no staging) and the device path (on cuda: `--device cuda`; on a
machine without CUDA: the model on cpu staged through separate buffers, PARAMSERVER_STAGE=1,
so the same copies and the same encoding where the gradient lives run and are checked). BSP
with 2 workers (4 in its row), so every round sums the same pushes. Compared: the final
parameters (the run's model.pt), as the distance between the two runs over how far the
reference moved from the initial parameters,

    rel = |theta_device - theta_cpu| / |theta_cpu - theta_0|      (L2 over every parameter)

which must be at most the row's tolerance (for DLRM, whose rows stay on the servers, the
final test loss relative to the reference's, at most 1e-4 on cuda): 0 where both paths compute on the CPU (the staging
must change no bit; 1e-5 for 4 workers, whose rounds sum in arrival order), and on cuda 1e-3
for float32 paths and 2e-2 for bf16/fp16 ones (cuBLAS against the CPU's kernels, and roundings
to 8 or 11 bits that such differences flip now and then). Each row also reports what crossed
from the device per step (d2h) and what went on the wire (push), as a share of the dense
gradient: bf16 encoded on the device must halve both.

Then (unless --no-overhead) benchmarks/gpu_step_overhead.py: ResNet-18, 4 workers sharing the
device, the PS step against a local step (on cuda the overhead must be at most 10%; on the
CPU it is reported, not judged: its images are tiny and its cores shared).

Exit status 0 when every row passes. `--out DIR` keeps the runs and writes results.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 15
WORKERS = 2


@dataclass
class Row:
    name: str
    what: str
    args: list[str] = field(default_factory=list)  # train flags, or the script's arguments
    script: bool = False  # a launched script (paramserver launch) instead of the built-in task
    low_precision: bool = False  # bf16/fp16 somewhere: the looser cuda tolerance
    workers: int = WORKERS
    halves: bool = False  # bf16 on the device: d2h and push must be half the dense gradient
    loss_only: bool = False  # no model.pt (rows on the servers): compare the final test loss


ROWS = [
    Row("train", "built-in task, dense push and pull"),
    Row("script", "launched script, DistributedOptimizer, clip_grad_norm_", ["off"],
        script=True),
    Row("script-amp", "launched script, autocast fp16 + GradScaler, clip_grad_norm_", ["fp16"],
        script=True, low_precision=True),
    Row("script-adamw", "launched script, its own AdamW + OneCycleLR run by the servers",
        ["off", "adamw"], script=True),
    Row("amp-bf16", "--amp bf16", ["--amp", "bf16"], low_precision=True),
    Row("amp-fp16", "--amp fp16 (GradScaler)", ["--amp", "fp16"], low_precision=True),
    Row("bf16", "--compress bf16", ["--compress", "bf16"], low_precision=True, halves=True),
    Row("fp16", "--compress fp16", ["--compress", "fp16"], low_precision=True),
    Row("uniform8", "--compress uniform8", ["--compress", "uniform8"], low_precision=True),
    Row("quantile8", "--compress quantile8 (encoded on the host)", ["--compress", "quantile8"],
        low_precision=True),
    Row("topk", "--compress topk 5%", ["--compress", "topk", "--compress-opt", "fraction=0.05"]),
    Row("topk+bf16", "--compress topk 5%, values bf16",
        ["--compress", "topk", "--compress-opt", "fraction=0.05", "--compress-opt", "codec=bf16"],
        low_precision=True),
    Row("pull-bf16", "--pull-compress bf16", ["--pull-compress", "bf16"], low_precision=True),
    Row("push-range", "--push-range layers", ["--push-range", "layers"]),
    Row("schedule", "--schedule fifo (per-layer requests)", ["--schedule", "fifo"]),
    Row("dlrm", "DLRM: rows of a sparse table", ["--model", "dlrm", "--dataset", "clicks"],
        loss_only=True),
    Row("4-workers", "4 workers sharing the device", [], workers=4),
]

SCRIPT = textwrap.dedent('''
    """A user's script: an MLP on synthetic data, each rank its own batches."""
    import sys

    import torch
    from torch import nn

    import paramserver


    def build():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


    def main(device: str, amp: str, optimizer: str) -> None:
        device = torch.device(device)
        model = build().to(device)
        schedule = None
        if optimizer == "adamw":  # the script's own optimizer and schedule, on the servers
            adamw = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
            schedule = torch.optim.lr_scheduler.OneCycleLR(adamw, max_lr=0.01,
                                                           total_steps=1000)
        gen = torch.Generator().manual_seed(100 + paramserver.rank())
        X = torch.randn(4096, 64, generator=gen)
        y = X[:, :10].argmax(1)
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(amp)
        scaler = torch.amp.GradScaler(device.type, enabled=amp == "fp16")
        wrapped = model if schedule is None else adamw
        named = None if schedule is None else model.named_parameters()
        with paramserver.DistributedOptimizer(wrapped, named_parameters=named) as opt:
            i = 0
            while not opt.should_stop:
                xb = X[i * 32:(i + 1) * 32].to(device)
                yb = y[i * 32:(i + 1) * 32].to(device)
                i += 1
                opt.zero_grad()
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    loss = nn.functional.cross_entropy(model(xb), yb)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                scaler.step(opt)
                scaler.update()
                if schedule is not None:
                    schedule.step()


    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "model")
''')


def has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def job_command(row: Row, run: Path, device: str, script: Path) -> list[str]:
    common = ["--workers", str(row.workers), "--sync", "bsp", "--steps", str(STEPS),
              "--lr", "0.1", "--quiet", "--out", str(run), "--timeout", "150"]
    if row.script:
        return [sys.executable, "-m", "paramserver", "launch", *common, "--batch-size", "32",
                "--", sys.executable, str(script), device, *row.args]
    return [sys.executable, "-m", "paramserver", "train", *common, "--batch-size", "32",
            "--seed", "0", "--device", device, *row.args]


def run_job(row: Row, run: Path, device: str, staged: bool, script: Path) -> dict:
    if run.exists():  # a run folder takes one job: a second's records would be appended
        raise SystemExit(f"{run} exists already: give gpu_check a fresh --out")
    env = dict(os.environ, PARAMSERVER_STAGE="1" if staged else "0")
    t0 = time.perf_counter()
    proc = subprocess.run(job_command(row, run, device, script), env=env, capture_output=True,
                          text=True, timeout=240)
    out = {"rc": proc.returncode, "seconds": round(time.perf_counter() - t0, 1),
           "tail": (proc.stdout + proc.stderr)[-1500:]}
    if proc.returncode == 0:
        out.update(step_figures(run))
    return out


def step_figures(run: Path) -> dict:
    """Medians over the device run's step records: bytes per step and device memory."""
    steps = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
             if r.get("kind") == "step"]

    def med(key):
        values = sorted(r[key] for r in steps if key in r)
        return values[len(values) // 2] if values else None
    mem = [r["device_mem_bytes"] for r in steps if "device_mem_bytes" in r and r["step"] >= 2]
    return {"push_bytes": med("push_bytes"), "d2h_bytes": med("d2h_bytes"),
            "buffer_bytes": med("device_buffer_bytes"),
            "mem_min": min(mem) if mem else None, "mem_max": max(mem) if mem else None,
            "overflows": sum(r.get("amp_overflow", 0) for r in steps), "steps": len(steps)}


def initial_parameters(row: Row, script: Path) -> dict:
    """theta_0: the parameters rank 0 starts the job from (the same seeded build)."""
    import torch
    if row.script:
        sys.path.insert(0, str(script.parent))
        try:
            import importlib
            module = importlib.import_module(script.stem)
            return {k: v.detach().clone() for k, v in module.build().state_dict().items()}
        finally:
            sys.path.pop(0)
    from paramserver.spec.job import TaskSpec
    from paramserver.models.workload import build
    flags = dict(zip(row.args[::2], row.args[1::2]))
    task = TaskSpec(model=flags.get("--model", "mlp"), dataset=flags.get("--dataset", "digits"),
                    seed=0)
    _, model, _ = build(task, "float32")
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if torch.is_floating_point(v)}


def distance(ref_run: Path, dev_run: Path, theta0: dict) -> float:
    import torch
    a = torch.load(ref_run / "model.pt", weights_only=True)
    b = torch.load(dev_run / "model.pt", weights_only=True)
    names = [k for k in theta0 if k in a and k in b]
    if not names:
        raise SystemExit(f"no parameters in common between {ref_run} and {dev_run}")
    diff = math.sqrt(sum(float((b[k].double().cpu() - a[k].double()).pow(2).sum())
                         for k in names))
    moved = math.sqrt(sum(float((a[k].double() - theta0[k].double()).pow(2).sum())
                          for k in names))
    return diff / moved if moved else (0.0 if diff == 0 else math.inf)


def evals(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r.get("kind") == "eval"]


def loss_distance(ref_run: Path, dev_run: Path) -> float:
    """For a model whose rows stay on the servers (DLRM: no model.pt): the final evaluation's
    test loss (dense part and rows together), relative to the reference's."""
    def final(run):
        return next(r["test_loss"] for r in reversed(evals(run)) if r.get("final"))
    ref = final(ref_run)
    return abs(final(dev_run) - ref) / abs(ref)


def tolerance(row: Row, cuda: bool) -> float:
    if cuda and row.loss_only:
        return 1e-4
    if cuda:
        return 2e-2 if row.low_precision else 1e-3
    return 1e-5 if row.workers > 2 else 0.0


def check_row(row: Row, root: Path, cuda: bool, script: Path) -> dict:
    device = "cuda" if cuda else "cpu"
    side = "cuda" if cuda else "staged"  # the device run's folder, beside the reference's
    ref = run_job(row, root / row.name / "cpu", "cpu", False, script)
    dev = run_job(row, root / row.name / side, device, not cuda, script)
    result = {"row": row.name, "what": row.what, "ref": ref, "dev": dev,
              "tolerance": tolerance(row, cuda)}
    problems = [f"{name} run failed (exit {r['rc']}): {r['tail'][-600:]}"
                for name, r in (("cpu", ref), (side, dev)) if r["rc"] != 0]
    if not problems:
        theta0 = initial_parameters(row, script)
        if row.loss_only:
            rel = loss_distance(root / row.name / "cpu", root / row.name / side)
        else:
            rel = distance(root / row.name / "cpu", root / row.name / side, theta0)
        result["rel"] = rel
        if not rel <= result["tolerance"]:
            problems.append(f"parameters differ: rel {rel:.3g} > {result['tolerance']:g}")
        # The dense gradient's bytes (float32, the model's dense parameters): what a step
        # would copy and push with no codec, the unit of the d2h and push shares.
        dense = result["dense_bytes"] = 4 * sum(v.numel() for v in theta0.values())
        if row.halves:
            for key in ("d2h_bytes", "push_bytes"):
                got = dev.get(key)
                if got is None or abs(got / dense - 0.5) > 0.01:
                    problems.append(f"bf16 on the device: {key} {got} is not half of {dense}")
        if dev.get("mem_max") is not None and dev["mem_max"] > 1.1 * dev["mem_min"]:
            problems.append(f"device memory grew over the run: {dev['mem_min']} -> "
                            f"{dev['mem_max']} bytes")
    result["problems"] = problems
    return result


def overhead(cuda: bool) -> dict:
    cmd = [sys.executable, str(HERE / "gpu_step_overhead.py"), "--workers", "4",
           "--device", "cuda" if cuda else "cpu", "--timeout", "240"]
    if not cuda:
        cmd += ["--steps", "3"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400,
                          env=dict(os.environ, PARAMSERVER_STAGE="0" if cuda else "1"))
    text = proc.stdout + proc.stderr
    found = re.search(r"overhead\s+([-\d.]+) ms\s+\(([\d.]+)x", text)
    out = {"rc": proc.returncode, "seconds": round(time.perf_counter() - t0, 1),
           "output": text[-3000:]}
    if found:
        out["overhead_ms"], out["ratio"] = float(found.group(1)), float(found.group(2))
    problems = []
    if proc.returncode != 0 or not found:
        problems.append(f"gpu_step_overhead.py failed (exit {proc.returncode})")
    elif cuda and out["ratio"] > 1.10:
        problems.append(f"PS step overhead {out['ratio']:.2f}x the local step (> 1.10x)")
    out["problems"] = problems
    return out


def mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def print_table(results: list[dict], dense_by_row: dict) -> None:
    print(f"{'row':<11} {'rel':>9} {'tol':>7} {'push':>6} {'d2h':>6} {'buf MB':>7} "
          f"{'mem MB':>13} {'s':>5}  result")
    for r in results:
        dev, ref = r["dev"], r["ref"]
        dense = dense_by_row.get(r["row"])
        push = "-" if not dense or dev.get("push_bytes") is None else \
            f"{dev['push_bytes'] / dense:.2f}"
        d2h = "-" if not dense or dev.get("d2h_bytes") is None else \
            f"{dev['d2h_bytes'] / dense:.2f}"
        mem = "-" if dev.get("mem_min") is None else \
            f"{mb(dev['mem_min'])}-{mb(dev['mem_max'])}"
        rel = f"{r['rel']:.2e}" if "rel" in r else "-"
        verdict = "pass" if not r["problems"] else "FAIL: " + "; ".join(r["problems"])[:300]
        print(f"{r['row']:<11} {rel:>9} {r['tolerance']:>7.0e} {push:>6} {d2h:>6} "
              f"{mb(dev.get('buffer_bytes')):>7} {mem:>13} "
              f"{ref['seconds'] + dev['seconds']:>5.0f}  {verdict}")
    print("rel: |theta_device - theta_cpu| / |theta_cpu - theta_0| (dlrm: the final test loss, "
          "relative); push, d2h: bytes per step "
          "as a share of the dense gradient; buf: the device buffers the wire uses (stated by "
          "the worker); mem: torch's device memory over the steps (cuda)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cuda: the GPU (an error without one); cpu: the staging forced on the "
                        "CPU; auto: cuda if available (default)")
    p.add_argument("--only", help="comma-separated rows (default all): "
                                  + ", ".join(r.name for r in ROWS))
    p.add_argument("--parallel", type=int, default=0,
                   help="rows at once (default: 6 on cuda, 1 on the CPU)")
    p.add_argument("--no-overhead", action="store_true",
                   help="skip the ResNet-18 step overhead")
    p.add_argument("--out", help="keep the runs here and write results.json")
    args = p.parse_args()
    cuda = has_cuda() if args.device == "auto" else args.device == "cuda"
    if cuda and not has_cuda():
        raise SystemExit("--device cuda: CUDA is not available here; use --device auto or cpu")
    rows = ROWS
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {r.name for r in ROWS})
        if unknown:
            raise SystemExit(f"unknown row(s) {', '.join(unknown)}; rows: "
                             f"{', '.join(r.name for r in ROWS)}")
        rows = [r for r in ROWS if r.name in wanted]
    parallel = args.parallel or (6 if cuda else 1)
    if cuda:
        import torch
        where = f"cuda: {torch.cuda.get_device_name(0)}"
    else:
        where = f"cpu, staging forced (no CUDA here; {os.cpu_count()} cores)"
    print(f"gpu_check on {where}; {len(rows)} rows, BSP, {STEPS} steps each, "
          f"{parallel} at a time", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        root = Path(args.out) if args.out else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        script = root / "user_script.py"
        script.write_text(SCRIPT)
        results = []
        with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
            futures = {pool.submit(check_row, r, root, cuda, script): r for r in rows}
            for f in concurrent.futures.as_completed(futures):
                r = f.result()
                results.append(r)
                print(f"  {r['row']}: {'pass' if not r['problems'] else 'FAIL'} "
                      f"({r['ref']['seconds'] + r['dev']['seconds']:.0f} s)", flush=True)
        results.sort(key=lambda r: [x.name for x in ROWS].index(r["row"]))
        dense_by_row = {r["row"]: r["dense_bytes"] for r in results if "dense_bytes" in r}
        print_table(results, dense_by_row)
        failed = [r["row"] for r in results if r["problems"]]
        report = {"device": where, "rows": results}
        if not args.no_overhead:
            print("ResNet-18 step overhead (benchmarks/gpu_step_overhead.py, 4 workers):",
                  flush=True)
            o = overhead(cuda)
            report["overhead"] = o
            print(textwrap.indent(o["output"].strip(), "  "))
            if o["problems"]:
                failed.append("overhead")
                print("  FAIL: " + "; ".join(o["problems"]))
            elif not cuda:
                print("  (on the CPU: reported, not judged)")
        if args.out:
            (root / "results.json").write_text(json.dumps(report, indent=1))
    print("all rows pass" if not failed else f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
