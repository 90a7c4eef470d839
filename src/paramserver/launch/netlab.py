"""Several "hosts" on one Linux machine: network namespaces on a bridge, with shaped links.

`NetLab(3)` creates three namespaces (hosts 0..2) and a fourth holding a bridge (the switch).
Every host has one veth pair: `eth0` inside the host, with the address SUBNET.(i+1)/24, and
`hI` on the switch's bridge. Nothing is created in the machine's own namespace, so the hosts
reach each other and nothing else. Loopback is brought up in every host.

`lab.shape(1, "8mbit")` puts a token-bucket filter (tc tbf) on host 1's link: on the switch
port (traffic towards the host) and on the host's `eth0` (traffic from it), so host 1 has a
real slow link both ways. `lab.popen(0, [...])` runs a command inside host 0
(`ip netns exec`) and keeps its PID; `lab.close()` (or leaving the `with` block) kills the
processes it started, by PID, and deletes the namespaces.

Names carry a prefix unique to the run (`psnet-<pid>-<random>`), so parallel runs do not
collide; `remove_stale()` deletes the namespaces of runs whose process is gone. Needs root
(or CAP_SYS_ADMIN + CAP_NET_ADMIN) and iproute2 (`ip`, `tc`); `netns_unavailable()` says why
not when it cannot work. No shell anywhere: every command is an argument list.

`run_job(lab, job, run_dir)` runs a paramserver job across the lab: coordinator, servers and
evaluator on host 0, one worker on each other host, joined over TCP to host 0's address
(in launch/netlab_run.py).
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field


__all__ = ["PREFIX", "NetLab", "NetLabError", "list_namespaces",
           "netns_unavailable", "rate_bytes", "remove_stale"]

PREFIX = "psnet"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$", re.IGNORECASE)
_SUBNET = re.compile(r"^(\d{1,3})\.(\d{1,3})\.(\d{1,3})$")
_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8,
          "bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}
_PR_SET_PDEATHSIG = 1


class NetLabError(RuntimeError):
    """A namespace, link or qdisc could not be set up (the failing command and its stderr)."""


def _die_with_parent() -> None:
    """In the child before exec: the kernel kills it if the process that started it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _ip_binary() -> str | None:
    return shutil.which("ip") or next(
        (p for p in ("/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip") if os.access(p, os.X_OK)), None)


def _tc_binary() -> str | None:
    return shutil.which("tc") or next(
        (p for p in ("/usr/sbin/tc", "/sbin/tc", "/usr/bin/tc") if os.access(p, os.X_OK)), None)


def _run(argv: list[str], timeout: float = 20.0, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise NetLabError(f"{' '.join(argv)} failed ({proc.returncode}): "
                          f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def rate_bytes(rate: str) -> float:
    """Bytes per second of a tc rate such as '8mbit' (bits) or '1mbps' (bytes)."""
    m = _RATE.match(rate)
    if not m:
        raise ValueError(f"rate {rate!r} is not a tc rate such as 8mbit, 500kbit or 1mbps")
    unit = m.group(2).lower()
    return float(rate[: len(rate) - len(unit)]) * _UNITS[unit]


def netns_unavailable() -> str | None:
    """None when namespaces can be made here; otherwise the reason (for a test's skip)."""
    ip, tc = _ip_binary(), _tc_binary()
    if ip is None:
        return "iproute2 is not installed: no `ip` command (apt-get install iproute2)"
    if tc is None:
        return "iproute2 is incomplete: no `tc` command (apt-get install iproute2)"
    probe = f"{PREFIX}-{os.getpid()}-probe{secrets.token_hex(2)}"
    try:
        proc = _run([ip, "netns", "add", probe], check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns add` could not run: {exc}"
    if proc.returncode != 0:
        return (f"`ip netns add` failed (needs root or CAP_SYS_ADMIN): "
                f"{(proc.stderr or proc.stdout).strip()}")
    _run([ip, "netns", "del", probe], check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_namespaces() -> list[str]:
    ip = _ip_binary()
    if ip is None:
        return []
    out = _run([ip, "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale(prefix: str = PREFIX) -> list[str]:
    """Delete namespaces `<prefix>-<pid>-...` left by runs whose process <pid> is gone.

    Only the name is removed; a namespace still used by a live process lingers until it exits.
    """
    removed = []
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-")
    for name in list_namespaces():
        m = pattern.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _run([_ip_binary(), "netns", "del", name], check=False)
            removed.append(name)
    return removed


@dataclass
class NetLab:
    """N hosts (network namespaces) on one bridge; see the module doc."""

    hosts: int
    subnet: str = "10.77.0"  # host i gets SUBNET.(i+1)/24
    prefix: str | None = None
    popened: list[subprocess.Popen] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    shaped: dict[int, str] = field(default_factory=dict)

    def __post_init__(self):
        if not 1 <= self.hosts <= 200:
            raise ValueError(f"hosts must be 1..200, not {self.hosts}")
        m = _SUBNET.match(self.subnet)
        if not m or not all(0 <= int(x) <= 255 for x in m.groups()):
            raise ValueError(f"subnet {self.subnet!r} is not three octets such as 10.77.0")
        self.prefix = self.prefix or f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        if not _NAME.match(self.prefix) or len(self.prefix) > 40:
            raise ValueError(f"prefix {self.prefix!r}: letters, digits, '-', '_', '.' only")
        self.ip, self.tc = _ip_binary(), _tc_binary()
        if self.ip is None or self.tc is None:
            raise NetLabError("iproute2 (`ip` and `tc`) is not installed")

    # ---- names -------------------------------------------------------------------------------
    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def ns(self, host: int) -> str:
        self._check_host(host)
        return f"{self.prefix}-h{host}"

    def address(self, host: int) -> str:
        self._check_host(host)
        return f"{self.subnet}.{host + 1}"

    @property
    def addresses(self) -> list[str]:
        return [self.address(h) for h in range(self.hosts)]

    def _check_host(self, host: int) -> None:
        if not (isinstance(host, int) and 0 <= host < self.hosts):
            raise ValueError(f"host {host!r} is not one of 0..{self.hosts - 1}")

    # ---- build and tear down -----------------------------------------------------------------
    def _ipn(self, ns: str, *args: str) -> None:
        _run([self.ip, "-n", ns, *args])

    def create(self) -> "NetLab":
        """Make the switch and the hosts; on any failure removes what it made and raises."""
        try:
            self._add_ns(self.switch)
            self._ipn(self.switch, "link", "add", "br0", "type", "bridge")
            self._ipn(self.switch, "link", "set", "br0", "up")
            for h in range(self.hosts):
                ns, port = self.ns(h), f"h{h}"
                self._add_ns(ns)
                self._ipn(ns, "link", "set", "lo", "up")
                _run([self.ip, "link", "add", "eth0", "netns", ns, "type", "veth",
                      "peer", "name", port, "netns", self.switch])
                self._ipn(self.switch, "link", "set", port, "master", "br0")
                self._ipn(self.switch, "link", "set", port, "up")
                self._ipn(ns, "addr", "add", f"{self.address(h)}/24", "dev", "eth0")
                self._ipn(ns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def _add_ns(self, name: str) -> None:
        _run([self.ip, "netns", "add", name])
        self.created.append(name)

    def shape(self, host: int, rate: str, direction: str = "both", burst: int | None = None,
              latency: str = "100ms") -> None:
        """Limit host's link to `rate` with tc tbf: "to" the host, "from" it, or "both"."""
        rate_bytes(rate)  # validates
        if direction not in ("to", "from", "both"):
            raise ValueError(f"direction must be to, from or both, not {direction!r}")
        if not re.match(r"^\d+(\.\d+)?(ms|us|s)$", latency):
            raise ValueError(f"latency {latency!r} is not a tc time such as 100ms")
        # The bucket must hold at least one timer tick of tokens; 10 ms of traffic, >= 16 kB.
        burst = int(burst or max(16_000, rate_bytes(rate) / 100))
        tbf = ["root", "tbf", "rate", rate, "burst", str(burst), "latency", latency]
        targets = []
        if direction in ("to", "both"):
            targets.append((self.switch, f"h{host}"))
        if direction in ("from", "both"):
            targets.append((self.ns(host), "eth0"))
        for ns, dev in targets:
            _run([self.tc, "-n", ns, "qdisc", "replace", "dev", dev, *tbf])
        self.shaped[host] = rate

    def unshape(self, host: int) -> None:
        for ns, dev in ((self.switch, f"h{host}"), (self.ns(host), "eth0")):
            _run([self.tc, "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
        self.shaped.pop(host, None)

    def qdisc(self, host: int) -> str:
        """`tc qdisc show` of both ends of host's link (for logs and checks)."""
        out = []
        for ns, dev in ((self.switch, f"h{host}"), (self.ns(host), "eth0")):
            out.append(_run([self.tc, "-n", ns, "qdisc", "show", "dev", dev]).stdout.strip())
        return "\n".join(out)

    def popen(self, host: int, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start argv inside host's namespace; the process is killed by close()."""
        if not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError("argv must be a non-empty list of strings")
        if kwargs.get("shell"):
            raise ValueError("no shell: pass an argument list")
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("preexec_fn", _die_with_parent)
        proc = subprocess.Popen([self.ip, "netns", "exec", self.ns(host), *argv], **kwargs)
        self.popened.append(proc)
        return proc

    def nsenter(self, host: int, argv: list[str]) -> list[str]:
        """argv run inside host's network namespace by `nsenter --net`, which, unlike `ip netns
        exec`, leaves /sys (and /sys/fs/cgroup) as it is: the daemons of the Slurm and Ray
        labs need it."""
        return [shutil.which("nsenter") or "nsenter", f"--net=/run/netns/{self.ns(host)}", *argv]

    def run(self, host: int, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run argv inside host's namespace to its end; returns its output (text)."""
        proc = self.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            raise NetLabError(f"{argv[0]} in host {host} did not finish in {timeout:g} s")
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def stop_processes(self, grace: float = 3.0) -> None:
        """SIGTERM every process popen() started, SIGKILL the ones still there after `grace`."""
        for p in self.popened:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.popened:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def kill_host(self, host: int) -> list[int]:
        """Cut host's power: SIGKILL every process inside its namespace, whoever started it.
        Returns the PIDs killed."""
        return self._kill_inside(self.ns(host))

    def _kill_inside(self, name: str) -> list[int]:
        killed = []
        for pid in _run([self.ip, "netns", "pids", name], check=False).stdout.split():
            if pid.isdigit() and int(pid) != os.getpid():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))
                except ProcessLookupError:
                    pass
        return killed

    def close(self) -> None:
        """Kill the processes started here, then delete every namespace made (idempotent)."""
        self.stop_processes()
        for name in reversed(self.created):
            # Anything still inside one of our namespaces (a child of a process we started)
            # would keep it alive after the name is gone: kill those by PID first.
            self._kill_inside(name)
            _run([self.ip, "netns", "del", name], check=False)
        self.created.clear()

    def __enter__(self) -> "NetLab":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.close()

