"""paramserver: a parameter server for data-parallel deep learning with straggler-aware sync models."""

__version__ = "0.1.0"
