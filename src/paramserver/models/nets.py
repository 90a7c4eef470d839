"""The networks workers train: the seeds' MNIST MLP, a small CNN and logistic regression."""

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
