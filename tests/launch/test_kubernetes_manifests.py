"""examples/kubernetes/paramserver.yaml as a user applies it (issue 36): every object valid
against the Kubernetes API schemas of two versions (kubernetes-validate, offline, strict: an
unknown field fails), every container's command parsed by paramserver's own parser, and the
objects agreeing with each other (selectors, the servers' headless Service and stable names,
the key files `paramserver keys generate` writes). No cluster runs here: a kind or minikube
cluster needs images and a container runtime this machine cannot fetch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import kubernetes_validate

from paramserver.core.exits import Exit, retryable

MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "paramserver.yaml"
VERSIONS = ("1.36.0", "1.37.0")


def objects() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def by_kind(kind: str) -> list[dict]:
    return [o for o in objects() if o["kind"] == kind]


def named(kind: str, name: str) -> dict:
    (obj,) = [o for o in by_kind(kind) if o["metadata"]["name"] == name]
    return obj


def pod_specs() -> list[tuple[str, dict]]:
    out = []
    for o in objects():
        if o["kind"] == "Pod":
            out.append((o["metadata"]["name"], o["spec"]))
        elif o["kind"] in ("Job", "StatefulSet"):
            out.append((o["metadata"]["name"], o["spec"]["template"]["spec"]))
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_valid_for_the_api(version):
    docs = objects()
    assert {o["kind"] for o in docs} == {"Service", "Pod", "Job"}
    for obj in docs:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_validator_catches_a_broken_object(version):
    """The check can fail: a misspelt field and a wrong type are refused."""
    job = named("Job", "paramserver-workers")
    bad = {**job, "spec": {**job["spec"], "paralelism": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)
    bad = {**job, "spec": {**job["spec"], "completions": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


def test_every_command_parses_with_paramservers_own_parser():
    from paramserver.cli.main import COMMANDS, build_parser
    env = {"POD_IP": "10.0.0.7", "JOB_COMPLETION_INDEX": "0"}
    seen = set()
    for _, spec in pod_specs():
        for c in spec["containers"]:
            argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], str(a)) for a in c["command"]]
            assert argv[0] == "paramserver"
            args = build_parser((COMMANDS[argv[1]],)).parse_args(argv[1:])
            seen.add(args.command)
            assert args.keys == "/etc/paramserver/keys"  # CURVE on every connection
    assert seen == {"coordinator", "server", "worker"}


def test_the_objects_agree_with_each_other():
    coordinator = named("Pod", "paramserver-coordinator")
    service = named("Service", "paramserver-coordinator")
    assert service["spec"]["selector"].items() <= coordinator["metadata"]["labels"].items()
    port = service["spec"]["ports"][0]["targetPort"]
    assert str(port) in coordinator["spec"]["containers"][0]["command"]
    # The servers: a headless Service gives each pod of the Indexed Job a stable name, which
    # it advertises.
    servers, headless = named("Job", "paramserver-server"), named("Service", "paramserver-server")
    assert headless["spec"]["clusterIP"] == "None"
    template = servers["spec"]["template"]
    assert template["spec"]["subdomain"] == headless["metadata"]["name"]
    assert headless["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    command = template["spec"]["containers"][0]["command"]
    assert command[command.index("--advertise") + 1] == \
        "paramserver-server-$(JOB_COMPLETION_INDEX).paramserver-server"
    for job in by_kind("Job"):
        spec = job["spec"]
        assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
        rules = spec["podFailurePolicy"]["rules"]
        container = spec["template"]["spec"]["containers"][0]["name"]
        acts = {code: rule["action"] for rule in rules if "onExitCodes" in rule
                for code in rule["onExitCodes"]["values"]
                if rule["onExitCodes"]["containerName"] == container}
        # The exit table's permanent codes fail the Job, a drain is no failure, and the
        # retryable ones are left to count against backoffLimit (Count, the default).
        assert {c for c, a in acts.items() if a == "FailJob"} == \
            {int(c) for c in Exit if not retryable(c) and c != Exit.FINISHED}
        assert acts.get(Exit.PREEMPTED) == "Ignore" and Exit.PEER_LOST not in acts


def test_each_pod_mounts_the_keys_its_role_needs(tmp_path):
    from paramserver.transport import security
    security.generate(tmp_path / "keys")  # what `paramserver keys generate` writes
    written = {p.name for p in (tmp_path / "keys").rglob("*") if p.is_file()}
    for _, spec in pod_specs():
        role = spec["containers"][0]["command"][1]
        (keys,) = [v for v in spec["volumes"] if v["name"] == "keys"]
        items = keys["secret"]["items"]
        assert {i["key"] for i in items} <= written  # what `keys generate` writes
        secrets = [i["path"] for i in items if i["path"].startswith("private/")]
        assert secrets == [f"private/{role}.key_secret"]  # its own secret, no other
        assert keys["secret"]["defaultMode"] == 0o400
