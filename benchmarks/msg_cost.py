"""What one small request and its answer cost: raw ZeroMQ against paramserver's message layer.

Two processes play ping-pong over DEALER/ROUTER on 127.0.0.1, as a worker's clock and the
coordinator's release do. For each variant it reports the median over repeats of the round-trip
time and of the CPU time per round trip on each side (both processes' own threads, ZeroMQ's I/O
thread included; the server's start-up is left out). The variants run interleaved, so a slow
spell of this shared machine weighs on all of them.

  raw     recv_multipart(copy=False) / send_multipart of 40 bytes: ZeroMQ alone
  codec   the same calls, the message encoded and decoded by wire.codec
  rpc     runtime.rpc.send / recv (codec plus the transport's shared-memory and shaping checks)

  python benchmarks/msg_cost.py --trips 5000 --repeats 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import time

from paramserver.net import rpc
from paramserver.transport import bind_router, connect_dealer, new_context
from paramserver.wire import Message, decode, encode

VARIANTS = ("raw", "codec", "rpc")


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _answer(router, variant: str, i: int) -> None:
    if variant == "raw":
        frames = router.recv_multipart(copy=False)
        router.send_multipart([frames[0].bytes, b"ack" * 10])
    elif variant == "codec":
        frames = router.recv_multipart(copy=False)
        msg = decode(frames[1:])
        router.send_multipart([frames[0].bytes, *encode(Message(
            "ack", {"version": i, "staleness": 0}, rid=msg.rid, src="s0"))])
    else:
        ident, msg, _ = rpc.recv(router, routed=True)
        rpc.send(router, Message("ack", {"version": i, "staleness": 0}, rid=msg.rid, src="s0"),
                 ident)


def _server(variant: str, trips: int, addr_q, out_q) -> None:
    ctx = new_context()
    router, addr = bind_router(ctx, "127.0.0.1", 0)
    addr_q.put(addr)
    _answer(router, variant, 0)  # the first trip connects: not counted
    start = _cpu()
    for i in range(trips):
        _answer(router, variant, i + 1)
    out_q.put((_cpu() - start) / trips)
    router.close(0)
    ctx.term()


def _ask(dealer, variant: str, i: int) -> None:
    msg = Message("clock", {"step": i, "batch": 32, "compute_time": 0.003}, rid=i + 1, src="w0")
    if variant == "raw":
        dealer.send(b"push" * 10)
        dealer.recv()
    elif variant == "codec":
        dealer.send_multipart(encode(msg))
        decode([dealer.recv()])
    else:
        rpc.send(dealer, msg)
        rpc.recv(dealer, routed=False)


def measure(variant: str, trips: int) -> tuple[float, float, float]:
    """(round trip s, client CPU s per trip, server CPU s per trip) of one run."""
    addr_q, out_q = mp.Queue(), mp.Queue()
    server = mp.Process(target=_server, args=(variant, trips, addr_q, out_q))
    server.start()
    try:
        ctx = new_context()
        dealer = connect_dealer(ctx, addr_q.get(timeout=60))
        _ask(dealer, variant, 0)
        cpu0, t0 = _cpu(), time.perf_counter()
        for i in range(trips):
            _ask(dealer, variant, i + 1)
        wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
        server_cpu = out_q.get(timeout=60)
        dealer.close(0)
        ctx.term()
    finally:
        server.join(60)
        if server.is_alive():
            server.kill()
            server.join()
    return wall / trips, cpu / trips, server_cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for v in VARIANTS:
            runs[v].append(measure(v, args.trips))
    print(f"{'variant':8s} {'round trip':>11s} {'client CPU':>11s} {'server CPU':>11s}  "
          f"(medians of {args.repeats} x {args.trips} trips, microseconds)")
    base = statistics.median(r[1] + r[2] for r in runs["raw"])
    for v in VARIANTS:
        rtt, client, server = (statistics.median(r[k] for r in runs[v]) * 1e6 for k in range(3))
        both = statistics.median(r[1] + r[2] for r in runs[v])
        print(f"{v:8s} {rtt:11.1f} {client:11.1f} {server:11.1f}  CPU both sides "
              f"{both / base:.2f}x raw")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
