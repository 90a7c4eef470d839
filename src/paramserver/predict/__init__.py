"""Predictors used by the sync policies (pure numpy, no I/O, no clock reads).

push_times: each worker's recorded push times -> an n x R matrix of its next R predicted push
times, the input of the ZipLine search. `last_interval` is the published ElasticBSP rule;
`ema` and `median` smooth out jitter in the intervals.
"""

from paramserver.predict.push_times import (
    PREDICTORS,
    PredictInputError,
    ema,
    get_predictor,
    last_interval,
    median,
)

__all__ = ["PREDICTORS", "PredictInputError", "ema", "get_predictor", "last_interval", "median"]
