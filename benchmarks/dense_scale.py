"""Push+pull of a large dense model through S shards: time, GB/s beside memcpy and raw TCP, and
the peak memory of every process against the parameters (+ optimizer state).

One worker process pushes a gradient of every key (from KVWorker.shared_buffer) and pulls every
key back (into its own array) through `--servers` shards (ASP: each chunk applied with SGD as
it arrives), `--repeats` times after a warm-up; the figure is the median. Beside it, in the
same run:
  memcpy     numpy copy of the same bytes, twice (push + pull), in blocks of at most 256 MB
  raw TCP    loopback socket: the same bytes sent and echoed back in 16 MB messages
  chunk ...  the stack with each chunk size of --chunk-mb (`off`: one message per shard)
  tcp        (--tcp) the stack with shared memory off: every byte through the sockets
Memory: a sampler reads every process's /proc status every 20 ms; peak private (RssAnon) and
shared (RssShmem: arenas, counted in each process that touches them: a shard reads its piece
of the worker's gradient in place, the worker the shards' values) are reported apart, with
Pss (shared pages split among their users: the processes' Pss add up to the machine's use)
and VmHWM (the kernel's peak of anon + shmem).

Usage: python benchmarks/dense_scale.py [--sizes 1e7,1e8] [--servers 4] [--chunk-mb 4,16,64,off]
       [--in-flight 1,2,4] [--repeats 3] [--tcp] [--optimizer sgd]
       python benchmarks/dense_scale.py --train --model wide --model-size 1e9 --workers 1 \
       --servers 4 --steps 2 --eval-interval 0       (peak memory of a training job's processes)
Rows are labelled chunk MB/in flight (chunks unanswered per shard).
A size of 1e9 needs ~14 GB free (the worker's gradient and output, 4 GB each; the shards'
values, 4 GB; spares): the script refuses a size it cannot fit in free memory.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from paramserver.client.kv import KVWorker
from paramserver.core.units import parse_count
from paramserver.launch.local import LocalCluster
from paramserver.wire import Message

CTX = mp.get_context("spawn")
BLOCK = 256 << 20
TCP_MESSAGE = 16 << 20


def bench_memcpy(nbytes: int, repeats: int) -> float:
    """Seconds to copy `nbytes` there and back, as blocks of at most BLOCK (medians)."""
    block = min(nbytes, BLOCK)
    src, dst = np.ones(block, np.uint8), np.empty(block, np.uint8)
    samples = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        np.copyto(src, dst)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples[1:]) * nbytes / block


def _echo(port_q) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = bytearray(TCP_MESSAGE)
    view = memoryview(buf)
    while True:
        got = 0
        while got < TCP_MESSAGE:
            n = conn.recv_into(view[got:], TCP_MESSAGE - got)
            if n == 0:
                return
            got += n
        conn.sendall(view)


def bench_tcp(nbytes: int, repeats: int) -> float:
    """Seconds to send `nbytes` over loopback TCP and receive them back, 16 MB at a time."""
    q = CTX.Queue()
    proc = CTX.Process(target=_echo, args=(q,), daemon=True)
    proc.start()
    cli = socket.create_connection(("127.0.0.1", q.get(timeout=30)))
    payload, back = np.ones(TCP_MESSAGE, np.uint8), bytearray(TCP_MESSAGE)
    view = memoryview(back)
    rounds = max(1, min(nbytes // TCP_MESSAGE, 64))  # measured on up to 1 GB, scaled
    try:
        samples = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            for _ in range(rounds):
                cli.sendall(payload)
                got = 0
                while got < TCP_MESSAGE:
                    got += cli.recv_into(view[got:], TCP_MESSAGE - got)
            samples.append((time.perf_counter() - t0) / (rounds * TCP_MESSAGE))
        return statistics.median(samples[1:]) * nbytes
    finally:
        cli.close()
        proc.join(5)
        proc.kill()


class MemorySampler:
    """Peak RssAnon and RssShmem of each pid (and its VmHWM), sampled every `interval` s."""

    def __init__(self, pids: dict[str, int], interval: float = 0.02):
        self.pids, self.interval = pids, interval
        self.peak = {name: {"anon": 0, "shmem": 0, "hwm": 0, "pss": 0} for name in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def read(pid: int) -> dict:
        out = {}
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key in ("RssAnon", "RssShmem", "VmHWM"):
                        out[key] = int(rest.split()[0]) * 1024
            # Pss: shared pages split among the processes mapping them (sums to the total).
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        out["Pss"] = int(line.split()[1]) * 1024
        except OSError:
            pass
        return out

    def sample(self) -> None:
        for name, pid in self.pids.items():
            s, p = self.read(pid), self.peak[name]
            p["anon"] = max(p["anon"], s.get("RssAnon", 0))
            p["shmem"] = max(p["shmem"], s.get("RssShmem", 0))
            p["hwm"] = max(p["hwm"], s.get("VmHWM", 0))
            p["pss"] = max(p["pss"], s.get("Pss", 0))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self.sample()


def _worker(addr: str, repeats: int, shared: bool, ready, go, out_q) -> None:
    kv = KVWorker(addr, shared_memory=shared)
    grad = kv.shared_buffer()  # in shared memory: shards on this host read pushes in place
    kv.init(grad)  # zeros
    out = np.empty(kv.num_keys, kv.dtype)
    grad[:] = 1e-6
    ready.set()
    go.wait(60)
    times, most = [], 0

    def once():
        t0 = time.perf_counter()
        h = kv.push_async(grad, step=0, batch=1)
        kv.wait(h)
        p = kv.pull_async(out=out)
        kv.wait(p)
        return time.perf_counter() - t0, max(
            h.stream.most_in_flight if h.stream else len(h.parts),
            p.stream.most_in_flight if p.stream else len(p.parts))

    once()  # warm-up: connections, first page faults
    for _ in range(repeats):
        t, m = once()
        times.append(t)
        most = max(most, m)
    states = []
    for shard in range(len(kv.shards)):
        rid = kv.requests.send(shard, Message("status", {}))
        states.append(kv.requests.collect([(shard, rid, None)], "status")[rid]["state"])
    out_q.put({"times": times, "in_flight": most, "retries": kv.requests.retries,
               "copies_on_write": sum(s["copies_on_write"] for s in states)})
    kv.close()


def cluster_state(cluster: LocalCluster) -> str:
    return ", ".join(f"{c.name} {'up' if c.proc.poll() is None else f'exit {c.proc.returncode}'}"
                     for c in cluster.children)


def bench_stack(num_keys: int, servers: int, chunk_bytes: int, in_flight: int, repeats: int,
                shared: bool, optimizer: str) -> dict:
    job = {"num_keys": num_keys, "dtype": "float32", "servers": servers, "workers": 1,
           "batch_size": 1, "sync": {"name": "asp"}, "optimizer": {"name": optimizer, "lr": 1e-3},
           "heartbeat_timeout": 60.0, "chunk_bytes": chunk_bytes, "chunks_in_flight": in_flight,
           "retry_interval": 600.0}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(job, Path(tmp), keys=None,
                               env=None if shared else {"PARAMSERVER_SHM": "0"})
        try:
            cluster.start(spawn_workers=False)
            ready, go, q = CTX.Event(), CTX.Event(), CTX.Queue()
            proc = CTX.Process(target=_worker,
                               args=(cluster.address, repeats, shared, ready, go, q))
            proc.start()
            pids = {c.name: c.proc.pid for c in cluster.children}
            pids["worker"] = proc.pid
            if not ready.wait(600):
                raise RuntimeError("the worker did not get ready in 600 s")
            with MemorySampler(pids) as mem:
                go.set()
                result = None
                while result is None:  # (a worker that died sends nothing: do not wait on)
                    try:
                        result = q.get(timeout=1.0)
                    except queue.Empty:
                        if not proc.is_alive():
                            raise RuntimeError(f"the worker exited with {proc.exitcode}; "
                                               f"servers: {cluster_state(cluster)}") from None
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            result["memory"] = mem.peak
            return result
        finally:
            cluster.stop()


def role_of(proc: psutil.Process) -> str:
    """'server 2', 'worker 0', ... from a job process's log file name, else its command."""
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return "?"
    if "paramserver" in cmd:
        role = cmd[cmd.index("paramserver") + 1] if cmd.index("paramserver") + 1 < len(cmd) \
            else "?"
        return f"{role} {proc.pid}"
    return f"launcher {proc.pid}"


def train_memory(train_args: list[str], params: int, state_per_param: int) -> int:
    """Run `paramserver train ARGS` and report the peak memory of each of its processes."""
    import subprocess
    cmd = [sys.executable, "-m", "paramserver", "train", *train_args]
    t0 = time.perf_counter()
    top = subprocess.Popen(cmd)
    peaks: dict[str, dict] = {}
    roles: dict[int, str] = {}  # named at first sight: an exited process has no command line
    try:
        while top.poll() is None:
            try:
                procs = [psutil.Process(top.pid), *psutil.Process(top.pid).children(True)]
            except psutil.Error:
                break
            for proc in procs:
                s = MemorySampler.read(proc.pid)
                if not s:
                    continue
                role = roles.setdefault(proc.pid, role_of(proc))
                p = peaks.setdefault(role, {"anon": 0, "shmem": 0, "pss": 0, "hwm": 0})
                p["anon"] = max(p["anon"], s.get("RssAnon", 0))
                p["shmem"] = max(p["shmem"], s.get("RssShmem", 0))
                p["pss"] = max(p["pss"], s.get("Pss", 0))
                p["hwm"] = max(p["hwm"], s.get("VmHWM", 0))
            time.sleep(0.2)
    finally:
        if top.poll() is None:
            top.kill()
        top.wait(60)
    nbytes = params * 4
    print(f"\ntrain {' '.join(train_args)}: exit {top.returncode} in "
          f"{time.perf_counter() - t0:.0f} s; params {gb(nbytes)} GB, server state "
          f"{state_per_param} x params")
    total = 0
    for name, m in sorted(peaks.items()):
        total += m["pss"]
        print(f"  {name:<20} anon {gb(m['anon']):>6} GB  shmem {gb(m['shmem']):>6} GB  "
              f"pss {gb(m['pss']):>6} GB  hwm {gb(m['hwm']):>6} GB  "
              f"pss x{m['pss'] / nbytes:5.2f} params")
    print(f"  sum of peak Pss {gb(total)} GB = x{total / nbytes:.2f} params "
          f"(each process's peak; they need not coincide)")
    return top.returncode


def gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1e7,1e8", help="parameter counts, e.g. 1e7,1e8,1e9")
    p.add_argument("--servers", type=int, default=4)
    p.add_argument("--chunk-mb", default="16,off",
                   help="chunk sizes to compare in MB (off: one message per shard)")
    p.add_argument("--in-flight", default="2", help="chunks unanswered per shard, e.g. 1,2,4")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tcp", action="store_true", help="also with shared memory off")
    p.add_argument("--tcp-chunk-mb", help="chunk sizes for the --tcp runs (default: --chunk-mb)")
    p.add_argument("--optimizer", default="sgd", help="server update rule (state counted)")
    p.add_argument("--train", nargs=argparse.REMAINDER,
                   help="instead: run `paramserver train` with the arguments that follow "
                        "(give --model-size) and report each process's peak memory")
    args = p.parse_args()
    state_per_param = {"sgd": 0, "momentum": 1, "adagrad-global": 1}.get(args.optimizer, 1)
    if args.train:
        size = parse_count(args.train[args.train.index("--model-size") + 1])
        return train_memory(args.train, size, state_per_param)
    for size in [parse_count(s) for s in args.sizes.split(",")]:
        nbytes = size * 4
        need = 3.5 * nbytes + (1 << 30)
        free = psutil.virtual_memory().available
        if need > free:
            print(f"{size:.0e}: skipped, needs ~{gb(need)} GB, {gb(free)} GB free", flush=True)
            continue
        t_mem, t_tcp = bench_memcpy(nbytes, args.repeats), bench_tcp(nbytes, args.repeats)
        print(f"\n{size:.0e} parameters ({gb(nbytes)} GB), {args.servers} shards, "
              f"optimizer {args.optimizer}; push+pull moves {gb(2 * nbytes)} GB")
        print(f"  memcpy x2   {t_mem:8.3f} s  {2 * nbytes / t_mem / 1e9:6.2f} GB/s")
        print(f"  raw TCP     {t_tcp:8.3f} s  {2 * nbytes / t_tcp / 1e9:6.2f} GB/s", flush=True)
        runs = [(c, k, True) for c in args.chunk_mb.split(",") for k in args.in_flight.split(",")]
        if args.tcp:
            runs += [(c, k, False) for c in (args.tcp_chunk_mb or args.chunk_mb).split(",")
                     for k in args.in_flight.split(",")]
        for chunk, k, shared in runs:
            chunk_bytes = 1 << 40 if chunk == "off" else int(float(chunk) * (1 << 20))
            if chunk == "off" and nbytes // args.servers >= 1 << 31:
                print(f"  chunk {chunk:>4}: skipped (a shard's piece above 2 GB in one message)")
                continue
            r = bench_stack(size, args.servers, chunk_bytes, int(k), args.repeats, shared,
                            args.optimizer)
            t = statistics.median(r["times"])
            label = f"chunk {chunk}/{k}{'' if shared else ' tcp'}"
            print(f"  {label:<14} {t:8.3f} s  {2 * nbytes / t / 1e9:6.2f} GB/s  "
                  f"x{t / t_mem:5.2f} memcpy  x{t / t_tcp:5.2f} TCP  "
                  f"in flight <= {r['in_flight']}  copies on write {r['copies_on_write']}",
                  flush=True)
            shard_bytes = nbytes / args.servers * (1 + state_per_param)
            for name, m in sorted(r["memory"].items()):
                base = nbytes if name == "worker" else shard_bytes if name.startswith(
                    "server") else 1
                ratio = f"pss x{m['pss'] / base:5.2f} of " + (
                    "params" if name == "worker" else "shard+state") if base > 1 else ""
                print(f"      {name:<12} anon {gb(m['anon']):>6} GB  shmem {gb(m['shmem']):>6} GB"
                      f"  pss {gb(m['pss']):>6} GB  hwm {gb(m['hwm']):>6} GB  {ratio}")
    print("\nmedians of --repeats push+pull round trips of every key (after a warm-up); anon: "
          "private memory, shmem: shared arenas (the worker's gradient, the shards' values the "
          "worker reads in place), counted in every process that touches them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
