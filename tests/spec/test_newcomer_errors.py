"""A newcomer's mistakes: each refused with its error first (what is wrong, then the fix or the
nearest name), exit status 2, no usage block, no traceback, and no run folder left behind."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from paramserver.cli.main import main

ROOT = Path(__file__).resolve().parents[2]

# (command, a fragment the first line must hold, a fragment of the hint or "" for none)
MISTAKES = [
    ("train --workrs 4", "unrecognized arguments: --workrs", "did you mean --workers?"),
    ("trian --steps 1", "invalid choice: 'trian'", "did you mean train?"),
    ("train --link 10gbpz --steps 1", "argument --link", ""),
    ("train --workers 0", "argument --workers", ""),
    ("train --workers 2:1", "argument --workers: workers 2:1: MIN must be <= MAX", ""),
    ("train --servers 3:2", "argument --servers: servers 3:2: MIN must be below MAX", ""),
    ("train --batch-size 0", "argument --batch-size", ""),
    ("train --straggler 1:x", "argument --straggler", ""),
    ("train --device-time 5", "argument --device-time", ""),
    ("train --epochs 0", "argument --epochs: expected a number > 0", ""),
    ("train --epochs 5 --steps 100", "--epochs 5 and --steps 100 both set the sample budget",
     ""),
    ("train --sync bspp --steps 1", "unknown sync policy 'bspp'", "did you mean bsp?"),
    ("train --sync ssp --sync-opt stalenes=2 --steps 1", "no option 'stalenes'",
     "did you mean staleness?"),
    ("train --optimizer momentun --steps 1", "unknown optimizer", "did you mean momentum?"),
    ("train --model-opt hiden=3 --steps 1", "has no option(s) hiden", "did you mean hidden?"),
    ("train --model-opt hidden=wide --steps 1",
     "model 'mlp' option hidden takes a whole number (default 512), got 'wide'", ""),
    ("train --compress topk --compress-opt fractin=0.1 --steps 1", "no option(s) fractin",
     "did you mean fraction?"),
    ("train --compress topk --compress-opt fraction=abc --steps 1",
     "fraction must be a number; got 'abc'", ""),
    ("train --compress topk --compress-opt fraction=nan --steps 1",
     "fraction must be in (0.0, 1.0]; got nan", ""),
    ("train --sync auto --sync-opt margin=abc --steps 1", "margin must be a number; got 'abc'",
     ""),
    ("train --optimizer momentum --optimizer-opt momentum=abc --steps 1",
     "momentum must be a number in [0, 1), got 'abc'", ""),
    ("train --optimizer adam --optimizer-opt weight_decay=abc --steps 1",
     "option weight_decay takes a number (default 0); got 'abc'", ""),
    ("train --optimizer adam --optimizer-opt amsgrad=abc --steps 1",
     "option amsgrad takes true or false (default false); got 'abc'", ""),
    ("train --replicas 2 --restart-servers 1 --steps 1",
     "--replicas 2 and --restart-servers (job fields 'replicas' and 'restart_servers') are "
     "exclusive", ""),
    ("train --restart-servers 1 --checkpoint-every 5 --replicas 2 --steps 1",
     "are exclusive", ""),
    ("train --amp fp16 --schedule fifo --steps 1", "--amp fp16 cannot be combined", ""),
    ("simulate --workers 0", "argument --workers: expected a whole number >= 1, got '0'", ""),
    ("simulate --steps 0", "argument --steps: expected a whole number >= 1, got '0'", ""),
    ("export RUN --format safetensor", "invalid choice: 'safetensor'",
     "did you mean safetensors?"),
    ("demo --workers 0", "argument --workers: expected a whole number >= 1", ""),
    ("demo --num-keys 0 --timeout 5", "argument --num-keys: expected a whole number >= 1", ""),
    ("demo --keys 0 --timeout 5", "argument --keys: expected a whole number >= 1", ""),
    ("demo --num-keys 1 --servers 2 --timeout 30",
     "1 keys cannot be spread over 2 servers (each holds one key at least): give fewer "
     "servers", ""),
    ("serve --num-keys 1 --servers 2 --timeout 30", "1 keys cannot be spread over 2 servers",
     ""),
    ("serve --num-keys 10 --port 99999", "argument --port", ""),
    ("serve --num-keys 0", "--num-keys must be at least 1", ""),
    ("launch --workers 2 -- no_such_program_here", "no program 'no_such_program_here' on PATH",
     ""),
    ("launch --workers 2 -- my_train.py", "no program 'my_train.py'", "-- python my_train.py"),
    ("launch --workers 2", "give the worker command after --", ""),
    # train's flags that launch does not take: where the script says the same (this raised
    # a TypeError before: launch's own `command` shadowed the subcommand's name)
    ("launch --workers 2 --compress bf16 -- python x.py", "unrecognized arguments: --compress",
     'DistributedOptimizer(..., compression="bf16")'),
    ("launch --checkpoint-every 5 -- python x.py", "unrecognized arguments: --checkpoint-every",
     "the script saves its own checkpoints"),
    ("launch --epochs 3 -- python x.py", "unrecognized arguments: --epochs",
     "give --steps or --max-seconds"),
    ("launch --workrs 2 -- python x.py", "unrecognized arguments: --workrs",
     "did you mean --workers?"),
    ("drain /no/such/run --server 0", "neither an address", ""),
    ("drain tcp://nohost --server 0", "'tcp://nohost' is no address to join: give "
     "tcp://HOST:PORT", ""),
    ("top --once tcp://nohost", "'tcp://nohost' is no address to join: give tcp://HOST:PORT",
     ""),
    ("report /no/such/run", "paramserver report:", ""),
    ("train --link w9=100mbit --steps 1", "names worker 9 but the job has workers 0..3", ""),
    ("compare --workers 1 --scenario one-slow --epochs 1",
     "scenario one-slow: --straggler '1:3' names worker(s) [1]", ""),
    ("compare --workers 2 --link w2=100mbit --epochs 1", "names worker 2", ""),
    ("compare --sync bsp --target 2 --max-seconds 2 --repeats 1 --no-single",
     "argument --target: expected an accuracy (or AUC) in (0, 1], e.g. 0.95, got '2'", ""),
    ("report RUN --target 1.5", "argument --target: expected an accuracy (or AUC) in (0, 1]",
     ""),
    ("compare --sync bsp,ssp --sync-opt ssp.stalenes=2 --max-seconds 2 --repeats 1",
     "sync policy 'ssp' has no option 'stalenes'", "did you mean staleness?"),
    ("compare --sync bsp --sync-opt ssp.staleness=2 --max-seconds 2 --repeats 1",
     "--sync-opt names ssp, which this comparison does not run (--sync bsp): add ssp to "
     "--sync or drop its option", ""),
    ("compare --sync auto --sync-opt ssp.staleness=2 --max-seconds 2 --repeats 1",
     "(auto runs ssp at its own bound: auto.staleness=N)", ""),
    # the job's own checks, named by the flag that set the field, not by the job file's name
    ("train --max-message-bytes 1000 --steps 1",
     "--max-message-bytes must be an integer >= 131072; got 1000", ""),
    ("train --restart-servers 1 --steps 1",
     "--restart-servers needs checkpoints to restart from", ""),
    ("train --batch-rule linear --steps 1", "--batch-rule applies to an elastic job", ""),
    ("train --schedule layer --steps 1", "argument --schedule: invalid choice: 'layer'", ""),
    ("train --lr 0 --steps 1", "argument --lr: expected a number > 0, got '0'", ""),
    ("launch --lr -1 -- python x.py", "argument --lr: expected a number > 0", ""),
    ("train --model-size 2M --steps 1",
     "--model-size sizes a model built by its parameter count (wide); --model mlp is sized by "
     "its own options", ""),
    ("compare --model-size 2M --max-seconds 2 --repeats 1",
     "--model-size sizes a model built by its parameter count", ""),
    # no machine holds 40 copies of 3.7 TB: refused before any process starts (a job of a
    # model too big for its machine left its shards silent, then failed naming them)
    ("train --model wide --model-size 1T --steps 1",
     "the model's 999,998,850,926 parameters (3725.3 GB in float32) need at least", ""),
]


@pytest.mark.parametrize("command,first,hint", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_mistake_is_refused_error_first(command, first, hint, tmp_path, monkeypatch,
                                          capsys):
    monkeypatch.chdir(tmp_path)
    argv = [str(tmp_path) if a == "RUN" else a for a in command.split()]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's refusals exit from inside parse_args
        code = exc.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert lines and lines[0].startswith("paramserver") and first in lines[0], err
    assert "usage:" not in err and "Traceback" not in err, err
    if hint:
        assert hint in err, err
    assert len(lines) <= 2, err  # the error, then at most a hint
    assert not (tmp_path / "runs").exists(), "a refused command left a run folder"


OUT_COMMANDS = ["train", "compare", "simulate --steps 5", "serve --num-keys 10", "demo",
                "calibrate", "advise --profile RUN", "launch --workers 1 -- python x.py"]


@pytest.mark.parametrize("command", OUT_COMMANDS)
@pytest.mark.parametrize("below", [False, True], ids=["file", "under-a-file"])
def test_an_out_folder_where_a_file_is_is_refused_at_the_flag(command, below, tmp_path,
                                                              monkeypatch, capsys):
    """--out naming a file (or a folder under one) is refused as the flag's error, before
    anything starts: mkdir's FileExistsError / NotADirectoryError was a traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("a file\n")
    out = "notes.txt/run" if below else "notes.txt"
    argv = [str(tmp_path) if a == "RUN" else a for a in command.split()]
    cut = argv.index("--") if "--" in argv else len(argv)
    argv[cut:cut] = ["--out", out]
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.splitlines()[0].endswith(
        "argument --out: " + ("notes.txt/run: " if below else "")
        + "notes.txt is a file, not a folder; give a new or existing folder"), err
    assert "Traceback" not in err and not (tmp_path / "runs").exists(), err


def test_a_busy_port_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code = main(["serve", "--num-keys", "10", "--port", str(port)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"paramserver serve: port {port} on 127.0.0.1 is in use: give "
                          f"another --port"), err
    assert not (tmp_path / "runs").exists()


def test_a_worker_command_that_is_no_program_fails_the_launch_saying_so(tmp_path):
    """A file that exists but cannot be executed as a program: the launch ends at once,
    naming it, with no traceback (the servers it started are stopped)."""
    bad = tmp_path / "notes.txt"
    bad.write_text("not a program\n")
    bad.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "paramserver", "launch", "--workers", "1",
                           "--quiet", "--out", str(tmp_path / "run"), "--", str(bad)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert f"cannot start '{bad}' as worker 0: Exec format error" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_bare_python_runs_as_this_interpreter(tmp_path, monkeypatch):
    """`launch -- python x.py` runs the workers with the interpreter running paramserver (as
    torchrun does), so an unactivated venv's workers still find torch."""
    from paramserver.cli.launch_cmd import worker_command
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("")
    assert worker_command(["python", "x.py"]) == [sys.executable, "x.py"]
    assert worker_command(["python3", "-u", "x.py"]) == [sys.executable, "-u", "x.py"]
    assert worker_command(["no_such_program_here", "x"], local=False) == [
        "no_such_program_here", "x"]  # under Ray: resolved on the worker's host
    # A script that is not there is said before any process starts (every worker would
    # fail with python's "can't open file"); under Ray it is looked for on the worker's host.
    with pytest.raises(ValueError, match="no such file 'missing.py' .the script of the worker"):
        worker_command(["python", "missing.py"])
    assert worker_command(["python", "missing.py"], local=False) == [sys.executable,
                                                                      "missing.py"]
    assert worker_command(["python", "-m", "mypkg.train"]) == [sys.executable, "-m",
                                                               "mypkg.train"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_keeps_what_was_trained(tmp_path, sig):
    """A Ctrl-C in the middle of `train`: the run folder keeps model.pt (the servers'
    parameters at that moment, under the model's names) and summary.json of the steps done,
    marked interrupted; exit 130; every process of the job is gone, and its temporary files.
    A SIGTERM (kill, a `timeout`) does the same: it ended the launcher at once, silent, with
    no summary, and left the zygote's socket folder behind."""
    import json
    import signal
    import time

    import psutil
    import torch
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "paramserver", "train", "--epochs", "500", "--quiet",
         "--eval-interval", "0", "--out", str(run)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            metrics = run / "metrics.jsonl"
            if metrics.exists() and metrics.read_text().count("\"kind\": \"step\"") >= 8:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(getattr(signal, sig))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and f"{run} keeps the steps done" in err, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["steps"] >= 8
    state = torch.load(run / "model.pt", weights_only=True)
    assert "1.weight" in state and torch.isfinite(state["1.weight"]).all()
    gone = psutil.wait_procs(children, timeout=10)[1]
    assert not gone, f"left running: {gone}"
    assert not list(tmp.iterdir()), list(tmp.iterdir())


def test_ctrl_c_before_the_coordinator_listens_says_so(tmp_path, monkeypatch, capsys):
    """A Ctrl-C while the job is starting (no coordinator address yet): no model.pt to save,
    said in a line, exit 130, no traceback (the save once dialled the empty address)."""
    from paramserver.launch.local import LocalCluster

    def interrupted_start(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalCluster, "start", interrupted_start)
    run = tmp_path / "run"
    code = main(["train", "--workers", "2", "--steps", "1", "--quiet", "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 130, err
    assert "interrupted before the job started: no model.pt" in err, err
    assert f"{run} keeps the steps done" in err and "Traceback" not in err, err
    assert json.loads((run / "summary.json").read_text())["interrupted"] is True


def test_ctrl_c_before_a_launched_worker_joins_says_so(tmp_path, monkeypatch, capsys):
    """A launch job's model is known when its first worker joins: a Ctrl-C before that says
    so (it said model_layout.json was missing, as from an older paramserver), exit 130."""
    from paramserver.launch.local import LocalCluster

    def interrupted_start(self, *args, **kwargs):
        self.address = "tcp://127.0.0.1:9"  # the coordinator listens; no worker has joined
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalCluster, "start", interrupted_start)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("")
    run = tmp_path / "run"
    code = main(["launch", "--workers", "2", "--steps", "1", "--quiet", "--out", str(run), "--",
                 "python", "x.py"])
    err = capsys.readouterr().err
    assert code == 130, err
    assert "interrupted before a worker joined the job: no model.pt" in err, err
    assert "older paramserver" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("command", ["train --steps 1", "compare --repeats 1 --sync bsp",
                                     "advise --live"])
def test_an_out_folder_that_cannot_be_made_is_one_line_naming_it(command, capsys):
    """/proc takes no new folder, not even from root: mkdir's error is the command's one line,
    with the path, and no traceback."""
    code = main(command.split() + ["--out", "/proc/paramserver-no-such/run", "--quiet"])
    err = capsys.readouterr().err
    assert code in (1, 2), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"paramserver {command.split()[0]}: ")
    assert "/proc/paramserver-no-such" in lines[0]
    assert "Traceback" not in err
