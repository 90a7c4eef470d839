"""How long a simulated step's messages take: modelled links, or times replayed from a live run.

The Engine walks every step through the same events (release delivered -> pull at the server ->
compute -> push applied -> clock at the coordinator) and asks its communication model only for
times. Two models, each owning its own state, chosen when the engine is built:

LinkSteps: each message takes the one-way latency L; pull replies and pushes queue FIFO on the
    server's outbound and inbound links (model_bytes / servers / bandwidth each). The pull is
    read at the server L after the release reached the worker; the ack lands L after the push
    is applied and the clock reaches the coordinator L after that.
ReplaySteps: each step's pull and push take the times a live run recorded for that worker and
    step (sim.trace.CommReplay); the worker's unrecorded time per step follows its compute;
    the coordinator's messages take comm.release_latency and comm.clock_latency.

The attributes the engine reads on its hot path: to_read (release leaves the coordinator ->
version read), to_leave (a stop release leaves -> the worker's goodbye is in), pull_lag (release
reaches the worker -> version read), ack_lag (push applied -> ack at the worker), clock_lag
(ack -> clock at the coordinator), and real: None, or (w, step) -> the compute time the live
run measured (None where it has none).
"""

from __future__ import annotations


class LinkSteps:
    """Modelled links: latency per message, FIFO transfers on one link per direction."""

    def __init__(self, network):
        L = network.latency
        self.L, self.tx = L, network.transfer_time
        self.to_read = self.to_leave = 2 * L
        self.pull_lag = self.ack_lag = self.clock_lag = L
        self.out_free = self.in_free = 0.0  # when each link direction is next idle

    def start_wait(self, w: int) -> float:
        return 0.0

    def pull(self, t: float, w: int, step: int) -> tuple[float, float]:
        """The version was read at `t`: (when the reply lands, pull time as the worker sees it)."""
        start = t if t > self.out_free else self.out_free
        self.out_free = end = start + self.tx
        got = end + self.L
        return got, got - (t - self.L)

    def compute_end(self, got: float, w: int, step: int, compute: float) -> float:
        return got + compute

    def push(self, t: float, w: int, step: int) -> float:
        """Compute ended at `t`: when the push is applied (after the pushes queued before it)."""
        start = t + self.L
        if self.in_free > start:
            start = self.in_free
        self.in_free = end = start + self.tx
        return end

    real = None  # modelled steps have no measured compute time


class ReplaySteps:
    """Replayed communication: the recorded pull and push times of each worker and step."""

    def __init__(self, comm):
        self.comm = comm  # sim.trace.CommReplay
        self.to_read = comm.release_latency
        self.to_leave = comm.release_latency + comm.clock_latency
        self.pull_lag = self.ack_lag = 0.0  # the pull starts at the worker, the ack is the push
        self.clock_lag = comm.clock_latency

    def start_wait(self, w: int) -> float:
        return self.comm.start_wait(w)

    def pull(self, t: float, w: int, step: int) -> tuple[float, float]:
        p = self.comm.pull(w, step)
        return t + p, p

    def compute_end(self, got: float, w: int, step: int, compute: float) -> float:
        busy = compute + self.comm.overhead(w, step)
        return got + (busy if busy > 0 else 0.0)

    def push(self, t: float, w: int, step: int) -> float:
        return t + self.comm.push(w, step)

    def real(self, w: int, step: int) -> float | None:
        return self.comm.real(w, step)
