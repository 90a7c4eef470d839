"""The networks workers train: the seeds' MNIST MLP, a small CNN, logistic regression, and a
wide MLP sized by its parameter count for the dense-at-scale work (`--model-size`)."""

from __future__ import annotations

import math

from torch import nn


def _flat_size(input_shape: tuple[int, ...]) -> int:
    return math.prod(input_shape)


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 512,
        layers: int = 3) -> nn.Sequential:
    """The seeds' model: `layers` dense layers of `hidden` units with ReLU, then the output layer."""
    if int(layers) < 1 or int(hidden) < 1:
        raise ValueError(f"mlp needs layers >= 1 and hidden >= 1, got {layers=}, {hidden=}")
    blocks: list[nn.Module] = [nn.Flatten()]
    width = _flat_size(input_shape)
    for _ in range(int(layers)):
        blocks += [nn.Linear(width, int(hidden)), nn.ReLU()]
        width = int(hidden)
    blocks.append(nn.Linear(width, num_classes))
    return nn.Sequential(*blocks)


def cnn(input_shape: tuple[int, ...], num_classes: int, channels: int = 16,
        hidden: int = 128) -> nn.Sequential:
    """Two conv3x3+ReLU+maxpool2 blocks (channels, 2*channels), a dense layer, the output layer.

    Padding keeps sizes even through both pools, so 28x28 MNIST and 8x8 digits both work.
    """
    if len(input_shape) != 3:
        raise ValueError(f"cnn needs image samples shaped (C, H, W), got {tuple(input_shape)}; "
                         f"use mlp or logreg for feature vectors")
    c, h, w = input_shape
    if h < 4 or w < 4:
        raise ValueError(f"cnn needs images of at least 4x4, got {h}x{w}")
    c1, c2 = int(channels), 2 * int(channels)
    return nn.Sequential(
        nn.Conv2d(c, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * (h // 4) * (w // 4), int(hidden)), nn.ReLU(),
        nn.Linear(int(hidden), num_classes),
    )


def logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    """Multinomial logistic regression: one dense layer on the flattened input."""
    return nn.Sequential(nn.Flatten(), nn.Linear(_flat_size(input_shape), num_classes))


def wide_width(size: int, inputs: int, num_classes: int, layers: int) -> int:
    """The hidden width H at which `wide` has about `size` parameters: inputs*H + H (the first
    layer), layers*(H*H + H), H*num_classes + num_classes (the output) add up to `size`."""
    a, b, c = layers, inputs + 1 + layers + num_classes, num_classes - size
    if a == 0:
        return max(1, round(-c / b))
    return max(1, round((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)))


def wide(input_shape: tuple[int, ...], num_classes: int, size: int = 10_000_000,
         layers: int = 8) -> nn.Sequential:
    """A wide MLP of about `size` parameters (within 1% from 1e5 on): an input layer to width
    H, `layers` square H x H layers with ReLU, the output layer; H is picked from `size`.

    The parameters sit in `layers` equal blocks, so shards cut by bytes fall on layer edges
    when the shard count divides `layers` (8 by default: 1, 2, 4 or 8 shards), and no one
    tensor is a large part of the model (a worker binds the model to its flat buffer one
    tensor at a time, so its peak is the parameters plus one layer)."""
    size, layers = int(size), int(layers)
    if size < 1 or layers < 0:
        raise ValueError(f"wide needs size >= 1 and layers >= 0, got {size=}, {layers=}")
    inputs = _flat_size(input_shape)
    h = wide_width(size, inputs, num_classes, layers)
    blocks: list[nn.Module] = [nn.Flatten(), nn.Linear(inputs, h), nn.ReLU()]
    for _ in range(layers):
        blocks += [nn.Linear(h, h), nn.ReLU()]
    blocks.append(nn.Linear(h, num_classes))
    return nn.Sequential(*blocks)


def wide_params(input_shape: tuple[int, ...], num_classes: int, size: int,
                layers: int = 8) -> int:
    """The exact parameter count `wide` builds for `size` (no tensor allocated)."""
    inputs = _flat_size(input_shape)
    h = wide_width(int(size), inputs, num_classes, int(layers))
    return inputs * h + h + int(layers) * (h * h + h) + h * num_classes + num_classes
