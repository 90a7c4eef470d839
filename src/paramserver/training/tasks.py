"""What a worker process does once connected: a registry of task names -> 'module:function'."""

from __future__ import annotations

import importlib
from typing import Callable

from paramserver.core.registry import Registry

# Tasks are imported lazily so that a worker only loads what its task needs (torch is heavy).
TASKS: Registry[str] = Registry("worker task")
TASKS.register("demo")("paramserver.training.demo_task:run")
TASKS.register("train")("paramserver.training.train_task:run")


def load_task(name: str) -> Callable:
    module, func = TASKS.get(name).split(":")
    return getattr(importlib.import_module(module), func)
