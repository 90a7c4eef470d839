"""Speed predictors by name (`--speed-predictor`): the torch-backed NARX loads only when asked."""

from __future__ import annotations

from paramserver.predict.speed import EMASpeed, LastSpeed, MedianSpeed, SpeedPredictor


def make_speed_predictor(name: str, **options) -> SpeedPredictor:
    """Build the predictor called `name` (last, ema, median, narx); unknown names list the known."""
    if name == "narx":
        from paramserver.predict.narx import NARXSpeed  # torch is heavy: load it only when asked

        return NARXSpeed(**options)
    try:
        cls = {"last": LastSpeed, "ema": EMASpeed, "median": MedianSpeed}[name]
    except KeyError:
        raise ValueError(f"unknown speed predictor {name!r}; known: "
                         f"{', '.join(SPEED_PREDICTORS)}") from None
    return cls(**options)


SPEED_PREDICTORS = ("last", "ema", "median", "narx")
