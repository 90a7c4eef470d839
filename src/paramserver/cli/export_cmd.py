"""`paramserver export RUN_OR_CHECKPOINT`: the trained parameters as a model file to take home."""

from __future__ import annotations

import sys
from pathlib import Path

from paramserver.cli import args as flag

SUMMARY = {"export": "write a run's trained parameters as a model file (safetensors or pt)"}


def _run(args) -> int:
    from paramserver.runlog.model_file import ExportError, export
    out = Path(args.out or Path(args.source) / f"export.{args.format}")
    try:
        path, what = export(args.source, out, args.format)
    except ExportError as exc:
        print(f"paramserver export: {exc}", file=sys.stderr)
        return 2
    print(f"{path}  (from {what})")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "export", help=SUMMARY["export"],
        description="Write the trained parameters of a run under the model's own parameter "
                    "names (as model.named_parameters() gives them), loadable with "
                    "model.load_state_dict(). RUN_OR_CHECKPOINT is a run folder of `train` or "
                    "`launch` (its final model.pt when the job ended, else its newest usable "
                    "checkpoint), a checkpoint folder (newest usable one) or one ckpt-TAG "
                    "folder of a run. A launch run's parameter names are those of the "
                    "script's model, from the model_layout.json its coordinator wrote. A "
                    "model with a sparse table (dlrm) keeps its rows on the servers: they come "
                    "from a checkpoint, as TABLE.keys (int64, in key order) and TABLE.rows "
                    "beside the dense names (load_state_dict(..., strict=False) takes the "
                    "dense part).")
    p.add_argument("source", metavar="RUN_OR_CHECKPOINT")
    p.add_argument("--format", choices=("safetensors", "pt"), default="safetensors",
                   help="safetensors (default; needs `pip install paramserver[safetensors]`) "
                        "or pt (a torch state dict, torch.load(..., weights_only=True))")
    p.add_argument("--out", metavar="FILE", type=flag.out_file,
                   help="the file to write (default: RUN_OR_CHECKPOINT/export.FORMAT)")
    p.set_defaults(func=_run)
