"""Push+pull throughput of the whole stack against message size, beside raw baselines.

Measured side by side in one run (this machine is shared and noisy, so compare ratios):
  memcpy      numpy copy of the payload, twice (the floor of any push+pull)
  socket      raw TCP loopback: send N bytes, receive N bytes back into a reused buffer
  zmq         bare ZeroMQ DEALER/ROUTER, zero-copy frames, echo of N bytes
  stack       paramserver: KVWorker push (SGD applied on the server) then pull, 1 shard; on one
              host the gradient (KVWorker.shared_buffer) and the shard's values are read in
              place through shared memory (transport.shm), ZeroMQ carries the messages
  stack tcp   the same with shared memory off (PARAMSERVER_SHM=0): every byte through TCP
  stack x4    `stack` with 4 worker processes at once (time per worker step)
  sock 1way   raw TCP: N bytes one way, an 8-byte ack back
  push        paramserver push alone (the server applies SGD before acking); push tcp: no shm

Usage: python benchmarks/pushpull.py [--quick] [--repeats 5]
       python benchmarks/pushpull.py --tcp-vs-zmq [--bytes 3730000] [--rounds 7]
                                     [--tcp-chunks off,0.5:4,1:2] [--zmq-pieces 2:2,4:2]
         (stack tcp beside bare zmq, and beside bare zmq doing a push+pull's work, taking
          turns in one run: medians and their ratios; --tcp-chunks adds stack tcp variants
          with other TCP chunk sizes and numbers in flight, --zmq-pieces zmq p+p variants
          with the push and pull cut into pieces)
       python benchmarks/pushpull.py --tcp-vs-socket [--big-sizes 64M,400M,4G] [--rounds 3]
         (big models over TCP only: stack tcp beside the raw socket echo at each size, taking
          turns: the stack's throughput as a share of raw loopback TCP's; 4G needs ~17 GB free)
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

from paramserver.launch.local import LocalCluster
from paramserver.client.kv import KVWorker
from paramserver.transport import keep_freed_memory

SIZES = [4 << 10, 64 << 10, 1 << 20, 3_730_000, 16 << 20, 64 << 20]
CTX = mp.get_context("spawn")


def iterations(nbytes: int) -> int:
    return int(min(500, max(5, 200e6 / nbytes / 4)))


def timed(fn, n: int, repeats: int) -> float:
    """Median seconds per call over `repeats` batches of `n` calls."""
    fn()  # warm-up: connections, page faults
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def bench_memcpy(nbytes: int, repeats: int) -> float:
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)

    def step():
        np.copyto(dst, src)
        np.copyto(src, dst)
    return timed(step, iterations(nbytes), repeats)


def _socket_echo(port_q, nbytes_max):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    buf = bytearray(nbytes_max)
    while True:
        head = conn.recv(8, socket.MSG_WAITALL)
        if len(head) < 8:
            return
        n = int.from_bytes(head, "little")
        one_way, n = n >> 62, n & ((1 << 62) - 1)
        view, got = memoryview(buf)[:n], 0
        while got < n:
            got += conn.recv_into(view[got:], n - got)
        conn.sendall(b"ackackac" if one_way else view)


def bench_socket(nbytes: int, repeats: int, one_way: bool = False) -> float:
    q = CTX.Queue()
    proc = CTX.Process(target=_socket_echo, args=(q, nbytes), daemon=True)
    proc.start()
    cli = socket.create_connection(("127.0.0.1", q.get(timeout=30)))
    cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload, back = np.ones(nbytes, np.uint8), bytearray(nbytes)

    want = 8 if one_way else nbytes

    def step():
        cli.sendall((nbytes | (int(one_way) << 62)).to_bytes(8, "little"))
        cli.sendall(payload)
        view, got = memoryview(back), 0
        while got < want:
            got += cli.recv_into(view[got:], want - got)
    try:
        return timed(step, iterations(nbytes), repeats)
    finally:
        cli.close()
        proc.join(5)
        proc.kill()


@contextlib.contextmanager
def zmq_peer(target, *args):
    """A DEALER connected to `target(addr_q, *args)` run in a process of its own; the peer is
    told to stop (an empty frame), joined and reaped on the way out."""
    q = CTX.Queue()
    proc = CTX.Process(target=target, args=(q, *args), daemon=True)
    proc.start()
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{q.get(timeout=30)}")
    try:
        yield dealer
    finally:
        dealer.send(b"")
        proc.join(5)
        proc.kill()
        dealer.close(0)
        ctx.term()


def _zmq_echo(addr_q, keep_memory=False):
    if keep_memory:
        keep_freed_memory()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    addr_q.put(port)
    while True:
        frames = router.recv_multipart(copy=False)
        if len(frames[1]) == 0:
            return
        router.send_multipart(frames, copy=False)


def bench_zmq(nbytes: int, repeats: int, keep_memory: bool = False) -> float:
    """Echo of N bytes; with `keep_memory` the echo process keeps freed memory as paramserver's
    processes do (call keep_freed_memory in this one too, before its first context)."""
    with zmq_peer(_zmq_echo, keep_memory) as dealer:
        payload = np.ones(nbytes, np.uint8)

        def step():
            dealer.send(payload, copy=False)
            dealer.recv(copy=False)
        return timed(step, iterations(nbytes), repeats)


def _zmq_pushpull_server(addr_q, keep_memory):
    """The work of a push+pull with nothing around it: add the pushed float32s into the values
    and ack; answer a 1-byte request with the values, zero-copy."""
    if keep_memory:
        keep_freed_memory()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    addr_q.put(router.bind_to_random_port("tcp://127.0.0.1"))
    values = None
    while True:
        ident, body = router.recv_multipart(copy=False)
        if len(body) == 0:
            return
        if len(body) > 1:
            grad = np.frombuffer(body.buffer, np.float32)
            values = np.zeros_like(grad) if values is None else values
            values += grad
            router.send_multipart([ident, b"ack"])
        else:
            router.send_multipart([ident, values], copy=False)


def bench_zmq_pushpull(nbytes: int, repeats: int, keep_memory: bool = False) -> float:
    """Bare ZeroMQ doing what a stack push+pull does: the push and its ack, the pull request
    and its reply, the server's add, the copy of the reply into the caller's array."""
    with zmq_peer(_zmq_pushpull_server, keep_memory) as dealer:
        grad, out = np.full(nbytes // 4, 1e-6, np.float32), np.empty(nbytes // 4, np.float32)

        def step():
            dealer.send(grad, copy=False)
            dealer.recv(copy=False)
            dealer.send(b"p")
            np.copyto(out, np.frombuffer(dealer.recv(copy=False).buffer, np.float32))
        return timed(step, iterations(nbytes), repeats)


def _zmq_pieces_server(addr_q, keep_memory):
    """bench_zmq_pushpull's server for pieces: a push is [lo, hi as int64, values], added into
    values[lo:hi] and acked; a pull is [lo, hi], answered with values[lo:hi], zero-copy."""
    if keep_memory:
        keep_freed_memory()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    addr_q.put(router.bind_to_random_port("tcp://127.0.0.1"))
    values = None
    while True:
        ident, head, *body = router.recv_multipart(copy=False)
        if len(head) == 0:
            return
        lo, hi, size = np.frombuffer(head.buffer, np.int64).tolist()
        values = np.zeros(size, np.float32) if values is None else values
        if body:
            values[lo:hi] += np.frombuffer(body[0].buffer, np.float32)
            router.send_multipart([ident, b"ack"])
        else:
            router.send_multipart([ident, values[lo:hi]], copy=False)


def bench_zmq_pieces(nbytes: int, repeats: int, pieces: int, window: int) -> float:
    """bench_zmq_pushpull with the push and the pull each cut into `pieces` messages, `window`
    unanswered at a time (the server adds piece k while k+1 is on the wire; the client copies
    pulled piece k while k+1 arrives): what chunking can win with nothing around it."""
    with zmq_peer(_zmq_pieces_server, True) as dealer:
        n = nbytes // 4
        grad, out = np.full(n, 1e-6, np.float32), np.empty(n, np.float32)
        cuts = np.linspace(0, n, pieces + 1).astype(np.int64)
        heads = [np.array([cuts[k], cuts[k + 1], n], np.int64).tobytes() for k in range(pieces)]

        def phase(push: bool) -> None:
            sent = got = 0
            while got < pieces:
                while sent - got < window and sent < pieces:
                    lo, hi = cuts[sent], cuts[sent + 1]
                    dealer.send_multipart([heads[sent], grad[lo:hi]] if push else [heads[sent]],
                                          copy=False)
                    sent += 1
                reply = dealer.recv(copy=False)  # one server: replies come in order
                if not push:
                    np.copyto(out[cuts[got]:cuts[got + 1]], np.frombuffer(reply.buffer, np.float32))
                got += 1

        def step():
            phase(True)
            phase(False)
        return timed(step, iterations(nbytes), repeats)


def _stack_worker(addr, nbytes, repeats, out_q, push_only, shared):
    kv = KVWorker(addr, shared_memory=shared)
    grad = kv.shared_buffer()  # shared memory with a server on this host, else a plain array
    grad[:] = 1e-6
    out = np.empty(kv.num_keys, np.float32)
    kv.pull(out=out)

    def step():
        kv.push(grad, step=0, batch=1)
        if not push_only:
            kv.pull(out=out)
    out_q.put(timed(step, iterations(nbytes), repeats))
    kv.close()


def bench_stack(nbytes: int, repeats: int, workers: int, push_only: bool = False,
                shared: bool = True, limits: dict | None = None) -> float:
    """`limits`: job limits to set (e.g. tcp_chunk_bytes), the job's defaults otherwise."""
    num_keys = nbytes // 4
    job = {"num_keys": num_keys, "dtype": "float32", "servers": 1, "workers": workers,
           "batch_size": 1, "sync": {"name": "asp"}, "optimizer": {"name": "sgd", "lr": 1.0},
           "heartbeat_timeout": 60.0, **(limits or {})}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(job, Path(tmp), keys=None,  # plaintext; CURVE: curve_overhead.py
                               env=None if shared else {"PARAMSERVER_SHM": "0"})
        try:
            cluster.start(spawn_workers=False)
            init = KVWorker(cluster.address, role="observer",  # not one of the job's workers
                            shared_memory=shared)
            init.init(np.zeros(num_keys, np.float32))
            q = CTX.Queue()
            procs = [CTX.Process(target=_stack_worker, args=(cluster.address, nbytes, repeats, q,
                                                                push_only, shared))
                     for _ in range(workers)]
            for p in procs:
                p.start()
            per_step = [q.get(timeout=600) for _ in procs]
            for p in procs:
                p.join(30)
            init.close()
            return statistics.median(per_step)
        finally:
            cluster.stop()


def fmt(nbytes: int) -> str:
    if nbytes >= 1e9:
        return f"{nbytes / 1e9:.2f} GB"
    return f"{nbytes / 1e6:.2f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:.0f} KB"


def _chunking(text: str) -> dict:
    """'MB[:in_flight]' as job limits for a worker on TCP: pieces above MB go in MB chunks
    (chunk_bytes and tcp_chunk_bytes both MB), in_flight unanswered; 'off': one message per
    shard."""
    size, _, window = text.partition(":")
    nbytes = 1 << 40 if size == "off" else int(float(size) * (1 << 20))
    limits = {"chunk_bytes": nbytes, "tcp_chunk_bytes": nbytes}
    if window:
        limits["tcp_chunks_in_flight"] = int(window)
    return limits


def tcp_vs_zmq(nbytes: int, rounds: int, repeats: int, chunkings: list[str],
               zmq_pieces: list[str] = ()) -> None:
    """`stack tcp` against bare `zmq` (the echo), and against bare ZeroMQ doing a push+pull's
    work (`zmq p+p`: bench_zmq_pushpull), all taking turns `rounds` times: the ratios of
    their medians are the TCP path's overhead over ZeroMQ itself. Every process here keeps
    freed memory, as the stack's do, so that the baselines are ZeroMQ at its best.
    `chunkings` ('MB[:in_flight]'): more `stack tcp` variants with those TCP chunk limits;
    `zmq_pieces` ('K:W'): `zmq p+p` variants in K pieces, W in flight (bench_zmq_pieces)."""
    keep_freed_memory()  # this process is the bare clients' end
    runs = {"zmq": lambda: bench_zmq(nbytes, repeats, keep_memory=True),
            "p+p": lambda: bench_zmq_pushpull(nbytes, repeats, keep_memory=True),
            "tcp": lambda: bench_stack(nbytes, repeats, 1, shared=False)}
    for c in chunkings:
        runs[f"tcp {c}"] = lambda c=c: bench_stack(nbytes, repeats, 1, shared=False,
                                                   limits=_chunking(c))
    for c in zmq_pieces:
        k, _, w = c.partition(":")
        runs[f"p+p {c}"] = lambda k=int(k), w=int(w or 1): bench_zmq_pieces(nbytes, repeats,
                                                                              k, w)
    t: dict[str, list[float]] = {k: [] for k in runs}
    for i in range(rounds):
        names = list(runs)
        order = names[i % len(names):] + names[:i % len(names)]  # each goes first in turn
        for name in order:
            t[name].append(runs[name]())
        extra = "".join(f"  {'' if k.startswith('p+p') else 'stack '}{k} {t[k][-1] * 1e3:.3f} ms"
                        for k in names[3:])
        print(f"round {i}: zmq {t['zmq'][-1] * 1e3:.3f} ms  zmq p+p {t['p+p'][-1] * 1e3:.3f} ms"
              f"  stack tcp {t['tcp'][-1] * 1e3:.3f} ms  tcp/zmq {t['tcp'][-1] / t['zmq'][-1]:.2f}"
              f"{extra}", flush=True)
    med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    best = {k: min(v) * 1e3 for k, v in t.items()}
    ratios = [b / a for a, b in zip(t["zmq"], t["tcp"])]
    print(f"{fmt(nbytes)} push+pull, medians of {rounds} rounds: bare zmq echo {med['zmq']:.3f} "
          f"ms, zmq p+p {med['p+p']:.3f} ms, stack tcp {med['tcp']:.3f} ms; stack tcp/zmq "
          f"{med['tcp'] / med['zmq']:.2f} (per-round {min(ratios):.2f}-{max(ratios):.2f}), "
          f"zmq p+p/zmq {med['p+p'] / med['zmq']:.2f}, stack tcp/zmq p+p "
          f"{med['tcp'] / med['p+p']:.2f}")
    print(f"best rounds (the least disturbed): zmq {best['zmq']:.3f} ms, zmq p+p "
          f"{best['p+p']:.3f} ms, stack tcp {best['tcp']:.3f} ms; stack tcp/zmq "
          f"{best['tcp'] / best['zmq']:.2f}")
    for k in list(runs)[3:]:
        r = [b / a for a, b in zip(t["zmq"], t[k])]
        label = f"zmq {k} (pieces:in flight)" if k.startswith("p+p") else \
            f"stack {k} (MB[:in flight])"
        print(f"{label}: median {med[k]:.3f} ms, /zmq "
              f"{med[k] / med['zmq']:.2f} (per-round {min(r):.2f}-{max(r):.2f}), /zmq p+p "
              f"{med[k] / med['p+p']:.2f}, /stack tcp {med[k] / med['tcp']:.2f}; best "
              f"{best[k]:.3f} ms")


BIG_SIZES = "64M,400M,4G"
# Bytes each process holds at a size, at the peak of either arm, as a multiple of the size:
# the stack's worker its gradient and its output, the shard its values and a receive chunk;
# the echo three buffers. Spares for the interpreters.
BIG_FOOTPRINT = 4.2


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(float(text))


def tcp_vs_socket(sizes: list[int], rounds: int) -> None:
    """The stack over TCP only (one shard, the job's default chunking) against raw loopback
    TCP (the echo of bench_socket), taking turns `rounds` times at each size: their medians
    and the stack's throughput as a share of the socket's. A size that does not fit in the
    memory free now is skipped, saying so."""
    import psutil
    keep_freed_memory()
    for nbytes in sizes:
        free = psutil.virtual_memory().available
        if nbytes * BIG_FOOTPRINT > free:
            print(f"{fmt(nbytes)}: skipped, needs about {nbytes * BIG_FOOTPRINT / 1e9:.1f} GB "
                  f"free, {free / 1e9:.1f} GB is", flush=True)
            continue
        repeats = 1 if nbytes >= 1 << 30 else 2
        t: dict[str, list[float]] = {"socket": [], "tcp": []}
        for i in range(rounds):
            arms = [("socket", lambda: bench_socket(nbytes, repeats)),
                    ("tcp", lambda: bench_stack(nbytes, repeats, 1, shared=False))]
            for name, run in arms[i % 2:] + arms[:i % 2]:  # each goes first in turn
                t[name].append(run())
            print(f"{fmt(nbytes)} round {i}: socket {t['socket'][-1] * 1e3:.1f} ms  stack tcp "
                  f"{t['tcp'][-1] * 1e3:.1f} ms", flush=True)
        sock, tcp = statistics.median(t["socket"]), statistics.median(t["tcp"])
        per = [a / b for a, b in zip(t["socket"], t["tcp"])]
        print(f"{fmt(nbytes)} push+pull, medians of {rounds} rounds: raw socket {sock:.3f} s "
              f"({2 * nbytes / sock / 1e9:.2f} GB/s), stack tcp {tcp:.3f} s "
              f"({2 * nbytes / tcp / 1e9:.2f} GB/s); stack throughput / socket {sock / tcp:.2f} "
              f"(per round {min(per):.2f}-{max(per):.2f})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    parser.add_argument("--repeats", type=int, default=5, help="timed batches per measurement")
    parser.add_argument("--tcp-vs-zmq", action="store_true", help="only `stack tcp` beside "
                        "bare `zmq` and `zmq p+p` (bare ZeroMQ doing a push+pull's work), "
                        "taking turns, at --bytes: medians and their ratios")
    parser.add_argument("--bytes", type=int, default=3_730_000, help="size for --tcp-vs-zmq")
    parser.add_argument("--rounds", type=int, default=7, help="rounds for --tcp-vs-zmq")
    parser.add_argument("--tcp-chunks", default="", metavar="MB[:K],...",
                        help="with --tcp-vs-zmq: more `stack tcp` variants taking turns, each "
                        "cutting pieces above MB megabytes into MB chunks ('off': none), K in "
                        "flight (e.g. off,0.5:4,1:2); plain `stack tcp` keeps the job's "
                        "defaults")
    parser.add_argument("--zmq-pieces", default="", metavar="K:W,...",
                        help="with --tcp-vs-zmq: more `zmq p+p` variants taking turns, the "
                        "push and the pull each in K pieces, W unanswered (e.g. 2:2,4:2)")
    parser.add_argument("--tcp-vs-socket", action="store_true", help="only `stack tcp` beside "
                        "the raw socket echo at each of --big-sizes, taking turns --rounds "
                        "times: the stack's share of raw loopback TCP throughput")
    parser.add_argument("--big-sizes", default=BIG_SIZES, metavar="SIZE,...",
                        help="sizes for --tcp-vs-socket, with K, M or G (default %(default)s)")
    args = parser.parse_args()
    if args.tcp_vs_socket:
        tcp_vs_socket([_size(x) for x in args.big_sizes.split(",") if x], args.rounds)
        return 0
    if args.tcp_vs_zmq:
        tcp_vs_zmq(args.bytes, args.rounds, args.repeats,
                   [c for c in args.tcp_chunks.split(",") if c],
                   [c for c in args.zmq_pieces.split(",") if c])
        return 0
    sizes = [64 << 10, 3_730_000, 64 << 20] if args.quick else SIZES
    repeats = 3 if args.quick else args.repeats
    print(f"{'size':>9} {'memcpy':>9} {'socket':>9} {'zmq':>9} {'stack':>9} {'stack tcp':>9} "
          f"{'stack x4':>9}  {'stack/zmq':>9} {'tcp/zmq':>7} {'MB/s stack':>10} "
          f"{'sock 1way':>9} {'push':>9} {'push tcp':>9} {'push/sock':>9} {'tcp/sock':>8}")
    for nbytes in sizes:
        t = {"memcpy": bench_memcpy(nbytes, repeats), "socket": bench_socket(nbytes, repeats),
             "zmq": bench_zmq(nbytes, repeats), "stack": bench_stack(nbytes, repeats, 1),
             "stack_tcp": bench_stack(nbytes, repeats, 1, shared=False),
             "stack4": bench_stack(nbytes, repeats, 4),
             "socket1": bench_socket(nbytes, repeats, one_way=True),
             "push": bench_stack(nbytes, repeats, 1, push_only=True),
             "push_tcp": bench_stack(nbytes, repeats, 1, push_only=True, shared=False)}
        ms = {k: v * 1e3 for k, v in t.items()}
        print(f"{fmt(nbytes):>9} {ms['memcpy']:8.3f}m {ms['socket']:8.3f}m {ms['zmq']:8.3f}m "
              f"{ms['stack']:8.3f}m {ms['stack_tcp']:8.3f}m {ms['stack4']:8.3f}m  "
              f"{t['stack'] / t['zmq']:9.2f} {t['stack_tcp'] / t['zmq']:7.2f} "
              f"{2 * nbytes / t['stack'] / 1e6:10.0f} {ms['socket1']:8.3f}m {ms['push']:8.3f}m "
              f"{ms['push_tcp']:8.3f}m {t['socket1'] / t['push']:9.2f} "
              f"{t['socket1'] / t['push_tcp']:8.2f}",
              flush=True)
    print("times: medians in ms per push+pull round trip; 'stack x4' per worker with 4 workers "
          "sharing one server; 'sock 1way' sends N bytes and gets an 8-byte ack; 'push' is a "
          "stack push alone (SGD applied); push/sock is push throughput relative to the socket; "
          "'tcp' columns: shared memory off, every byte through the sockets")
    return 0


if __name__ == "__main__":
    sys.exit(main())
