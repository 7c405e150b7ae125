#!/usr/bin/env python3
"""Translate a binarized split as fairseq-generate does, in this process, and score it with sacreBLEU: the command.

Three parts: the decode (:mod:`.bleu_decode`, a :class:`~.bleu_decode.DecodeConfig` and the decoder built from it),
the scoring (:mod:`.bleu_score`, a table of sacreBLEU metrics: BLEU and chrF) and this command line, with its checks
before any work (:mod:`.bleu_checks`).

The decode is the one of the command::

    python -m fairseq_gradinit.tools.host_generate DATA --path CKPT --gen-subset SUBSET --beam 5 \\
        [--remove-bpe sentencepiece|subword_nmt] --max-tokens N [--batch-size B] [--user-dir D] [--cpu] \\
        --num-workers 0 [EXTRA...]

(fairseq-generate, with token strings built from host lists: :mod:`.host_generate`), run through fairseq's
Python API in this process (:mod:`.inprocess_generate`): fairseq's generation parser reads those arguments,
the task is set up, the ensemble loaded onto it, the split batched by the task's iterator and decoded by the
task's sequence generator. ``--remove-bpe`` follows the target dictionary (:func:`~.bleu_checks.data_segmentation`,
said in one line): ``sentencepiece`` where its entries are SentencePiece pieces ('▁' starts a word), ``subword_nmt``
where they are subword-nmt pieces ('@@' ends one a word goes on from), none where they are words; a ``--remove-bpe``
after ``--`` that does not fit them is refused. The hypotheses (fairseq-generate's ``H`` strings, which that
post-processing has already turned back into plain text) and the references (its ``T`` strings) are scored
with ``sacrebleu.metrics.BLEU`` (13a tokenization by default), or with ``sacrebleu.metrics.CHRF`` given
``--metric chrf``. A JSON file with the score, its signature and the run details (``generate_command``: the
command above, which prints the same hypotheses) is written, and a one-line summary is printed.

Everything after ``--`` is passed unchanged to fairseq-generate's arguments, e.g.::

    python scripts/evaluate_bleu.py data-bin/debian-ui-de-en/bin \\
        --path checkpoints/run1/checkpoint_best.pt --cpu -- --lenpen 1.0 --nbest 1

``--ref FILE`` scores against a raw reference file (line i = sample id i) instead of the ``T-``
lines, which come from the binarized data (SentencePiece-normalized, unknown words as
``<<unk>>``). The file is compared line for line with the ``T-`` lines (letters and digits, lowercased; each
``<<unk>>`` stands for text within one word), before the decode with the split's binarized target side, and refused
naming the first line that differs (the target file of another split, a line lost and another added). ``--from-output FILE`` scores
a saved fairseq-generate output (``--save-output`` writes the decode's lines as fairseq-generate prints them)
without decoding.

On a CUDA GPU the batches are larger (``--max-tokens 65536``, up to 4096 sentences) and ``--fp16`` decodes in
half precision (fairseq-generate ``--fp16``; asked for when the model trained in fp16). On the CPU ``--fp16`` is
ignored with a note (fairseq's CPU decoding is fp32). The decode rate is measured while decoding (sentences and
source tokens per second since the start-up, loading the model and the split, ended), logged once the batches
holding the first ``--rate-chunk`` sentences are out and then every few seconds, written to ``--progress-json``
and kept in the result's ``decode`` block; with ``--time-limit S`` the decode stops as soon as that rate projects
a total beyond S seconds (or at S), and the result file says so, with the rate.

``--required-batch-size-multiple 1`` is added unless given after ``--``: with fairseq's default
of 8 the last batch is dropped when its size is not a multiple of 8, so a few test sentences
would silently go untranslated. The number of hypotheses is also checked against the size of
the binarized subset.

fairseq 0.12.3 cannot load its checkpoints under torch >= 2.6 (``torch.load`` now defaults to
``weights_only=True``); the plugin, which the decode loads as fairseq-generate's ``--user-dir`` would, lets
fairseq load them with ``weights_only=False`` (only evaluate checkpoints you trust).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ..command_line.argtypes import positive_int
from ..command_line.quiet import quiet_command
from ..files.paths import text_lines, write_json

# Names of the parts used from this module too (by the lab, the tests and benchmarks/subprocess_bleu.py).
from .bleu_checks import (  # noqa: F401
    GRADINIT_USER_DIR,
    PLUGIN_ARCHS,
    ArgumentProblem,
    binarized_reference_problem,
    binarized_references,
    check_inputs,
    check_paths,
    data_segmentation,
    data_subsets,
    default_json_path,
    option_value,
    plugin_need,
    post_process_problem,
    reference_problem,
    resolve_user_dir,
    saved_output_problem,
)
from .bleu_decode import (  # noqa: F401
    COMMAND,
    CPU_MAX_TOKENS,
    GENERATE_MODULE,
    GPU_BATCH_SIZE,
    GPU_MAX_TOKENS,
    DecodeConfig,
    DecodeMeter,
    TimeLimitReached,
    batch_settings,
    cuda_available,
    decode_device,
    format_rate,
    run_generate,
    subset_size,
    write_json_atomic,
)
from .bleu_score import (  # noqa: F401
    METRICS,
    EvaluationError,
    GenerateOutput,
    pair_up,
    parse_generate_output,
    read_reference_file,
    reference_mismatch,
    same_reference,
    score,
    score_bleu,
)


def format_summary(result: dict) -> str:
    wall = result.get("generation_wall_time_s")
    wall_s = f"{wall:.1f}s" if isinstance(wall, (int, float)) else "n/a"
    name = result[f"{result['metric']}_string"].split(" = ")[0]  # sacreBLEU's name of it: BLEU, chrF2
    return (
        f"{name} {result['score']:.2f} | {result['subset']} | beam {result['beam']} | "
        f"{result['n_sentences']} sents ({result.get('distinct_hypotheses', '?')} distinct hypotheses) | "
        f"gen {wall_s} | {result['checkpoint']} | "
        f"{result['signature']}"
    )


def configure_logging() -> None:
    """fairseq's log lines on stderr in fairseq-generate's format, unless this process configured logging (called
    before fairseq is first imported, whose import configures it otherwise)."""
    from .host_generate import configure_logging as fairseq_generate_logging

    fairseq_generate_logging()


def result_subset(args, parsed: GenerateOutput) -> str:
    if args.from_output is not None and parsed.subset:
        return parsed.subset
    return args.gen_subset


def decode_config(args, extra: Sequence[str], *, cuda: Optional[bool] = None, fp16: bool = False) -> DecodeConfig:
    """The decode the command line asks for (``extra``: its further fairseq-generate options, after ``--``);
    ``cuda`` (detected when None) picks the batch defaults."""
    if cuda is None:
        cuda = not args.cpu and cuda_available()
    segmentation = data_segmentation(args.data, extra)
    return DecodeConfig.for_device(
        cuda, max_tokens=args.max_tokens, batch_size=args.batch_size, data=args.data, path=args.path,
        gen_subset=args.gen_subset, beam=args.beam, cpu=args.cpu, fp16=fp16, fairseq_options=tuple(extra),
        user_dir=resolve_user_dir(args.user_dir) if args.user_dir else None,
        post_process="sentencepiece" if segmentation is None else segmentation.post_process)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Translate a binarized split as fairseq-generate does (in this process) and score it with "
                    "sacreBLEU (BLEU or chrF). Arguments after `--` are passed to fairseq-generate's options.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("data", type=Path, help="fairseq data-bin directory (e.g. OUT/bin of prepare_corpus.py)")
    p.add_argument("--path", type=Path, default=None,
                   help="model checkpoint (.pt); required unless --from-output is given")
    p.add_argument("--gen-subset", default="test", help="binarized split to translate")
    p.add_argument("--beam", type=positive_int, default=5, help="beam size")
    p.add_argument("--batch-size", type=positive_int, default=None, help="sentences per batch")
    p.add_argument("--max-tokens", type=positive_int, default=None,
                   help=f"tokens per batch (when neither this nor --batch-size is given: {CPU_MAX_TOKENS} on the CPU, "
                        f"{GPU_MAX_TOKENS} tokens and up to {GPU_BATCH_SIZE} sentences on a CUDA GPU)")
    p.add_argument("--user-dir", default=None,
                   help="fairseq --user-dir, as given to fairseq-train (fairseq_gradinit, from any "
                        "folder, or 'gradinit' mean this repository's package; needed for checkpoints "
                        "of the translation_gradinit task)")
    p.add_argument("--cpu", action="store_true", help="generate on CPU")
    p.add_argument("--fp16", action="store_true",
                   help="decode in fp16 on a CUDA GPU (for a model trained in fp16); ignored with a note on the CPU")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop the decode once its measured decode rate projects a longer run, or at "
                        "SECONDS (no score then; the result file records the rate)")
    p.add_argument("--rate-chunk", type=int, default=100,
                   help="sentences decoded before the rate is first logged and projected")
    p.add_argument("--progress-json", type=Path, default=None,
                   help="keep the measured decode rate and projection in this file while decoding")
    p.add_argument("--ref", type=Path, default=None,
                   help="plain-text reference file (line i = sample id i) to score against "
                        "instead of the T- lines")
    p.add_argument("--metric", choices=sorted(METRICS), default="bleu",
                   help="sacreBLEU metric to score with (chrf: character 6-grams, beta 2)")
    p.add_argument("--tokenize", default=None,
                   help="sacreBLEU tokenizer of --metric bleu (default: sacreBLEU's default, 13a)")
    p.add_argument("--lowercase", action="store_true", help="case-insensitive scoring")
    p.add_argument("--output-json", type=Path, default=None,
                   help="where to write the result (default: next to the checkpoint, "
                        "bleu.<checkpoint>.<subset>.json)")
    p.add_argument("--save-output", type=Path, default=None,
                   help="also save the decode's output, the lines fairseq-generate prints, to this file")
    p.add_argument("--from-output", type=Path, default=None,
                   help="do not decode; score this saved generate output instead")
    return p


def split_passthrough(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv: Optional[Sequence[str]] = None) -> int:
    own, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(own)
    configure_logging()
    try:
        check_paths(args)
        return evaluate(args, extra)
    except ArgumentProblem as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def decode_block(meter: DecodeMeter, time_limit: Optional[float]) -> dict:
    """The result's ``decode`` entry: the rate over the whole run, after the first chunk, the limit."""
    return {**meter.report(time.time()), "first_chunk": meter.first_report, "time_limit_s": time_limit}


def write_stopped(args, config: DecodeConfig, stopped: TimeLimitReached, note: Optional[str], meter: DecodeMeter,
                  command: Optional[List[str]] = None) -> None:
    """The result file of a run stopped by --time-limit: no score, the reason and the measured rate (``command``:
    the decode's command where it was not ``config.command()``)."""
    out_json = args.output_json or default_json_path(args.path, args.gen_subset)
    write_json_atomic(out_json, {
        "bleu": None, "metric": getattr(args, "metric", "bleu"), "score": None, "reason": str(stopped),
        "checkpoint": str(args.path), "data": str(args.data), "subset": args.gen_subset, "beam": args.beam,
        "generate_command": command or config.command(), "precision": "fp16" if config.fp16 else "fp32",
        "precision_note": note, "batches": config.batches(),
        "decode": {**stopped.report, "first_chunk": meter.first_report, "time_limit_s": args.time_limit},
    })


def decoded(args, extra: Sequence[str]) -> Tuple[GenerateOutput, DecodeConfig, DecodeMeter, float, Optional[str]]:
    """Decode the split the command line names: (the sentences, the decode, its meter, wall seconds, the device's
    note); the result file of a stopped decode is written before :class:`TimeLimitReached` goes on."""
    check_inputs(args)
    segmentation = data_segmentation(args.data, extra)
    problem = post_process_problem(segmentation, extra)
    if problem:
        raise ArgumentProblem(problem)
    if segmentation is not None and option_value(extra, "--post-process", "--remove-bpe") is None:
        print(f"evaluate_bleu: {segmentation.note()}", file=sys.stderr)
    cuda, fp16, device_note = decode_device(args.cpu, args.fp16)
    if device_note:
        print(f"note: {device_note}", file=sys.stderr)
    config = decode_config(args, extra, cuda=cuda, fp16=fp16)
    if args.ref is not None:
        problem = binarized_reference_problem(args.ref, config)
        if problem:
            raise ArgumentProblem(f"argument --ref: {problem}")
    meter = DecodeMeter(subset_size(args.data, args.gen_subset), chunk=args.rate_chunk)
    try:
        parsed, wall = run_generate(config, args.save_output, meter=meter, time_limit=args.time_limit,
                                    progress_json=args.progress_json)
    except TimeLimitReached as stopped:
        write_stopped(args, config, stopped, device_note, meter)
        raise
    return parsed, config, meter, wall, device_note


def evaluate(args, extra: Sequence[str]) -> int:
    """Generate (or read the saved output), score, write the JSON; 0, or 1 after an error line."""
    config, meter, device_note, wall = None, None, None, None
    try:
        if args.from_output is None and args.path is None:
            raise EvaluationError("--path CHECKPOINT is required (unless --from-output is given)")
        if args.from_output is not None:
            parsed = parse_generate_output(text_lines(args.from_output))
            problem = saved_output_problem(parsed, args.from_output, args.data, result_subset(args, parsed))
            if problem:
                raise EvaluationError(problem)
        else:
            parsed, config, meter, wall, device_note = decoded(args, extra)
        expected = subset_size(args.data, result_subset(args, parsed))
        ref_lines = read_reference_file(args.ref) if args.ref is not None else None
        if ref_lines is not None:
            mismatch = reference_mismatch(parsed, ref_lines)
            if mismatch:
                raise EvaluationError(f"--ref {args.ref}: {mismatch}")
        ids, hyps, refs = pair_up(parsed, ref_lines)
        if ref_lines is None and any("<<unk>>" in r for r in refs):
            print("warning: some T- references contain <<unk>>; pass --ref with the raw "
                  "reference file for exact scoring", file=sys.stderr)
        if expected is not None and len(ids) != expected:
            print(f"warning: fairseq-generate output has {len(ids)} hypotheses but the "
                  f"binarized subset has {expected} sentences; the score covers only the translated "
                  "ones", file=sys.stderr)
        elif ref_lines is not None and len(ids) != len(ref_lines):
            print(f"warning: {len(ids)} hypotheses for {len(ref_lines)} reference lines; "
                  "scoring only the translated ids", file=sys.stderr)
        scores = score(hyps, refs, args.metric, tokenize=args.tokenize, lowercase=args.lowercase)
    except (EvaluationError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    result = {
        "bleu": None,  # a BLEU score, or None when --metric named another (the field every result file has)
        **scores,
        "n_sentences": len(ids),
        # A model that ignores its source writes one sentence for every source: a score alone can hide it.
        "distinct_hypotheses": len(set(hyps)),
        "n_subset_sentences": expected,
        "checkpoint": str(args.path) if args.path is not None else None,
        "data": str(args.data),
        "subset": result_subset(args, parsed),
        "beam": (parsed.beam if args.from_output is not None and parsed.beam else args.beam),
        "references": str(args.ref) if args.ref is not None else "T- lines",
        "generation_wall_time_s": round(wall, 2) if wall is not None else None,
        "fairseq_translate_time_s": parsed.translate_seconds,
        "fairseq_bleu": parsed.fairseq_bleu,
        "generate_command": None if config is None else config.command(),
        "generate_output": str(args.from_output or args.save_output or "") or None,
        "precision": None if config is None else ("fp16" if config.fp16 else "fp32"),
        "precision_note": device_note,
        "batches": None if config is None else config.batches(),
        "decode": None if meter is None else decode_block(meter, args.time_limit),
    }
    out_json = args.output_json or default_json_path(
        args.path if args.path is not None else args.from_output, result["subset"])
    write_json(out_json, result, command=COMMAND, indent=2, ensure_ascii=False)
    print(format_summary(result))
    return 0


run = quiet_command(main, COMMAND)


if __name__ == "__main__":
    sys.exit(run())
