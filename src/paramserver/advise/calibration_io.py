"""Reads the calibration shipped as package data; beside the pure convergence model, which
gets the parsed JSON and never opens a file itself."""

from __future__ import annotations

import json
from importlib import resources

DEFAULT_NAME = "default_calibration.json"


def read_default() -> dict:
    text = resources.files("paramserver.advise").joinpath("data", DEFAULT_NAME).read_text(
        encoding="utf-8")
    return json.loads(text)


def read_calibration(path) -> dict:
    """A calibration.json (or a bare convergence model) as the parsed JSON."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e})") from None
