"""The names the help texts list, without importing what registers them (torch, numpy).

`--help` must answer at once, so the parsers are built from these tuples; the registries stay
the truth, and tests/spec/test_cli_help.py checks that each tuple here equals its registry.
"""

SYNC_POLICIES = ("bsp", "asp", "ssp", "ebsp", "r2sp", "lbbsp", "dssp", "auto")
MODELS = ("mlp", "cnn", "logreg", "dlrm", "wide")
DATASETS = ("digits", "mnist", "synthetic", "clicks")
COMPRESSORS = ("none", "topk", "std", "dynamic")
CODECS = ("fp32", "fp16", "fp16-scaled", "bf16", "uniform8", "quantile8", "sign", "randomk",
          "powersgd", "mixed")
UPDATE_RULES = ("sgd", "momentum", "consgd", "dynsgd", "staleness-aware", "adagrad-global",
                "direction-distance", "adam", "adamw", "adagrad", "rmsprop", "adamax",
                "torch-sgd")
PREDICTORS = ("last_interval", "ema", "median")
ZIPLINE_VARIANTS = ("zipline-vec", "zipline", "zipline-opt", "zipline-opt-bs", "heap")
ZIPLINE_DEFAULT = "zipline-vec"
KEY_ROLES = ("coordinator", "server", "worker", "observer")  # transport.security.ROLES


# policies/auto.py AutoOptions' defaults; tests/spec/test_cli_help.py checks they are the same.
AUTO_HELP = ("auto switches among lbbsp, bsp, ssp and asp while the job runs, as the stragglers "
             "change (--sync-opt candidates=..., interval=S, margin=F); its lockstep rounds "
             "equal the fixed policies' under plain sgd")


def listed(names) -> str:
    return ", ".join(names)


# compression/ranges.py HELP (that package imports torch); the test checks they are the same.
PUSH_RANGE_HELP = ("keys pushed and pulled per step: all (default), window:F (a rotating window "
                   "of a fraction F of the keys, e.g. window:0.25), layers[:K] (K whole layers "
                   "at a time, rotating); held-back gradients accumulate and go out with their "
                   "window")
