"""What one peer can make a shard server hold: memory and CPU after hostile or careless traffic.

Three scenarios against a live job (coordinator + 1 shard, real processes), each measuring the
server process with psutil:

- frame: one frame of --frame-mb MB (default 1024) pushed at the shard; its RSS before, 3 s
  after, and whether it still answers. Over max_message_bytes ZeroMQ drops the sender before
  the frame is read; below it (--limit-mb above --frame-mb) the frame is read and refused,
  and its memory given back at the next tick.
- flood: --pulls waiting pulls (default 20,000, for a version that never comes) from
  --clients raw clients at once; the seconds and the server's CPU seconds until it has taken
  every pull (kept or refused: its status says), its CPU share over the 5 s after that, and
  the time of one push while the pulls wait.
- churn: --clients clients (default 60) one after another, each a process that maps the
  shard's arena and offers its own, pushes from its shared buffer, pulls, then leaves (every
  --kill-every'th is SIGKILLed instead); the shard's RSS after each 10.
- hotpath: what the exactly-once watermark costs per push (the shard core, the codec, the
  client's bookkeeping), with and without it, interleaved in one process (this tree only).

Run it against two trees for before/after (the script runs the tree on PYTHONPATH):
  PYTHONPATH=/work/main/src .venv/bin/python benchmarks/bounds.py all
  PYTHONPATH=src .venv/bin/python benchmarks/bounds.py all
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import zmq

from paramserver.client.kv import KVWorker
from paramserver.launch.local import LocalCluster
from paramserver.net import rpc
from paramserver.wire import Message

MB = 1 << 20


def job(num_keys: int, **extra) -> dict:
    return {"num_keys": num_keys, "dtype": "float32", "servers": 1, "workers": 1,
            "batch_size": 1, "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 0.1},
            "heartbeat_interval": 0.2, "heartbeat_timeout": 2.0, **extra}


class Job:
    """A coordinator and one shard; `server` is the shard's psutil.Process."""

    def __init__(self, spec: dict):
        self.dir = tempfile.TemporaryDirectory()
        self.cluster = LocalCluster(spec, Path(self.dir.name) / "run", job_timeout=600, keys=None)

    def __enter__(self) -> "Job":
        self.cluster.start(spawn_workers=False)
        self.server = psutil.Process(next(c.proc.pid for c in self.cluster.children
                                          if c.role == "server"))
        return self

    def __exit__(self, *exc) -> None:
        self.cluster.stop()
        self.dir.cleanup()

    def rss_mb(self) -> float:
        return self.server.memory_info().rss / MB

    def cpu_s(self) -> float:
        t = self.server.cpu_times()
        return t.user + t.system


def raw_dealer(ctx: zmq.Context, addr: str, hwm: int = 0) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(addr)
    return sock


def status(kv: KVWorker, timeout: float = 600.0) -> dict:
    kv.requests.timeout = timeout
    rid = kv.requests.send(0, Message("status"))
    return kv.requests.collect([(0, rid, None)], "status")[rid]["state"]


# ---- frame ---------------------------------------------------------------------------------------
def frame(args) -> None:
    extra = {"max_message_bytes": args.limit_mb * MB} if args.limit_mb else {}
    with Job(job(1024, **extra)) as j:
        kv = KVWorker(j.cluster.address, shared_memory=False)
        kv.init(np.zeros(1024, np.float32))
        time.sleep(1.0)
        before = j.rss_mb()
        ctx = zmq.Context()
        sock = raw_dealer(ctx, kv.shards[0].addr)
        big = np.zeros(args.frame_mb * MB // 4, np.float32)  # zero pages: cheap to send
        rpc.send(sock, Message("push", {"range": [0, 1024], "step": 0, "version": 0,
                                        "batch": 1}, [big], rid=1, src="big"))
        t0 = time.monotonic()
        peak = before
        while time.monotonic() - t0 < 3.0:
            peak = max(peak, j.rss_mb())
            time.sleep(0.05)
        after = j.rss_mb()
        answered = status(kv, 30.0)["version"] >= 0
        print(f"frame {args.frame_mb} MB, limit {args.limit_mb or 'default'} MB: server RSS "
              f"{before:.0f} MB before, peak {peak:.0f} MB, {after:.0f} MB 3 s after; "
              f"still answers: {answered}")
        sock.close()
        ctx.term()
        kv.close()


# ---- flood ---------------------------------------------------------------------------------------
def flood(args) -> None:
    keys = 1024
    with Job(job(keys)) as j:
        kv = KVWorker(j.cluster.address, shared_memory=False)
        kv.init(np.zeros(keys, np.float32))
        ctx = zmq.Context()
        socks = [raw_dealer(ctx, kv.shards[0].addr) for _ in range(args.clients)]
        time.sleep(0.5)
        cpu0, t0 = j.cpu_s(), time.monotonic()
        for i in range(args.pulls):
            rpc.send(socks[i % len(socks)],
                     Message("pull", {"range": [0, keys], "min_version": 10 ** 9},
                             rid=i + 1, src=f"flood{i % len(socks)}"))
        sent = time.monotonic() - t0
        while True:  # until the shard has taken every pull (kept or refused)
            state = status(kv)
            taken = state["pending_pulls"] + state.get("refused_pulls", 0)
            caught_up = time.monotonic() - t0
            if taken >= args.pulls or caught_up > args.wait:
                break
            time.sleep(0.2)
        cpu1 = j.cpu_s()
        time.sleep(5.0)
        after = (j.cpu_s() - cpu1) / 5.0
        kv.start()
        push = []
        for step in range(20):
            p0 = time.perf_counter()
            kv.push(np.ones(keys, np.float32), step=step, batch=1)
            push.append(time.perf_counter() - p0)
        print(f"flood of {args.pulls} pulls from {args.clients} client(s) (sent in "
              f"{sent:.1f} s): all taken after {caught_up:.1f} s"
              f"{'' if taken >= args.pulls else f' (gave up: {taken} taken)'} using "
              f"{cpu1 - cpu0:.1f} CPU s; {state['pending_pulls']} waiting, "
              f"{state.get('refused_pulls', 'n/a')} refused; CPU over the next 5 s "
              f"{100 * after:.0f}%; a push then takes {1000 * np.median(push):.2f} ms "
              f"(median of 20)")
        for s in socks:
            s.close()
        ctx.term()
        kv.close()


# ---- churn ---------------------------------------------------------------------------------------
def _client(addr: str, keys: int, hold: float) -> None:
    kv = KVWorker(addr, role="observer", heartbeat=False)
    grad = kv.shared_buffer()
    grad[:] = 1.0
    for step in range(5):  # the first may go before the arenas' handshake is done
        kv.push(grad, step=step, batch=1)
        kv.pull()
        time.sleep(0.05)
    time.sleep(hold)
    kv.close()


def arenas(proc: psutil.Process) -> tuple[int, float]:
    """(arenas mapped, MB of them resident) in `proc`, its own arena among them."""
    inodes, rss = set(), 0
    with open(f"/proc/{proc.pid}/smaps") as f:
        mapped = False
        for line in f:
            if "-" in line.split()[0] and len(line.split()) >= 5 and ":" in line.split()[3]:
                mapped = "paramserver-arena" in line
                if mapped:
                    inodes.add(line.split()[4])
            elif mapped and line.startswith("Rss:"):
                rss += int(line.split()[1])
    return len(inodes), rss / 1024


def churn(args) -> None:
    keys = args.keys
    ctx = mp.get_context("spawn")
    with Job(job(keys)) as j:
        kv = KVWorker(j.cluster.address, shared_memory=False)
        kv.init(np.zeros(keys, np.float32))
        time.sleep(1.0)
        n, shared = arenas(j.server)
        print(f"churn: {args.clients} clients of {keys * 4 / MB:.1f} MB arenas; server RSS "
              f"{j.rss_mb():.0f} MB at the start, {n} arena(s) mapped ({shared:.1f} MB "
              f"resident)")
        for i in range(args.clients):
            kill = args.kill_every and (i + 1) % args.kill_every == 0
            p = ctx.Process(target=_client, args=(j.cluster.address, keys, 30.0 if kill else 0))
            p.start()
            if kill:
                time.sleep(3.0)  # registered, pushed, pulled, then dies holding everything
                os.kill(p.pid, signal.SIGKILL)
            p.join(120)
            if (i + 1) % 10 == 0:
                time.sleep(1.0)  # a tick or two for the shard to tidy
                n, shared = arenas(j.server)
                print(f"  after {i + 1:3d} clients: server RSS {j.rss_mb():.0f} MB, {n} "
                      f"arena(s) mapped ({shared:.1f} MB resident)")
        kv.close()


# ---- hotpath -------------------------------------------------------------------------------------
def hotpath(args) -> None:
    """The watermark's cost per push, piece by piece, with and without it in one process."""
    import statistics
    from paramserver.client.core.worker_core import WorkerCore
    from paramserver.core.keyspace import KeyRange
    from paramserver.server.core import ShardCore
    from paramserver.server.events import Init, Push, ShardSettings
    from paramserver.wire import decode, encode
    n, g = 16, np.ones(16, np.float32)

    def core():
        c = ShardCore(ShardSettings(rank=0, lo=0, hi=n, dtype="float32",
                                    apply_mode="arrival", optimizer="sgd", lr=0.1))
        c.handle(Init("i", 0, n, np.zeros(n, np.float32)))
        return c

    def pushes(c, marked):
        rid = [0]

        def run(k):
            for _ in range(k):
                rid[0] += 1
                r = rid[0]
                c.handle(Push(("p", r), "w", r, 0, n, g, 0, 1, 0, 1.0, 0, 0,
                              r if marked else None))
        return run

    def codec(wm):
        f = {"range": [0, n], "step": 0, "version": 0, "batch": 1, "scale": 1.0}
        m = Message("push", dict(f, wm=5) if wm else f, [g], rid=5, src="w-1234-abcdef")

        def run(k):
            for _ in range(k):
                decode(encode(m))
        return run

    wc = WorkerCore()
    wc.welcome(0, [KeyRange(0, n)], n)

    def client(marked):
        def run(k):
            for _ in range(k):
                if marked:
                    wc.unacked(0)
                rid = wc.request(0, None, marked)
                if marked:
                    wc.watermark(0)
                wc.reply(rid, 1)
                wc.take([rid])
        return run

    def per_call(fn, reps=20000):
        times = []
        for _ in range(9):
            t0 = time.perf_counter()
            fn(reps)
            times.append((time.perf_counter() - t0) / reps)
        return statistics.median(times) * 1e6

    for name, a, b in (("shard core handle(Push)", pushes(core(), False), pushes(core(), True)),
                       ("encode+decode of a push", codec(False), codec(True)),
                       ("client bookkeeping", client(False), client(True))):
        x, y = [], []
        for _ in range(3):  # interleaved
            x.append(per_call(a))
            y.append(per_call(b))
        print(f"{name}: {statistics.median(x):.2f} us without the watermark, "
              f"{statistics.median(y):.2f} us with")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario", choices=("frame", "flood", "churn", "hotpath", "all"))
    ap.add_argument("--frame-mb", type=int, default=1024)
    ap.add_argument("--limit-mb", type=int, default=0, help="max_message_bytes (0: derived)")
    ap.add_argument("--pulls", type=int, default=20000)
    ap.add_argument("--clients", type=int, default=0,
                    help="flood: raw clients (default 1); churn: clients (default 60)")
    ap.add_argument("--wait", type=float, default=300.0,
                    help="flood: seconds to wait for the shard to take every pull")
    ap.add_argument("--keys", type=int, default=1 << 19, help="churn: float32 keys")
    ap.add_argument("--kill-every", type=int, default=5, help="churn: every n-th is killed")
    args = ap.parse_args()
    print(f"tree: {Path(sys.modules['paramserver'].__file__).parent}")
    for name in (("frame", "flood", "churn") if args.scenario == "all" else (args.scenario,)):
        a = argparse.Namespace(**vars(args))
        a.clients = args.clients or (60 if name == "churn" else 1)
        {"frame": frame, "flood": flood, "churn": churn, "hotpath": hotpath}[name](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
