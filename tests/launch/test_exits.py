"""The exit table (core/exits.py): what each code tells an orchestrator, and the docs' copy of it."""

import re
from pathlib import Path

from paramserver.core.exits import MEANING, Exit, describe, own, retryable, server_left

DOCS = Path(__file__).resolve().parents[2] / "docs" / "multihost.md"


def test_permanent_and_retryable_codes_follow_kubeflows_rule():
    assert [c for c in Exit if retryable(c)] == [Exit.INTERRUPTED, Exit.PREEMPTED,
                                                 Exit.PEER_LOST]
    assert not any(retryable(c) for c in (Exit.FINISHED, Exit.FAILED, Exit.REFUSED, None))
    assert retryable(-9) and retryable(137)  # killed by a signal: the same pod may well succeed
    assert not retryable(256) and not retryable(127)


def test_a_code_of_the_table_is_the_process_own_word_and_a_signal_is_not():
    assert all(own(c) for c in Exit)
    assert not own(-9) and not own(137) and not own(None) and not own(3)
    # No code of the table reads as a death by signal (128 + a Linux signal number, 1..64),
    # but the one that means exactly that: SIGTERM's, taken as a drain.
    assert [c for c in Exit if 129 <= c <= 128 + 64] == [Exit.INTERRUPTED, Exit.PREEMPTED]


def test_a_server_drained_on_sigterm_left_as_a_finished_one_did():
    """A server drained on SIGTERM exits PREEMPTED: no launcher restarts it or ends the job
    for it (local.py, netlab_run.py, ray_launcher.py read server_left)."""
    assert server_left(Exit.FINISHED) and server_left(Exit.PREEMPTED)
    assert not any(server_left(c) for c in (Exit.FAILED, Exit.REFUSED, Exit.PEER_LOST,
                                            Exit.INTERRUPTED, -9, 137, None))


def test_describe_names_each_code():
    assert describe(Exit.PEER_LOST) == f"exit code 203 ({MEANING[Exit.PEER_LOST]})"
    assert describe(-15) == "signal 15" and describe(None) == "still running"
    assert describe(7) == "exit code 7"
    assert set(MEANING) == set(Exit)


def test_the_docs_table_is_the_code_table():
    text = DOCS.read_text()
    section = text[text.index("## Exit codes"):]
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", section, re.M)
    assert [(int(n), name) for n, name in rows] == [(int(c), c.name) for c in Exit]


def test_a_dead_servers_failure_names_what_its_job_can_do(tmp_path):
    """The launcher's word on a server that died: --restart-servers where the job could use it,
    and for a replicated job (which cannot) that both copies are gone and --resume."""
    import subprocess
    import sys

    from paramserver.launch.local import Child, LocalCluster
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    dead.wait(30)
    log = tmp_path / "server-0.log"
    log.write_text("")
    said = {}
    for replicas in (1, 2):
        job = {"num_keys": 8, "servers": 1, "workers": 1, "replicas": replicas}
        cluster = LocalCluster(job, tmp_path / f"run{replicas}")
        said[replicas] = cluster._failure_message(Child("server", 0, dead, log))
    assert "--restart-servers N restarts dead servers" in said[1]
    assert "--restart-servers" not in said[2]
    assert "no backup took its shard over" in said[2] and "--resume" in said[2]
