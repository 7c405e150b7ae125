#!/usr/bin/env python3
"""A checkpoint's loss on a split twice: in eval mode (what fairseq's validation reports) and with
dropout on (the mode the training loss is measured in), on the same batches.

A large gap says the model's outputs depend on dropout being active, so a rising validation loss
need not mean that training diverged. Both numbers are fairseq's: the criterion's summed loss over
the split divided by the summed sample size, in base 2 (as fairseq logs it).

    python scripts/valid_loss_modes.py data-bin/debian-ui-de-en/bin \\
        --path runs/demo/xavier-s1/checkpoint_last.pt --cpu --output-json modes.json
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import Optional

import torch

from ..command_line.argtypes import positive_int
from ..command_line.quiet import quiet_command
from ..files.checkpoints import checkpoint_file_error
from ..files.paths import OutputError, check_output, json_result, json_text, write_json

COMMAND = "gradinit-valid-loss-modes"




def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=COMMAND, description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("data", help="fairseq data-bin directory")
    p.add_argument("--path", required=True, help="checkpoint file")
    p.add_argument("--subset", default="valid", help="split to evaluate (default: valid)")
    p.add_argument("--max-tokens", type=positive_int, default=4096, help="tokens per batch (default: 4096)")
    p.add_argument("--seed", type=int, default=1, help="seed of the dropout masks (default: 1)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where CUDA is available")
    p.add_argument("--output-json", help="also write the result to this file")
    return p


def split_loss(model, criterion, batches, *, dropout: bool, cuda: bool = False) -> float:
    """Summed loss / summed sample size over ``batches``, in base 2, with dropout on or off."""
    from fairseq import utils

    was_training = model.training
    model.train(dropout)
    total = size = 0.0
    try:
        with torch.no_grad():
            for sample in batches:
                loss, sample_size, _ = criterion(model, utils.move_to_cuda(sample) if cuda else sample)
                total += float(loss)
                size += float(sample_size)
    finally:
        model.train(was_training)
    if size == 0:
        raise ValueError("the split has no samples")
    return total / size / math.log(2)


def data_error(data: Path, subset: str) -> Optional[str]:
    """Why ``data`` is no fairseq data-bin holding ``subset`` (naming the splits it has), or None."""
    if not data.is_dir():
        return f"argument data: {data} is not a folder (expected a fairseq data-bin)"
    if not list(data.glob("dict.*.txt")):
        nested = sorted(p.parent for p in data.glob("*/dict.*.txt"))
        hint = f"; its subfolder {nested[0]} is one: pass that" if nested else ""
        return f"argument data: {data} holds no fairseq data-bin (no dict.*.txt){hint}"
    splits = sorted({p.name.split(".")[0] for p in data.glob("*.idx")})
    if subset not in splits:
        return f"argument --subset: {data} has no split {subset!r} (it has: {', '.join(splits) or 'none'})"
    return None


def main(argv=None) -> dict:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    ckpt = Path(args.path)
    if not ckpt.is_file():
        raise SystemExit(f"checkpoint not found: {ckpt}")
    # The output first: an --output-json that would overwrite an input is refused whatever the input holds.
    if args.output_json:
        try:
            check_output("--output-json", args.output_json,
                         json_result("a result of gradinit-valid-loss-modes", "loss_eval", "loss_dropout_on",
                                     command=COMMAND),
                         inputs={"--path": ckpt, "data": args.data})
        except OutputError as e:
            parser.error(str(e))
    problem = checkpoint_file_error(ckpt)
    if problem:
        parser.error(f"argument --path: {ckpt} {problem}: give a checkpoint_*.pt that fairseq-train saved")
    error = data_error(Path(args.data), args.subset)
    if error:
        parser.error(error)
    from fairseq import checkpoint_utils, utils

    import fairseq_gradinit.fairseq_plugin  # noqa: F401  (the task; checkpoint loading on torch >= 2.6)
    from fairseq_gradinit.fairseq_plugin.errors import GradInitStop

    use_cuda = torch.cuda.is_available() and not args.cpu
    overrides = {"data": args.data}
    state = checkpoint_utils.load_checkpoint_to_cpu(str(ckpt), overrides)  # read once: model and update count
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)], arg_overrides=overrides,
                                                                          state=state)
    except SystemExit as e:  # the plugin's check of the dictionaries the checkpoint records
        message = e.message if isinstance(e, GradInitStop) else e.code
        if not isinstance(message, str):
            raise
        parser.error(f"argument data: {message}")
    except RuntimeError as e:
        if "size mismatch" not in str(e):
            raise
        # Another data-bin's dictionary: the embeddings the task builds do not fit the checkpoint's.
        parser.error(f"argument data: the dictionary of {args.data} does not fit {ckpt}'s embeddings "
                     f"({str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else e}); pass the data-bin "
                     "the checkpoint was trained on")
    model = models[0]
    if use_cuda:
        model.cuda()
    task.load_dataset(args.subset)
    criterion = task.build_criterion(cfg.criterion)
    itr = task.get_batch_iterator(dataset=task.dataset(args.subset), max_tokens=args.max_tokens,
                                  max_positions=utils.resolve_max_positions(task.max_positions(),
                                                                            model.max_positions()),
                                  seed=args.seed).next_epoch_itr(shuffle=False)
    batches = list(itr)  # both passes see the same batches
    torch.manual_seed(args.seed)
    result = {
        "checkpoint": str(ckpt),
        "num_updates": (state.get("optimizer_history") or [{}])[-1].get("num_updates"),
        "subset": args.subset,
        "dropout": float(getattr(cfg.model, "dropout", 0.0) or 0.0),
        "loss_eval": split_loss(model, criterion, batches, dropout=False, cuda=use_cuda),
        "loss_dropout_on": split_loss(model, criterion, batches, dropout=True, cuda=use_cuda),
    }
    result["gap"] = result["loss_eval"] - result["loss_dropout_on"]
    text = json_text(result)
    if args.output_json:
        write_json(args.output_json, result, command=COMMAND)
    print(text)  # noqa: T201 - script output
    return result


def _command() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s | %(levelname)s | %(name)s | %(message)s")
    main()
    return 0


run = quiet_command(_command, COMMAND)


if __name__ == "__main__":
    sys.exit(run())
