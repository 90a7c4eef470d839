"""Every feature on a device: codecs and pruners where the gradient lives, gradients changed
after backward, mixed precision, and the GPU acceptance command (benchmarks/gpu_check.py).

The device paths are torch ops on whatever device the tensor is on, so CI checks them on cpu
tensors against the host path, bit for bit; the tests marked `cuda` check the same on a GPU
and skip without one.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from paramserver.client.device_staging import DeviceStaging
from paramserver.models.flat_binding import bind_to_flat
from paramserver.compression import CODECS, make_codec, make_compressor
from paramserver.models import ModelKeys
from paramserver.training.core.amp import MixedPrecision

ROOT = Path(__file__).resolve().parents[2]
cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="needs CUDA: encoding on a GPU against the host")


def vectors():
    """Gradients a codec meets: plain, a size no block divides, tiny, huge, zeros, empty."""
    gen = torch.Generator().manual_seed(3)
    plain = torch.randn(4099, generator=gen) * 1e-2
    tiny = torch.randn(300, generator=gen) * 1e-40  # float32 subnormals
    huge = torch.randn(300, generator=gen) * 3e37  # scaled fp16's wide unscale
    mixed = torch.cat([plain[:500], tiny[:50], plain[500:700] * 1e5])
    return {"plain": plain, "tiny": tiny, "huge": huge, "mixed": mixed,
            "zeros": torch.zeros(513), "empty": torch.zeros(0)}


def codec_pair(name):
    """Two codecs alike (stateful ones start from the same state)."""
    if name == "mixed":
        return (make_codec(name).dense_runs([(0, 40), (100, 130)]),
                make_codec(name).dense_runs([(0, 40), (100, 130)]))
    return make_codec(name), make_codec(name)


def assert_same_payload(a, b):
    assert (a.codec, a.size, tuple(a.meta)) == (b.codec, b.size, tuple(b.meta))
    assert len(a.frames) == len(b.frames)
    for fa, fb in zip(a.frames, b.frames):
        assert fa.dtype == fb.dtype
        np.testing.assert_array_equal(fa, fb)


@pytest.mark.parametrize("name", CODECS.names())
def test_a_tensor_is_encoded_as_numpy_is_and_decodes_where_it_lives(name):
    """encode_decoded(tensor) (the device path: torch ops where the values are) gives the
    host path's payload, and the values it hands back for error feedback are exactly what
    the receiver's decode() makes of that payload."""
    for label, x in vectors().items():
        if name in ("powersgd",) and x.numel() == 0:
            continue
        host, dev = codec_pair(name)
        want = host.encode(x.numpy().copy())
        got, decoded = dev.encode_decoded(x.clone())
        assert isinstance(decoded, torch.Tensor), label
        assert_same_payload(got, want)
        np.testing.assert_array_equal(decoded.numpy(), host.decode(want, x.numel()),
                                      err_msg=f"{name} on {label}")


def test_numpy_in_numpy_out_and_a_device_native_codec_says_so():
    codec = make_codec("bf16")
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    enc, decoded = codec.encode_decoded(x)
    assert isinstance(decoded, np.ndarray)
    np.testing.assert_array_equal(decoded, codec.decode(enc, x.size))
    native = {n for n in CODECS.names() if CODECS.get(n).device_native}
    assert {"fp32", "fp16", "fp16-scaled", "bf16", "uniform8"} <= native
    assert "quantile8" not in native  # its levels come from a host sort: encoded on the host


@cuda
@pytest.mark.parametrize("name", CODECS.names())
def test_on_cuda_the_payload_and_decoded_values_match_the_host(name):
    x = vectors()["mixed"]
    host, dev = codec_pair(name)
    want = host.encode(x.numpy().copy())
    got, decoded = dev.encode_decoded(x.cuda())
    assert decoded.is_cuda
    np.testing.assert_array_equal(decoded.cpu().numpy(), host.decode(got, x.numel()))
    if CODECS.get(name).device_native and name != "uniform8":
        assert_same_payload(got, want)  # elementwise casts round alike on both


@cuda
@pytest.mark.parametrize("method", ["exact", "sampled"])
def test_on_cuda_topk_picks_the_same_entries_and_keeps_its_residual_there(method):
    """Top-k's selection is exact on every device (its sample drawn on the host generator),
    so the entries chosen on the GPU are the host's, and the residual stays on the GPU."""
    x = vectors()["plain"]
    on_cpu = make_compressor("topk", fraction=0.05, method=method)
    on_gpu = make_compressor("topk", fraction=0.05, method=method)
    for step in range(3):
        g = x * (step + 1)
        a, b = on_cpu.compress(g.clone()), on_gpu.compress(g.cuda())
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.values, b.values)
    assert on_gpu.residual.is_cuda


def test_kept_extra_goes_back_to_the_residual_where_it_lives():
    """A pruner's residual on the values' device takes back what the wire's per-shard
    re-encoding kept, though the keys and values come back from the host as numpy."""
    comp = make_compressor("topk", fraction=0.5, codec=make_codec("bf16"))
    g = torch.tensor([1.0, -3.0, 0.5, 2.0])
    sparse = comp.compress(g)
    before = comp.residual.clone()
    comp.kept(sparse.keys, np.full(sparse.keys.size, 0.25, np.float32))
    assert torch.equal(comp.residual[torch.from_numpy(sparse.keys)],
                       before[torch.from_numpy(sparse.keys)] + 0.25)


def staged(model):
    keys = ModelKeys(model)
    staging = DeviceStaging(model, keys, stage=True)
    bind_to_flat(model, keys, staging.params, staging.grads)
    staging.watch(model)
    return keys, staging


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def test_a_gradient_clipped_after_backward_is_what_goes_to_the_host():
    """The hooks copy each layer as backward finishes it; clip_grad_norm_ then scales the
    device gradient in place. The copy that goes out is the clipped one (the buffer's version
    counter moved after the hooks' copies)."""
    model = mlp()
    keys, staging = staged(model)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    staging.grads.zero_()
    staging.grads_zeroed()
    (model(x).pow(2).sum() * 50).backward()
    assert staging.copied, "the hooks copied layers during backward"
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    host = torch.from_numpy(staging.grads_to_host().copy())
    assert torch.equal(host, staging.grads)
    assert float(host.norm()) == pytest.approx(0.1, rel=1e-4)


def test_a_grad_scaler_unscale_is_missed_unless_announced():
    """torch's unscale moves no version counter: the staging alone would push the scaled
    gradient. grads_replaced() (what MixedPrecision and DistributedOptimizer.param_groups
    call) makes the whole gradient go again."""
    for announce in (False, True):
        model = mlp()
        keys, staging = staged(model)
        amp = MixedPrecision("fp16", torch.device("cpu"), model.parameters())
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
        staging.grads.zero_()
        staging.grads_zeroed()
        with amp.autocast():
            loss = model(x).float().pow(2).mean()
        amp.backward(loss)
        assert amp.finish()
        if announce:
            staging.grads_replaced()
        host = torch.from_numpy(staging.grads_to_host().copy())
        assert torch.equal(host, staging.grads) == announce


def test_mixed_precision_overflow_says_so_and_lowers_the_scale():
    model = mlp()
    amp = MixedPrecision("fp16", torch.device("cpu"), model.parameters())
    x = torch.full((4, 8), 6e4)
    with amp.autocast():
        loss = model(x).float().pow(2).sum()
    amp.backward(loss)
    scale = amp.scaler.get_scale()
    assert amp.finish() is False
    assert amp.fields()["amp_scale"] < scale
    with pytest.raises(ValueError, match="amp must be off, bf16 or fp16"):
        MixedPrecision("fp8", torch.device("cpu"), model.parameters())


def test_a_push_from_the_device_keeps_sent_where_the_values_are(tmp_path):
    """KVWorker.push_async with a codec takes a tensor (encoded where it lives) and refuses a
    `sent` held elsewhere, naming the rule."""
    from ps_helpers import make_job, running_job

    from paramserver.client.kv import KVWorker
    with running_job(tmp_path, make_job(64, 1, 1, dtype="float32")) as cluster:
        kv = KVWorker(cluster.address)
        try:
            push_from_a_tensor(kv)
        finally:
            kv.close()


def push_from_a_tensor(kv):
    kv.init(np.zeros(64, np.float32))
    kv.start()
    values = torch.linspace(-1, 1, 64)
    with pytest.raises(ValueError, match="held as the values are"):
        kv.push_async(values, step=0, batch=1, codec=make_codec("bf16"),
                      sent=np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="1-D float32 tensor"):
        kv.push_async(values.double(), step=0, batch=1, codec=make_codec("bf16"))
    sent = torch.empty(64)
    kv.wait(kv.push_async(values, step=0, batch=1, codec=make_codec("bf16"), sent=sent))
    assert torch.equal(sent, values.to(torch.bfloat16).float())
    # the server applied what the worker says it sent (SGD, lr 1, from zeros)
    np.testing.assert_array_equal(kv.pull(), -sent.numpy())


def gpu_check(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # .ci/run runs gpu_check.py with the staging forced, after the suite
def test_the_gpu_check_passes_with_staging_forced_on_the_cpu(tmp_path):
    """The fast twin of the full check (test_the_whole_gpu_check_passes_here): one row, the
    built-in task with bf16 encoded where the gradient lives, bit for bit against the plain
    cpu path. (GradScaler and clipping on a staged model: the unit tests above.)"""
    proc = gpu_check("--device", "cpu", "--no-overhead", "--only", "bf16",
                     "--out", str(tmp_path / "check"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "all rows pass" in proc.stdout
    import json
    results = json.loads((tmp_path / "check" / "results.json").read_text())
    rows = {r["row"]: r for r in results["rows"]}
    assert rows["bf16"]["rel"] == 0.0
    assert rows["bf16"]["dev"]["d2h_bytes"] * 2 == rows["bf16"]["dense_bytes"]


@pytest.mark.slow
def test_the_whole_gpu_check_passes_here():
    """Every row and the ResNet-18 overhead, on this machine's device (cuda when there is
    one, the staging forced on the CPU otherwise)."""
    proc = gpu_check(timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_fp16_with_per_layer_pushes_is_refused_naming_the_way_out(capsys, tmp_path):
    """fp16's gradient is unscaled after backward, and per-layer requests push during it: the
    pushes would carry the scaled gradient. Refused before any process starts."""
    from paramserver.cli.main import main
    rc = main(["train", "--amp", "fp16", "--schedule", "fifo", "--steps", "1", "--quiet",
               "--out", str(tmp_path / "run")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--amp fp16 cannot be combined with --schedule" in err and "--amp bf16" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
