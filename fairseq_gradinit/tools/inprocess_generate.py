"""fairseq-generate's decode of a binarized split, in this process, through fairseq's Python API.

:class:`SplitDecoder` is built from a :class:`~.bleu_decode.DecodeConfig` and does what ``fairseq_cli.generate``
does, without printing: fairseq's own generation parser reads the configuration's fairseq-generate arguments (the
parser defines every option, the further ones included, and imports ``--user-dir``), the task they name is set up,
the ensemble is loaded onto it (:func:`fairseq.checkpoint_utils.load_model_ensemble`), the split is loaded with the
checkpoint's task settings and batched by the task's iterator, and each batch is decoded by the task's generator
(``task.build_generator``: a ``SequenceGenerator`` for beam search). Each sentence's strings are made as
fairseq-generate makes its ``S``/``T``/``H``/``D`` lines (``--remove-bpe``/``--post-process``, then the
``--tokenizer``/``--bpe`` decoder), from token lists read off the device once per batch (as :mod:`.host_generate`
does). fairseq's own BLEU line is kept as well (``Generate SUBSET with beam=N: ...``).
"""
from __future__ import annotations

import ast
import contextlib
import io
import math
import sys
import time
from dataclasses import dataclass
from itertools import chain
from typing import Any, Iterator, List, Optional, Sequence, Tuple

#: fairseq-generate's ``--max-tokens`` when neither it nor ``--batch-size`` is given.
FAIRSEQ_DEFAULT_MAX_TOKENS = 12000


@dataclass(frozen=True)
class Hypothesis:
    """One of a sentence's ``--nbest`` hypotheses: ``text`` is fairseq-generate's ``H`` string (post-processed,
    not detokenized), ``detokenized`` its ``D`` string; the scores in base 2, as fairseq-generate prints them
    (tensors of the decoding device, read only when the lines are made)."""

    text: str
    detokenized: str
    score: Any
    positional_scores: Any


@dataclass(frozen=True)
class DecodedSentence:
    """A sentence of the split: its source (``S``), reference (``T``; None where the split has no target side)
    and hypotheses, best first."""

    id: int
    source: Optional[str]
    reference: Optional[str]
    hypotheses: Tuple[Hypothesis, ...]

    def output_lines(self) -> List[str]:
        """The lines fairseq-generate prints for this sentence (S, T, then H, D, P per hypothesis)."""
        lines = [] if self.source is None else [f"S-{self.id}\t{self.source}"]
        if self.reference is not None:
            lines.append(f"T-{self.id}\t{self.reference}")
        for h in self.hypotheses:
            lines += [f"H-{self.id}\t{h.score}\t{h.text}", f"D-{self.id}\t{h.score}\t{h.detokenized}",
                      f"P-{self.id}\t" + " ".join(f"{x:.4f}" for x in h.positional_scores.tolist())]
        return lines


def import_fairseq() -> None:
    """Import the fairseq modules the decode uses (before a decode that a signal may interrupt)."""
    import fairseq.checkpoint_utils  # noqa: F401
    import fairseq.dataclass.utils  # noqa: F401
    import fairseq.options  # noqa: F401
    import fairseq.scoring  # noqa: F401
    import fairseq.tasks  # noqa: F401
    import fairseq.utils  # noqa: F401


class ArgumentsRefused(ValueError):
    """fairseq's parser refused the arguments (it printed its usage and message on stderr), or the scorer they name
    cannot be built: ``str(self)`` is the reason's one line, ``code`` the exit status."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def generation_config(argv: Sequence[str]):
    """fairseq-generate's configuration for the arguments ``argv`` (parsed as ``fairseq_cli.generate.cli_main``
    parses its command line, whose ``--arch`` workaround is repeated here); :class:`ArgumentsRefused` where
    fairseq's parser exits."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    said, argv_before = io.StringIO(), sys.argv
    try:
        # fairseq's get_parser reads --user-dir from sys.argv, not from input_args: it sees these arguments
        sys.argv = [argv_before[0] if argv_before else "fairseq-generate", *argv]
        with contextlib.redirect_stderr(said):
            parser = options.get_generation_parser()
            parser.add_argument("--arch", "-a", metavar="ARCH", default="wav2vec2",
                                help="Model architecture. For constructing tasks that rely on model args")
            args = options.parse_args_and_arch(parser, input_args=list(argv))
    except SystemExit as exc:
        sys.stderr.write(said.getvalue())
        last = next((line for line in reversed(said.getvalue().splitlines()) if line.strip()), "no message")
        raise ArgumentsRefused(last.strip(), exc.code if isinstance(exc.code, int) else 1) from None
    finally:
        sys.argv = argv_before
    sys.stderr.write(said.getvalue())
    return convert_namespace_to_omegaconf(args)


def symbols_to_strip(generator) -> set:
    """The symbols fairseq-generate leaves out of its strings (``get_symbols_to_strip_from_output``)."""
    return getattr(generator, "symbols_to_strip_from_output", None) or {generator.eos}


class SplitDecoder:
    """fairseq-generate's decode of ``config.gen_subset``: constructing it loads the task, the ensemble and the split
    (the start-up); :meth:`batches` decodes batch after batch. ``translate_seconds`` and ``generated_tokens`` are
    fairseq-generate's timer (the generator's calls only), ``n_translated`` its sentence count and
    :meth:`fairseq_bleu` its BLEU line's score."""

    def __init__(self, config):  # a bleu_decode.DecodeConfig (not imported: bleu_decode imports this module)
        import numpy as np
        import torch
        from fairseq import checkpoint_utils, scoring, tasks, utils

        self.config = config
        self.cfg = cfg = generation_config(config.fairseq_args())
        # fairseq_cli.generate.main's checks
        assert cfg.common_eval.path is not None, "--path required for generation!"
        assert not cfg.generation.sampling or cfg.generation.nbest == cfg.generation.beam, \
            "--sampling requires --nbest to be equal to --beam"
        assert cfg.generation.replace_unk is None or cfg.dataset.dataset_impl == "raw", \
            "--replace-unk requires a raw text dataset (--dataset-impl=raw)"
        utils.import_user_module(cfg.common)
        if cfg.dataset.max_tokens is None and cfg.dataset.batch_size is None:
            cfg.dataset.max_tokens = FAIRSEQ_DEFAULT_MAX_TOKENS
        if cfg.common.seed is not None and not cfg.generation.no_seed_provided:  # stochastic decoding
            np.random.seed(cfg.common.seed)
            utils.set_torch_seed(cfg.common.seed)
        self.use_cuda = torch.cuda.is_available() and not cfg.common.cpu

        self.task = task = tasks.setup_task(cfg.task)
        try:
            self.src_dict = getattr(task, "source_dictionary", None)
        except NotImplementedError:
            self.src_dict = None
        self.tgt_dict = task.target_dictionary
        # before the ensemble and the split load: a scorer the options cannot build (a sacreBLEU tokenizer whose
        # dependencies are missing, a metric's missing package) stops the start-up, not the end of the decode
        try:
            self.scorer = scoring.build_scorer(cfg.scoring, self.tgt_dict)
        except Exception as e:  # noqa: BLE001 - the scorer's own reason, on one line
            name = getattr(cfg.scoring, "_name", None) or "bleu"
            raise ArgumentsRefused(f"--scoring {name}: {type(e).__name__}: {' '.join(str(e).split())}", 1) from None
        overrides = ast.literal_eval(cfg.common_eval.model_overrides)
        self.models, saved_cfg = checkpoint_utils.load_model_ensemble(
            utils.split_paths(cfg.common_eval.path), arg_overrides=overrides, task=task,
            suffix=cfg.checkpoint.checkpoint_suffix, strict=(cfg.checkpoint.checkpoint_shard_count == 1),
            num_shards=cfg.checkpoint.checkpoint_shard_count)
        # after the checkpoint, so that the split is read with the task settings the model was trained with
        task.load_dataset(cfg.dataset.gen_subset, task_cfg=saved_cfg.task)
        lm = None
        if cfg.generation.lm_path is not None:
            overrides["data"] = cfg.task.data
            (lm,), _ = checkpoint_utils.load_model_ensemble([cfg.generation.lm_path], arg_overrides=overrides,
                                                            task=None)
        for model in chain(self.models, [lm] if lm is not None else []):
            if cfg.common.fp16:
                model.half()
            if self.use_cuda and not cfg.distributed_training.pipeline_model_parallel:
                model.cuda()
            model.prepare_for_inference_(cfg)
        self.align_dict = utils.load_align_dict(cfg.generation.replace_unk)
        self.dataset = task.dataset(cfg.dataset.gen_subset)
        self.generator = task.build_generator(self.models, cfg.generation,
                                              extra_gen_cls_kwargs={"lm_model": lm, "lm_weight": cfg.generation.lm_weight})
        self.tokenizer = task.build_tokenizer(cfg.tokenizer)
        self.bpe = task.build_bpe(cfg.bpe)
        self.strip = symbols_to_strip(self.generator)
        self.translate_seconds, self.generated_tokens, self.n_translated = 0.0, 0, 0
        self.has_target = True

    @property
    def source_sizes(self) -> Optional[List[int]]:
        """Source-side token counts of the split, by sentence id (None for a dataset without a source side)."""
        sizes = getattr(self.dataset, "src_sizes", None)
        return None if sizes is None else [int(n) for n in sizes]

    def decode_text(self, text: str) -> str:
        """fairseq-generate's ``decode_fn``: the BPE decoder, then the tokenizer's detokenizer, where given."""
        if self.bpe is not None:
            text = self.bpe.decode(text)
        if self.tokenizer is not None:
            text = self.tokenizer.decode(text)
        return text

    def batches(self) -> Iterator[List[DecodedSentence]]:
        """Decode the split batch by batch, in fairseq-generate's order; yields each batch's sentences."""
        from fairseq import utils

        cfg, task = self.cfg, self.task
        itr = task.get_batch_iterator(
            dataset=self.dataset, max_tokens=cfg.dataset.max_tokens, max_sentences=cfg.dataset.batch_size,
            max_positions=utils.resolve_max_positions(task.max_positions(), *[m.max_positions() for m in self.models]),
            ignore_invalid_inputs=cfg.dataset.skip_invalid_size_inputs_valid_test,
            required_batch_size_multiple=cfg.dataset.required_batch_size_multiple, seed=cfg.common.seed,
            num_shards=cfg.distributed_training.distributed_world_size,
            shard_id=cfg.distributed_training.distributed_rank, num_workers=cfg.dataset.num_workers,
            data_buffer_size=cfg.dataset.data_buffer_size,
        ).next_epoch_itr(shuffle=False)
        for sample in itr:
            sample = utils.move_to_cuda(sample) if self.use_cuda else sample
            if "net_input" not in sample:
                continue
            prefix_tokens = None
            if cfg.generation.prefix_size > 0:
                prefix_tokens = sample["target"][:, : cfg.generation.prefix_size]
            start = time.perf_counter()
            hypos = task.inference_step(self.generator, self.models, sample, prefix_tokens=prefix_tokens,
                                        constraints=sample.get("constraints"))
            generated = sum(len(h[0]["tokens"]) for h in hypos)
            self.translate_seconds += time.perf_counter() - start
            self.generated_tokens += generated
            yield self._sentences(sample, hypos)
            self.n_translated += sample["nsentences"] if "nsentences" in sample else sample["id"].numel()

    def _sentences(self, sample, hypos) -> List[DecodedSentence]:
        """The batch's sentences as fairseq-generate makes their strings; the best hypothesis of each is scored by
        fairseq's scorer, as fairseq-generate scores it."""
        from fairseq import utils

        pad = self.tgt_dict.pad()
        # one read of the batch's tokens to the host, and lists, not tensors, into Dictionary.string (host_generate)
        sources = sample["net_input"]["src_tokens"].tolist() if "src_tokens" in sample["net_input"] else None
        self.has_target = sample["target"] is not None
        targets = sample["target"].tolist() if self.has_target else None
        post_process = self.cfg.common_eval.post_process
        out = []
        for i, sample_id in enumerate(sample["id"].tolist()):
            src_tokens = None if sources is None else [t for t in sources[i] if t != pad]
            target_tokens = None if targets is None else [t for t in targets[i] if t != pad]
            target_str = None
            if self.align_dict is not None:
                src_str = self.dataset.src.get_original_text(sample_id)
                target_str = self.dataset.tgt.get_original_text(sample_id)
            else:
                src_str = self.src_dict.string(src_tokens, post_process) if self.src_dict is not None else ""
                if self.has_target:
                    target_str = self.tgt_dict.string(target_tokens, post_process, escape_unk=True,
                                                      extra_symbols_to_ignore=self.strip)
            src_str = self.decode_text(src_str)
            if self.has_target:
                target_str = self.decode_text(target_str)
            found = []
            for j, hypo in enumerate(hypos[i][: self.cfg.generation.nbest]):
                hypo_tokens, hypo_str, _ = utils.post_process_prediction(
                    hypo_tokens=hypo["tokens"].int().cpu().tolist(), src_str=src_str, alignment=hypo["alignment"],
                    align_dict=self.align_dict, tgt_dict=self.tgt_dict, remove_bpe=post_process,
                    extra_symbols_to_ignore=self.strip)
                detok_hypo_str = self.decode_text(hypo_str)
                score = hypo["score"] / math.log(2)  # base e to base 2, as fairseq-generate prints it
                found.append(Hypothesis(hypo_str, detok_hypo_str, score, hypo["positional_scores"] / math.log(2)))
                if self.has_target and j == 0:
                    self._score(target_str, detok_hypo_str, target_tokens, hypo_tokens)
            out.append(DecodedSentence(sample_id, src_str if self.src_dict is not None else None, target_str,
                                       tuple(found)))
        return out

    def _score(self, target_str: str, hypo_str: str, target_tokens, hypo_tokens) -> None:
        import torch

        if self.align_dict is not None or self.cfg.common_eval.post_process is not None:
            # fairseq-generate scores the strings it prints, encoded again (words it has not seen are added)
            target_tokens = self.tgt_dict.encode_line(target_str, add_if_not_exist=True)
            hypo_tokens = self.tgt_dict.encode_line(hypo_str, add_if_not_exist=True)
        if hasattr(self.scorer, "add_string"):
            self.scorer.add_string(target_str, hypo_str)
        else:
            self.scorer.add(torch.IntTensor(target_tokens) if isinstance(target_tokens, list) else target_tokens,
                            torch.IntTensor(hypo_tokens) if isinstance(hypo_tokens, list) else hypo_tokens)

    def fairseq_bleu(self) -> Optional[str]:
        """fairseq's own score of the sentences decoded so far (its ``Generate ... with beam=N:`` line's), or None
        where the split has no target side."""
        return self.scorer.result_string() if self.has_target else None

    def summary_lines(self) -> List[str]:
        """fairseq-generate's last output lines: its timing line and its BLEU line."""
        n, seconds = self.n_translated, self.translate_seconds
        lines = [f"Translated {n:,} sentences ({self.generated_tokens:,} tokens) in {seconds:.1f}s "
                 f"({n / max(seconds, 1e-9):.2f} sentences/s, {self.generated_tokens / max(seconds, 1e-9):.2f} tokens/s)"]
        bleu = self.fairseq_bleu()
        if bleu is not None:
            lines.append(f"Generate {self.cfg.dataset.gen_subset} with beam={self.cfg.generation.beam}: {bleu}")
        return lines
