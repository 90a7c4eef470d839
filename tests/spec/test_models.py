"""Models: registry, output shapes on digits/MNIST/vector inputs, seeded init, the seeds' MLP."""

import pytest
import torch
from torch import nn

from paramserver.models import MODELS, build_model
from paramserver.core.registry import UnknownNameError

SHAPES = [(1, 8, 8), (1, 28, 28), (20,)]


@pytest.mark.parametrize("name", ["mlp", "cnn", "logreg"])
@pytest.mark.parametrize("shape", SHAPES)
def test_output_shape(name, shape):
    if name == "cnn" and len(shape) != 3:
        with pytest.raises(ValueError, match="cnn needs image samples"):
            build_model(name, shape, 10)
        return
    model = build_model(name, shape, num_classes=7, seed=0)
    out = model(torch.randn(5, *shape))
    assert out.shape == (5, 7) and out.dtype == torch.float32


@pytest.mark.parametrize("name", ["mlp", "cnn", "logreg"])
def test_same_seed_same_weights_and_global_rng_untouched(name):
    torch.manual_seed(42)
    before = torch.rand(1)
    torch.manual_seed(42)
    a = build_model(name, (1, 8, 8), 10, seed=3)
    assert torch.equal(torch.rand(1), before)  # building did not consume the global stream
    b = build_model(name, (1, 8, 8), 10, seed=3)
    c = build_model(name, (1, 8, 8), 10, seed=4)
    pa, pb, pc = (list(m.parameters()) for m in (a, b, c))
    assert all(torch.equal(x, y) for x, y in zip(pa, pb))
    assert not all(torch.equal(x, y) for x, y in zip(pa, pc))


def test_mlp_is_three_dense_layers_of_512_then_output():
    model = build_model("mlp", (1, 28, 28), 10)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(l.in_features, l.out_features) for l in linears] == \
           [(784, 512), (512, 512), (512, 512), (512, 10)]
    assert sum(isinstance(m, nn.ReLU) for m in model.modules()) == 3
    assert sum(p.numel() for p in model.parameters()) == 932_362


def test_options_dtype_and_errors():
    small = build_model("mlp", (4,), 3, hidden=8, layers=1)
    assert [p.shape[0] for p in small.parameters()] == [8, 8, 3, 3]
    assert build_model("logreg", (4,), 3, dtype=torch.float64)(
        torch.randn(2, 4, dtype=torch.float64)).dtype == torch.float64
    with pytest.raises(ValueError, match="no option.*width.*its options: hidden, layers"):
        build_model("mlp", (4,), 3, width=3)
    with pytest.raises(UnknownNameError, match="mlp, cnn, logreg"):
        build_model("resnet", (4,), 3)
    assert MODELS.names() == ["mlp", "cnn", "logreg", "dlrm", "wide"]
