"""The typed job spec (spec/job.py): one place for defaults, strict dict form, versions, and the
shared quantity grammar that every flag uses (core/units.py)."""

import argparse
import dataclasses
import json
import math
import subprocess
import sys

import pytest

from paramserver.cli import args as flag
from paramserver.cli.main import build_parser
from paramserver.core.units import UnitError, parse_bandwidth, parse_bitrate, parse_seconds
from paramserver.emulation.links import LinkSpec, LinkTable, parse_link
from paramserver.spec.config import TrainConfig
from paramserver.spec.job import (
    JOB_VERSION, CheckpointSpec, JobSpec, JobSpecError, Limits, OptimizerSpec, ResumeSpec,
    SyncSpec, TaskSpec, check_version, migrate_v1,
)


def full_spec() -> JobSpec:
    return JobSpec(
        num_keys=1000, dtype="float64", servers=2, workers=3, batch_size=16,
        sync=SyncSpec("ssp", {"staleness": 2}), optimizer=OptimizerSpec("momentum", 0.05,
                                                                        {"momentum": 0.9}),
        max_samples=4800, max_seconds=60.0, eval_interval=0.5, restart_servers=1,
        links=LinkTable.parse(["w=100mbit;w2=10mbit,5ms", "s0=1gbit"]),
        checkpoint=CheckpointSpec("/ckpt", every=5), resume=ResumeSpec("/ckpt", "step-10"),
        task=TaskSpec(model="cnn", dataset="synthetic", dataset_options={"samples": 500},
                      seed=3, straggler="1:3", device_time="2ms", compress="topk",
                      compress_options={"fraction": 0.01}, schedule="lifo"),
        limits=Limits(heartbeat_timeout=2.0, coordinator_timeout=20.0, start_timeout=40.0))


# --- defaults in one place ------------------------------------------------------------------------
def test_the_default_config_makes_the_default_job():
    train_size = 1797
    cfg = TrainConfig()
    built = JobSpec.from_config(cfg, num_keys=500, train_size=train_size)
    assert built == JobSpec(num_keys=500, max_samples=int(cfg.epochs * train_size))
    # TrainConfig takes the job's defaults, not copies of them
    assert (cfg.workers, cfg.batch_size, cfg.lr, cfg.heartbeat_timeout, cfg.sync) == (
        JobSpec.workers, JobSpec.batch_size, OptimizerSpec.lr, Limits.heartbeat_timeout,
        SyncSpec.name)


def test_limits_written_out_are_the_defaults_role_code_used():
    job = JobSpec().to_dict()
    d = job["limits"]
    assert job["version"] == JOB_VERSION == 2
    assert (d["coordinator_timeout"], d["start_timeout"], d["start_grace"], d["restart_timeout"],
            d["observer_grace"], d["retry_interval"]) == (7.5, 120.0, 30.0, 120.0, 30.0, 3.0)
    assert d["heartbeat_interval"] == 1.0 and d["server_timeout"] == 30.0
    fast = Limits(heartbeat_timeout=2.0)
    assert fast.heartbeat_interval == 0.5 and fast.server_timeout == 30.0
    assert Limits(heartbeat_timeout=10.0).server_timeout == 60.0
    # Members give up on a silent coordinator within 2 heartbeat timeouts, unless it is
    # restarted on death: then they wait for the new one to take them back.
    assert fast.coordinator_timeout == 3.0
    assert Limits(coordinator_timeout=9.0).coordinator_timeout == 9.0
    assert TrainConfig().to_job(10, 100)["limits"]["coordinator_timeout"] == 7.5
    assert TrainConfig(restart_coordinator=1).to_job(10, 100)["limits"][
        "coordinator_timeout"] == 30.0


def test_to_job_keeps_the_keys_and_nesting_roles_read():
    job = TrainConfig(workers=2, links=["100mbit"], checkpoint_dir="/c",
                      checkpoint_every=2).to_job(10, 100)
    assert set(job) == {f.name for f in dataclasses.fields(JobSpec)}  # every field written
    assert set(job["limits"]) == {f.name for f in dataclasses.fields(Limits)}
    assert job["sync"] == {"name": "bsp", "options": {}}
    assert job["optimizer"] == {"name": "sgd", "lr": 0.1, "options": {}}
    assert job["links"] == {"w": {"*": "100mbit"}, "s": {}}
    assert job["checkpoint"] == {"dir": "/c", "every": 2, "seconds": None}
    assert job["task"]["straggler"] == "none" and job["task"]["device_time"] == "off"
    assert job["resume"] is None
    json.dumps(job)  # the job file is JSON


# --- the dict form --------------------------------------------------------------------------------
def test_round_trip_through_the_dict_and_json():
    spec = full_spec()
    d = spec.to_dict()
    assert JobSpec.from_dict(d) == spec
    assert JobSpec.from_dict(json.loads(json.dumps(d))) == spec
    assert JobSpec.from_dict(JobSpec().to_dict()) == JobSpec()
    d["workers"] = 99  # to_dict hands out a fresh dict: the spec is not touched
    assert spec.workers == 3


def test_version_2_writes_every_field_and_its_task_whole():
    """No field is left out at its default any more: a reader sees the job as the roles do."""
    d = JobSpec().to_dict()
    assert {"device", "pull_compress", "pull_refresh", "amp"} <= set(d["task"])
    assert d["replicas"] == 1 and d["tables"] == [] and d["min_workers"] == 0
    task = TaskSpec(device="cuda", pull_compress="bf16", pull_refresh=5)
    assert JobSpec.from_dict(JobSpec(task=task).to_dict()).task == task


def v1_form(spec: JobSpec) -> dict:
    """`spec` as version 1 wrote it: limits flat at the top level, fields added since
    version 1 left out at their defaults (the code that wrote job files until version 2)."""
    d = spec.to_dict()
    del d["version"]
    d.update(d.pop("limits"))
    if d["stall_timeout"] is None:
        del d["stall_timeout"]
    for key, default in (("device", "cpu"), ("pull_compress", "none"),
                         ("pull_refresh", TaskSpec.pull_refresh), ("amp", "off")):
        if d["task"][key] == default:
            del d["task"][key]
    for key, default in (("resume", None), ("tables", []), ("layer_edges", []),
                         ("replicas", 1), ("metrics_port", None),
                         ("metrics_host", "127.0.0.1"), ("preflight", True),
                         ("min_workers", 0), ("batch_rule", "fixed"), ("max_servers", 0)):
        if d[key] == default:
            del d[key]
    return {"version": 1, **d}


@pytest.mark.parametrize("spec", [JobSpec(), "full"])
def test_a_version_1_job_reads_as_the_job_it_described(spec):
    spec = full_spec() if spec == "full" else spec
    old = v1_form(spec)
    assert "heartbeat_timeout" in old and "limits" not in old
    assert JobSpec.from_dict(old) == spec
    migrated = migrate_v1(old)
    assert migrated["version"] == 2 and migrated["limits"]["heartbeat_timeout"] == \
        spec.limits.heartbeat_timeout
    assert JobSpec.from_dict(migrated) == spec


def test_a_hand_written_version_1_job_keeps_its_meaning_and_version_2_takes_defaults():
    old = {"num_keys": 8, "workers": 2, "heartbeat_timeout": 2.0}  # no version: version 1
    spec = JobSpec.from_dict(old)
    assert spec.eval_interval == 0.0 and spec.task.name == "demo"  # what version 1 meant
    assert spec.limits.heartbeat_timeout == 2.0 and spec.limits.heartbeat_interval == 0.5
    new = JobSpec.from_dict({"version": 2, "num_keys": 8, "limits": {"heartbeat_timeout": 2.0}})
    assert new.eval_interval == JobSpec.eval_interval and new.task == TaskSpec()
    with pytest.raises(JobSpecError, match="unknown job field.*heartbeat_timeout"):
        JobSpec.from_dict({"version": 2, "heartbeat_timeout": 2.0})  # flat: version 1's
    with pytest.raises(JobSpecError, match="'limits' is version 2's"):
        JobSpec.from_dict({"version": 1, "limits": {}})


def test_the_spec_is_frozen():
    spec = full_spec()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.workers = 5
    with pytest.raises(TypeError):
        spec.sync.options["staleness"] = 9


@pytest.mark.parametrize("where, field", [((), "colour"), (("task",), "colour"),
                                          (("sync",), "colour"), (("optimizer",), "colour")])
def test_an_unknown_field_is_refused_by_name(where, field):
    d = full_spec().to_dict()
    target = d
    for key in where:
        target = target[key]
    target[field] = 1
    with pytest.raises(JobSpecError, match=field):
        JobSpec.from_dict(d)


def test_a_foreign_version_is_refused_and_a_missing_one_is_version_1():
    d = full_spec().to_dict()
    with pytest.raises(JobSpecError, match="version 3 is not supported"):
        JobSpec.from_dict({**d, "version": 3})
    with pytest.raises(JobSpecError, match="version True is not supported"):
        JobSpec.from_dict({**d, "version": True})
    with pytest.raises(JobSpecError, match="version"):
        check_version({"version": "1"})
    old = v1_form(full_spec())
    del old["version"]  # a job file from before versions
    assert check_version(old) == 1 and JobSpec.from_dict(old) == full_spec()


def test_the_coordinator_reads_old_job_files_and_refuses_foreign_ones(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({**JobSpec().to_dict(), "version": 7}))
    run = subprocess.run([sys.executable, "-m", "paramserver", "coordinator", "--job", str(job)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "version 7 is not supported" in run.stderr


@pytest.mark.parametrize("part, value, said", [
    ("sync", {"name": "nosuch", "options": {}}, "unknown sync policy 'nosuch'"),
    ("sync", {"name": "ssp", "options": {"stalenes": 2}}, "did you mean staleness?"),
    ("optimizer", {"name": "nosuch", "lr": 0.1, "options": {}}, "unknown optimizer 'nosuch'"),
    ("task", {"model": "nosuch"}, "unknown model 'nosuch'"),
    ("task", {"model_options": {"hiden": 3}}, "model 'mlp' has no option(s) hiden"),
    ("task", {"dataset": "nosuch"}, "unknown dataset 'nosuch'"),
    ("task", {"compress": "nosuch"}, "unknown --compress 'nosuch'"),
])
def test_the_coordinator_refuses_a_job_file_naming_what_no_role_could_run(part, value, said,
                                                                         tmp_path):
    # the coordinator built its policy with a traceback, or waited two minutes at its start
    # barrier for workers that could not build the model
    job = JobSpec().to_dict()
    job[part] = {**job[part], **value}
    (tmp_path / "job.json").write_text(json.dumps(job))
    run = subprocess.run([sys.executable, "-m", "paramserver", "coordinator", "--job",
                          str(tmp_path / "job.json"), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("paramserver coordinator: job file ") and said in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("make, field", [
    (lambda: JobSpec(workers=0), "workers"),
    (lambda: JobSpec(servers=1.5), "servers"),
    (lambda: JobSpec(batch_size=0), "batch_size"),
    (lambda: JobSpec(dtype="float16"), "dtype"),
    (lambda: JobSpec(num_keys=-1), "num_keys"),
    (lambda: JobSpec(max_samples=-5), "max_samples"),
    (lambda: JobSpec(max_seconds=0), "max_seconds"),
    (lambda: JobSpec(eval_interval=-1), "eval_interval"),
    (lambda: JobSpec(restart_servers=-1), "restart_servers"),
    (lambda: JobSpec(restart_servers=1), "restart_servers"),  # no checkpoints to restart from
    (lambda: JobSpec(server_threads=0), "server_threads"),
    (lambda: SyncSpec(""), "sync.name"),
    (lambda: SyncSpec("bsp", ["staleness"]), "sync.options"),
    (lambda: OptimizerSpec("sgd", 0.0), "optimizer.lr"),
    (lambda: OptimizerSpec("sgd", True), "optimizer.lr"),
    (lambda: TaskSpec(threads=0), "task.threads"),
    (lambda: TaskSpec(seed=-1), "task.seed"),
    (lambda: TaskSpec(schedule="random"), "task.schedule"),
    (lambda: TaskSpec(model=""), "task.model"),
    (lambda: CheckpointSpec("/c", every=0), "checkpoint.every"),
    (lambda: CheckpointSpec("/c", seconds=-1.0), "checkpoint.seconds"),
    (lambda: CheckpointSpec(""), "checkpoint.dir"),
    (lambda: ResumeSpec("/c", ""), "resume.tag"),
    (lambda: Limits(heartbeat_timeout=0), "heartbeat_timeout"),
    (lambda: Limits(coordinator_timeout=-1), "coordinator_timeout"),
    (lambda: Limits(start_timeout=math.nan), "start_timeout"),
    (lambda: Limits(heartbeat_timeout=1.0, heartbeat_interval=2.0), "heartbeat_interval"),
    (lambda: JobSpec.from_dict({"links": {"x": {"*": "1gbit"}}}), "links"),
    (lambda: JobSpec.from_dict({"links": {"w": {"*": "fast"}}}), "links"),
    (lambda: JobSpec.from_dict({"checkpoint": {"every": 2}}), "checkpoint"),
    (lambda: JobSpec.from_dict({"task": "train"}), "task"),
])
def test_each_invalid_value_is_refused_naming_its_field(make, field):
    with pytest.raises(JobSpecError) as err:
        make()
    assert repr(field) in str(err.value) or field in str(err.value)


def test_train_config_validation_names_the_field():
    # named as the command line sets them: --lr, not the job file's 'optimizer.lr'
    for kwargs, field in (({"workers": 0}, "--workers"), ({"lr": -1.0}, "--lr must"),
                          ({"epochs": 0}, "epochs"), ({"dtype": "int8"}, "--dtype"),
                          ({"restart_servers": 1}, "--restart-servers"),
                          ({"schedule": "layer"}, "--schedule must"),
                          ({"checkpoint_dir": "ck", "checkpoint_every": 0},
                           "--checkpoint-every must")):
        with pytest.raises(ValueError, match=field):
            TrainConfig(**kwargs).validate()


def test_train_config_reads_back_its_saved_form():
    cfg = TrainConfig(links=["w=100mbit;s0=1gbit,2ms"], straggler="1:3+random:0.1:2",
                      device_time="250us", sync_options={"staleness": 3})
    again = TrainConfig(**json.loads(json.dumps(cfg.as_dict())))
    assert again.as_dict() == cfg.as_dict()
    assert again.job(10, 100) == cfg.job(10, 100)


# --- one grammar for quantities -------------------------------------------------------------------
@pytest.mark.parametrize("text, bits", [("10Gbit/s", 10e9), ("100mbit", 100e6),
                                        ("1.25GB/s", 10e9), ("800Mbps", 800e6),
                                        ("500kbit/s", 500e3), ("2MBps", 16e6)])
def test_link_and_simulate_bandwidth_read_rates_alike(text, bits):
    """--link RATE and simulate --bandwidth RATE are the same grammar (core.units)."""
    assert parse_link(text).rate == pytest.approx(bits)
    assert parse_bandwidth(text) == pytest.approx(bits / 8)
    assert LinkTable.parse([f"s0={text},1ms"]).link_for("s", 0) == LinkSpec(
        parse_bitrate(text), 0.001)
    train = build_parser().parse_args(["train", "--link", text])
    sim = build_parser().parse_args(["simulate", "--bandwidth", text])
    assert flag.links(train.link).link_for("w", 0).rate == pytest.approx(
        parse_bandwidth(sim.bandwidth) * 8)


@pytest.mark.parametrize("text", ["fast", "100mbpz", "0mbit", "-1gbit", "10 apples/s"])
def test_link_and_simulate_bandwidth_refuse_alike(text):
    with pytest.raises(UnitError):
        parse_bandwidth(text)
    with pytest.raises(ValueError):
        parse_link(text)


def test_the_ps_shorthand_takes_any_case_but_the_bit_or_byte_letter():
    """10gbps and 10Gbps are ten gigabits (what a newcomer types); only b/B tells bits from
    bytes: 10GBps is ten gigabytes a second."""
    assert parse_bitrate("10gbps") == parse_bitrate("10Gbps") == parse_bitrate("10gbPS") == 1e10
    assert parse_bitrate("100mbps") == parse_bitrate("100Mbps") == 1e8
    assert parse_bitrate("10GBps") == parse_bitrate("10gBps") == 8e10
    assert parse_link("10gbps").rate == 1e10


def test_unlimited_reads_alike():
    assert parse_link("unlimited").rate is None and parse_link("inf,2ms").rate is None
    assert parse_bandwidth("unlimited") == math.inf == parse_bandwidth("inf")


def test_durations_take_units_or_plain_seconds():
    assert parse_seconds("30") == 30.0 and parse_seconds("1500ms") == 1.5
    assert parse_seconds("250us") == pytest.approx(250e-6)
    with pytest.raises(UnitError):
        parse_seconds("0", allow_zero=False)
    with pytest.raises(UnitError):
        parse_seconds("soon")
    args = build_parser().parse_args(["train", "--heartbeat-timeout", "2500ms",
                                      "--max-seconds", "90s", "--eval-interval", "0"])
    assert (args.heartbeat_timeout, args.max_seconds, args.eval_interval) == (2.5, 90.0, 0.0)


# --- each flag parsed once, at the edge -----------------------------------------------------------
def test_flags_arrive_typed_in_the_config():
    from paramserver.cli.config_args import config_from_args
    from paramserver.emulation.device_time import DeviceTime
    from paramserver.emulation.stragglers import ParsedStraggler
    args = build_parser().parse_args([
        "train", "--link", "100mbit", "--link", "w1=10mbit,5ms", "--straggler", "1:3",
        "--device-time", "2ms", "--sync-opt", "staleness=2", "--compress-opt", "fraction=0.5",
        "--optimizer-opt", "momentum=0.9", "--dataset-opt", "samples=100"])
    cfg = config_from_args(args, sync="ssp")
    assert cfg.sync == "ssp" and isinstance(cfg.links, LinkTable) and cfg.links.link_for("w", 1) == LinkSpec(10e6, 5e-3)
    assert isinstance(cfg.straggler, ParsedStraggler) and cfg.straggler == "1:3"
    assert cfg.straggler.model.factor(1, 0, 0.0) == 3
    assert isinstance(cfg.device_time, DeviceTime) and cfg.device_time.cost_per_sample == 2e-3
    assert cfg.sync_options == {"staleness": 2} and cfg.compress_options == {"fraction": 0.5}
    assert cfg.optimizer_options == {"momentum": 0.9} and cfg.dataset_options == {"samples": 100}
    job = cfg.to_job(10, 100)
    assert job["links"] == {"w": {"*": "100mbit", "1": "10mbit,5ms"}, "s": {}}
    assert job["task"]["straggler"] == "1:3" and job["task"]["device_time"] == "2ms"


@pytest.mark.parametrize("argv", [
    ["train", "--workers", "2:5", "--servers", "1:3"],
    ["launch", "--workers", "2:5", "--servers", "1:3", "--", "python", "x.py"],
    ["serve", "--workers", "5", "--servers", "3", "--num-keys", "10"],
])
def test_every_command_reads_its_flags_into_the_config_one_way(argv):
    """train, launch and serve read flags through one function: each flag a command offers
    whose dest is a TrainConfig field reaches that field, the spelled-otherwise ones their
    fields, and a field no flag of the command sets keeps TrainConfig's default."""
    from paramserver.cli.config_args import SPELLED, config_from_args
    from paramserver.spec.config import TrainConfig
    shared = ["--lr", "0.07", "--batch-size", "24", "--steps", "9", "--max-seconds", "70",
              "--optimizer", "momentum", "--optimizer-opt", "momentum=0.8", "--sync", "ssp",
              "--sync-opt", "staleness=4", "--replicas", "2"]
    args = build_parser().parse_args(argv[:1] + shared + argv[1:])
    cfg = config_from_args(args)
    assert (cfg.lr, cfg.batch_size, cfg.steps, cfg.max_seconds) == (0.07, 24, 9, 70.0)
    assert (cfg.optimizer, cfg.optimizer_options) == ("momentum", {"momentum": 0.8})
    assert (cfg.sync, cfg.sync_options, cfg.replicas) == ("ssp", {"staleness": 4}, 2)
    assert (cfg.workers, cfg.servers) == (5, 3 if argv[0] == "serve" else 1)
    assert cfg.min_workers == (2 if argv[0] != "serve" else 0)
    offered = {a.dest for a in build_parser()._subparsers._group_actions[0].choices[
        argv[0]]._actions}
    default = TrainConfig()
    for name in TrainConfig.__dataclass_fields__:
        if name not in offered and SPELLED.get(name, (name,))[0] not in offered:
            assert getattr(cfg, name) == getattr(default, name), name


def test_compares_per_policy_options_reach_each_policys_runs():
    """compare's --sync-opt is POLICY.KEY=VALUE (a value may hold commas): each policy's runs
    get their own, none other's, and the base config the plan starts from reads none."""
    from paramserver.cli.compare_cmd import policy_sync_options
    from paramserver.cli.config_args import config_from_args
    args = build_parser().parse_args([
        "compare", "--sync", "ssp,auto", "--sync-opt", "auto.candidates=lbbsp,bsp,ssp,asp",
        "--sync-opt", "ssp.staleness=2"])
    base = config_from_args(args, sync="bsp", sync_options={})
    assert (base.sync, base.sync_options) == ("bsp", {})
    assert policy_sync_options(args.sync_opt) == {
        "auto": {"candidates": "lbbsp,bsp,ssp,asp"}, "ssp": {"staleness": 2}}


@pytest.mark.parametrize("argv, flag_name", [
    (["train", "--link", "10furlongs"], "--link"),
    (["train", "--straggler", "1:x"], "--straggler"),
    (["train", "--device-time", "2"], "--device-time"),
    (["train", "--sync-opt", "staleness"], "--sync-opt"),
    (["train", "--heartbeat-timeout", "soon"], "--heartbeat-timeout"),
    (["simulate", "--bandwidth", "fast"], "--bandwidth"),
    (["simulate", "--latency", "2"], "--latency"),
    (["simulate", "--param-bytes", "3 apples"], "--param-bytes"),
    (["compare", "--sync-opt", "staleness=2"], "--sync-opt"),
    (["compare", "--compress-variant", ":fraction=0.1"], "--compress-variant"),
])
def test_a_bad_flag_value_fails_naming_the_flag(argv, flag_name, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag_name}" in err and "invalid" not in err.split(flag_name, 1)[1][:12]


def test_option_values_keep_their_types():
    assert flag.option("k=3") == ("k", 3) and flag.option("k=0.5") == ("k", 0.5)
    assert flag.option("k=true") == ("k", True) and flag.option("k=null") == ("k", None)
    assert flag.option("k=ema") == ("k", "ema") and flag.option("k=1e-3") == ("k", 1e-3)
    with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
        flag.option("=3")


# --- the welcomes' slices (spec/welcome.py) -------------------------------------------------------
from paramserver.spec.welcome import ServerJob, ShardAddress, ShardRestore, WorkerJob  # noqa: E402


def server_job(restore=None) -> ServerJob:
    return ServerJob.of(full_spec(), 10, 250, "round", restore)


def worker_job() -> WorkerJob:
    return WorkerJob.of(full_spec(), 1000, [[0, "tcp://h:1", 0, 500], [1, "tcp://h:2", 500, 1000]],
                        "arrival", "ssp", 96)


@pytest.mark.parametrize("restore", [None, ShardRestore("/ck", "t3", 7),
                                     ShardRestore("/ck", "t4", 9, restart=True)])
def test_a_server_job_round_trips_through_its_wire_form(restore):
    job = server_job(restore)
    wire = json.loads(json.dumps(job.to_dict()))  # what msgpack carries: lists, not tuples
    assert ServerJob.from_dict(wire) == job
    assert wire["shard_range"] == [10, 250] and wire["optimizer"]["options"] == {"momentum": 0.9}
    assert job.heartbeat_interval == 0.5 and job.coordinator_timeout == 20.0
    if restore is not None and not restore.restart:
        assert "restart" not in wire["restore"]  # a resume's restore reads as it always has


def test_a_worker_job_round_trips_and_carries_the_whole_job():
    job = worker_job()
    wire = json.loads(json.dumps(job.to_dict()))
    assert WorkerJob.from_dict(wire) == job
    assert wire["sync"] == "ssp" and wire["shards"][1] == [1, "tcp://h:2", 500, 1000]
    assert (wire["apply_mode"], wire["resume_samples"], wire["num_keys"]) == ("arrival", 96, 1000)
    # the job file's fields, less the policy's options (the coordinator's business)
    spec = full_spec()
    assert job.job == dataclasses.replace(spec, sync=SyncSpec("ssp"))
    assert job.shards[0] == ShardAddress(0, "tcp://h:1", 0, 500)


@pytest.mark.parametrize("make, where", [(lambda: server_job().to_dict(), ()),
                                         (lambda: worker_job().to_dict(), ()),
                                         (lambda: worker_job().to_dict(), ("task",)),
                                         (lambda: server_job(ShardRestore("/c", "t")).to_dict(),
                                          ("restore",))])
def test_an_unknown_welcome_field_is_refused_by_name(make, where):
    d = make()
    inner = d
    for key in where:
        inner = inner[key]
    inner["colour"] = "red"
    parse = WorkerJob.from_dict if "shards" in d else ServerJob.from_dict
    with pytest.raises(JobSpecError, match="colour"):
        parse(d)


@pytest.mark.parametrize("parse, make, missing", [
    (ServerJob.from_dict, lambda: server_job().to_dict(), "server_threads"),
    (ServerJob.from_dict, lambda: server_job().to_dict(), "shard_range"),
    (WorkerJob.from_dict, lambda: worker_job().to_dict(), "shards"),
    (WorkerJob.from_dict, lambda: worker_job().to_dict(), "resume_samples"),
])
def test_a_missing_welcome_field_is_refused_by_name(parse, make, missing):
    d = make()
    del d[missing]
    with pytest.raises(JobSpecError, match=missing):
        parse(d)


def test_bad_welcome_values_are_refused_by_name():
    with pytest.raises(JobSpecError, match="apply_mode"):
        ServerJob.from_dict({**server_job().to_dict(), "apply_mode": "sometimes"})
    with pytest.raises(JobSpecError, match="shard_range"):
        ServerJob.from_dict({**server_job().to_dict(), "shard_range": [5, 1]})
    with pytest.raises(JobSpecError, match="version"):
        WorkerJob.from_dict({**worker_job().to_dict(), "version": 9})
    with pytest.raises(JobSpecError, match="shards"):
        WorkerJob.from_dict({**worker_job().to_dict(), "shards": [[0, "tcp://h:1"]]})


def test_a_worker_job_from_a_job_file_without_a_version_reads_as_version_1():
    d = worker_job().to_dict()
    del d["version"]
    d.update(d.pop("limits"))  # as version 1 wrote it: the limits at the top level
    assert WorkerJob.from_dict(d) == worker_job()


def test_task_options_for_tasks_of_their_own_and_the_ab_knobs_are_typed():
    t = TaskSpec(name="demo", options={"steps": 5}, model_options={"hidden": 8},
                 pull_ahead=False, borrow=False)
    assert JobSpec.from_dict(JobSpec(task=t).to_dict()).task == t
    with pytest.raises(JobSpecError, match="task.pull_ahead"):
        TaskSpec(pull_ahead="no")


def test_a_hand_written_job_without_eval_interval_has_no_evaluator():
    job = JobSpec.from_dict({"num_keys": 10, "workers": 2, "sync": {"name": "asp"}})
    assert job.eval_interval == 0.0 and JobSpec().eval_interval == 1.0
    assert job.task == TaskSpec(name="demo")  # `paramserver worker` runs the demo task
    assert JobSpec.from_dict(JobSpec().to_dict()) == JobSpec()
