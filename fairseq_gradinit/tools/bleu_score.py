"""Scoring for gradinit-evaluate-bleu: the decode's sentences paired with their references, and a table of
sacreBLEU metrics to score them with.

A metric is a row of :data:`METRICS`: BLEU (``sacrebleu.metrics.BLEU``, 13a tokenization by default) and chrF
(``sacrebleu.metrics.CHRF``, character 6-grams, beta 2). Each scores a corpus into the same fields: the score under
the metric's name and ``score``, sacreBLEU's signature (which names the metric and its settings, so two results
compare only when their signatures match) and the metric's own statistics. The sentences come from a decode in this
process (:class:`GenerateOutput`, filled by the decoder) or from a saved fairseq-generate output
(:func:`parse_generate_output`); the references from their ``T`` lines or a ``--ref`` file, checked against them.
"""
from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..files.paths import text_lines

_HYP_RE = re.compile(r"^H-(\d+)\t")
_REF_RE = re.compile(r"^T-(\d+)\t")
_SRC_RE = re.compile(r"^S-(\d+)\t")
_TRANSLATED_RE = re.compile(
    r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s"
)
_FAIRSEQ_BLEU_RE = re.compile(r"^Generate (\S+) with beam=(\d+): (.*)$")


class EvaluationError(RuntimeError):
    """A user-facing error (failed generation, unusable output)."""


# --------------------------------------------------------------------------------------------
# the sentences and their references
# --------------------------------------------------------------------------------------------


@dataclass
class GenerateOutput:
    hypotheses: Dict[int, str] = field(default_factory=dict)  # best (first) hypothesis per id
    references: Dict[int, str] = field(default_factory=dict)
    sources: Dict[int, str] = field(default_factory=dict)
    translate_seconds: Optional[float] = None  # from fairseq's "Translated ... in Xs" line
    n_translated: Optional[int] = None
    fairseq_bleu: Optional[str] = None  # fairseq's own "Generate ... with beam=N: ..." result
    subset: Optional[str] = None  # from that line
    beam: Optional[int] = None  # from that line

    def add(self, sentence) -> None:
        """A sentence decoded in this process (:class:`~.inprocess_generate.DecodedSentence`), as its lines read."""
        if sentence.hypotheses:
            self.hypotheses.setdefault(sentence.id, sentence.hypotheses[0].text)
        if sentence.reference is not None:
            self.references[sentence.id] = sentence.reference
        if sentence.source is not None:
            self.sources[sentence.id] = sentence.source

    def finish(self, decoder) -> None:
        """The whole decode's numbers from ``decoder`` (:class:`~.inprocess_generate.SplitDecoder`), as its
        timing and BLEU lines read (the time to fairseq's tenth of a second)."""
        self.n_translated = decoder.n_translated
        self.translate_seconds = round(decoder.translate_seconds, 1)
        self.fairseq_bleu = decoder.fairseq_bleu()
        if self.fairseq_bleu is not None:
            self.subset, self.beam = decoder.cfg.dataset.gen_subset, decoder.cfg.generation.beam


def parse_generate_output(lines: Iterable[str]) -> GenerateOutput:
    """Parse fairseq-generate's output (a file saved with ``--save-output``, or printed by fairseq-generate).

    ``H-<id>\\t<score>\\t<text>`` and ``T-<id>\\t<text>`` lines are collected (the text may be
    empty). With ``--nbest > 1`` only the first ``H`` line per id (the best one) is kept. Log
    lines and the ``D-``/``P-`` lines are ignored except for the "Translated N sentences ... in
    Xs" timing line and fairseq's own BLEU line.
    """
    out = GenerateOutput()
    for raw in lines:
        line = raw.rstrip("\r\n")
        m = _HYP_RE.match(line)
        if m:
            parts = line.split("\t", 2)
            text = parts[2] if len(parts) == 3 else ""
            out.hypotheses.setdefault(int(m.group(1)), text)
            continue
        m = _REF_RE.match(line)
        if m:
            out.references[int(m.group(1))] = line.split("\t", 1)[1]
            continue
        m = _SRC_RE.match(line)
        if m:
            out.sources[int(m.group(1))] = line.split("\t", 1)[1]
            continue
        m = _TRANSLATED_RE.search(line)
        if m:
            out.n_translated = int(m.group(1).replace(",", ""))
            out.translate_seconds = float(m.group(3))
            continue
        m = _FAIRSEQ_BLEU_RE.match(line)
        if m:
            out.subset, out.beam, out.fairseq_bleu = m.group(1), int(m.group(2)), m.group(3)
    return out


def read_reference_file(path: Path) -> List[str]:
    """The lines of ``--ref``, split at line feeds only (:func:`~fairseq_gradinit.files.paths.text_lines`): a lone
    CR inside a sentence stays in it instead of splitting it and shifting every later reference."""
    return text_lines(path)


def comparable(text: str) -> str:
    """``text`` reduced to what survives SentencePiece normalization and (de)tokenization: HTML
    entities (Moses escapes) decoded, NFKC, lowercased, letters and digits only."""
    return "".join(c for c in unicodedata.normalize("NFKC", html.unescape(text)).lower() if c.isalnum())


def words_comparable(text: str) -> str:
    """:func:`comparable` with the words kept apart: each run of whitespace one space, other characters that are
    no letter or digit dropped (punctuation that tokenization split off, HTML entities, '▁')."""
    kept = (c if c.isalnum() else " " if c.isspace() else ""
            for c in unicodedata.normalize("NFKC", html.unescape(text)).lower())
    return " ".join("".join(kept).split())


def _unknown_words(n: int) -> str:
    """The pattern of ``n`` unknown tokens in a row: an unknown token is one token of the binarized text, and no
    tokenizer or subword model joins two words into one token, so it stands for text without a space; ``n`` of them
    for at most ``n`` words."""
    return " ?[^ ]*" + (f"(?: [^ ]*){{0,{n - 1}}}" if n > 1 else "") + " ?"


def same_reference(file_line: str, t_line: str) -> bool:
    """Whether a ``--ref`` line is the ``T-`` line's sentence, compared as :func:`comparable` reads them (a space of
    either side may be missing on the other: tokenization splits words, ``--remove-bpe sentencepiece`` on a text
    without '▁' pieces removes spaces); each ``<<unk>>`` stands for any text within one word of the line."""
    pattern, unknown = "", 0
    for k, part in enumerate(t_line.split("<<unk>>")):
        unknown += k > 0
        fixed = comparable(part)
        if fixed:
            if unknown:
                pattern, unknown = pattern + _unknown_words(unknown), 0
            pattern += " ?".join(re.escape(c) for c in fixed)
    if unknown:
        pattern += _unknown_words(unknown)
    return re.fullmatch(pattern, words_comparable(file_line)) is not None


def reference_mismatch(parsed: GenerateOutput, reference_lines: Sequence[str]) -> Optional[str]:
    """Why ``reference_lines`` (``--ref``) are not the references of the generated subset, or None.

    Compares each with the ``T-`` line that fairseq-generate printed for its sample id: a reference file of another
    split matches almost none of them, one with a line lost and another added (the same count) none between the two;
    a ``T-`` line with no letter or digit outside unknown words is not compared.
    """
    pairs = [(i, t) for i, t in sorted(parsed.references.items())
             if i < len(reference_lines) and comparable(t.replace("<<unk>>", ""))]
    differ = [(i, t) for i, t in pairs if not same_reference(reference_lines[i], t)]
    if not differ:
        return None
    i, t = differ[0]
    return (f"{len(differ)} of {len(pairs)} lines differ from the references in the binarized subset, the first at "
            f"line {i + 1} (sample {i}: the file has {reference_lines[i][:60]!r}, the subset {t[:60]!r}); line i + 1 "
            "of the file must be the reference of sample i: pass the plain-text target file of the split given as "
            "--gen-subset")


def pair_up(
    parsed: GenerateOutput, reference_lines: Optional[Sequence[str]] = None
) -> Tuple[List[int], List[str], List[str]]:
    """Return (ids, hypotheses, references) sorted by sample id.

    References come from the ``T-`` lines, or from ``reference_lines`` (line i = sample id i)
    when given. Raises :class:`EvaluationError` if nothing was generated or ids do not match.
    """
    if not parsed.hypotheses:
        raise EvaluationError("no H-<id> lines found in the fairseq-generate output")
    ids = sorted(parsed.hypotheses)
    if reference_lines is not None:
        out_of_range = [i for i in ids if i >= len(reference_lines)]
        if out_of_range:
            raise EvaluationError(
                f"reference file has {len(reference_lines)} lines but the output has sample "
                f"ids up to {max(out_of_range)}"
            )
        refs = [reference_lines[i] for i in ids]
    else:
        missing = [i for i in ids if i not in parsed.references]
        if missing:
            raise EvaluationError(
                f"{len(missing)} hypotheses have no T-<id> reference line (e.g. id {missing[0]}); "
                "is the subset missing its target side? Use --ref FILE."
            )
        extra = set(parsed.references) - set(ids)
        if extra:
            raise EvaluationError(
                f"{len(extra)} references have no hypothesis (e.g. id {min(extra)})"
            )
        refs = [parsed.references[i] for i in ids]
    return ids, [parsed.hypotheses[i] for i in ids], refs


# --------------------------------------------------------------------------------------------
# the metric table
# --------------------------------------------------------------------------------------------


def _bleu(tokenize: Optional[str], lowercase: bool):
    from sacrebleu.metrics import BLEU

    return BLEU(tokenize=tokenize, lowercase=lowercase)


def _chrf(tokenize: Optional[str], lowercase: bool):
    from sacrebleu.metrics import CHRF

    return CHRF(lowercase=lowercase)  # character n-grams: no word tokenizer (refused before, by scoring_problem)


def _bleu_details(result) -> dict:
    return {"precisions": [round(p, 4) for p in result.precisions], "brevity_penalty": round(result.bp, 4),
            "sys_len": result.sys_len, "ref_len": result.ref_len}


def _chrf_details(result) -> dict:
    return {"char_order": result.char_order, "word_order": result.word_order, "beta": result.beta}


@dataclass(frozen=True)
class Metric:
    """A row of the metric table: how to build the sacreBLEU metric and read its statistics."""

    name: str
    build: Callable[[Optional[str], bool], object]
    details: Callable[[object], dict]
    #: whether ``--tokenize`` means something to it
    tokenizes: bool


METRICS: Dict[str, Metric] = {
    "bleu": Metric("bleu", _bleu, _bleu_details, tokenizes=True),
    "chrf": Metric("chrf", _chrf, _chrf_details, tokenizes=False),
}


def score(hypotheses: Sequence[str], references: Sequence[str], metric: str = "bleu",
          tokenize: Optional[str] = None, lowercase: bool = False) -> dict:
    """The corpus score of ``metric`` (a key of :data:`METRICS`): the score under the metric's name and ``score``,
    ``metric``, its signature, sacreBLEU's one-line result (``<name>_string``) and the metric's statistics."""
    if len(hypotheses) != len(references):
        raise EvaluationError(
            f"{len(hypotheses)} hypotheses but {len(references)} references"
        )
    row = METRICS[metric]
    scorer = row.build(tokenize, lowercase)
    result = scorer.corpus_score(list(hypotheses), [list(references)])
    value = round(result.score, 4)
    return {metric: value, "metric": metric, "score": value, "signature": str(scorer.get_signature()),
            f"{metric}_string": str(result), **row.details(result)}


def score_bleu(hypotheses: Sequence[str], references: Sequence[str], tokenize: Optional[str] = None,
               lowercase: bool = False) -> dict:
    """Corpus BLEU with sacreBLEU (:func:`score`'s BLEU row)."""
    return score(hypotheses, references, "bleu", tokenize=tokenize, lowercase=lowercase)


def scoring_problem(tokenize: Optional[str], lowercase: bool, metric: str = "bleu") -> Optional[str]:
    """Why sacreBLEU cannot score with ``--metric``/``--tokenize``/``--lowercase`` (a tokenizer it does not have,
    one whose extra dependencies are missing, a tokenizer for a metric without one), found by scoring one sentence
    before any decoding; None when it scores."""
    from sacrebleu.metrics import BLEU

    if tokenize is not None and not METRICS[metric].tokenizes:
        return f"argument --tokenize: --metric {metric} takes no tokenizer (it compares characters)"
    try:
        score(["a b c d"], ["a b c d"], metric, tokenize=tokenize, lowercase=lowercase)
    except KeyError:
        return (f"argument --tokenize: sacreBLEU has no tokenizer {tokenize!r}; choose one of "
                f"{', '.join(getattr(BLEU, 'TOKENIZERS', ()))}")
    except Exception as e:  # noqa: BLE001 - sacreBLEU's own reasons (RuntimeError, ImportError), on one line
        return f"argument --tokenize: sacreBLEU cannot tokenize with {tokenize!r}: {' '.join(str(e).split())}"
    return None
