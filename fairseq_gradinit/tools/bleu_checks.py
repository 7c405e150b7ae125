"""gradinit-evaluate-bleu's checks before any work: the data folder, the split, the checkpoint, the references and
the files it writes (:class:`ArgumentProblem`, reported as argparse reports its own errors)."""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from ..files.checkpoints import load_trusted_checkpoint
from ..files.paths import OutputError, check_output, json_result, text_output, utf8_problem
from .bleu_decode import COMMAND, DecodeConfig, subset_size
from .bleu_score import read_reference_file, same_reference, scoring_problem

#: The installed package, fairseq's ``--user-dir`` for this plugin.
GRADINIT_USER_DIR = Path(__file__).resolve().parents[1]


class ArgumentProblem(ValueError):
    """A bad command-line value, reported as argparse reports its own (exit status 2)."""


def default_json_path(checkpoint: Path, subset: str) -> Path:
    return checkpoint.parent / f"bleu.{checkpoint.stem}.{subset}.json"


def resolve_user_dir(value: str) -> Path:
    """The ``--user-dir`` folder: 'gradinit', or the path fairseq-train took (``fairseq_gradinit``,
    relative to the current folder or not), means this repository's package."""
    path = Path(value)
    if value == "gradinit" or (path.name == "fairseq_gradinit" and not path.is_dir()):
        return GRADINIT_USER_DIR
    if not path.is_dir():
        raise ArgumentProblem(f"argument --user-dir: {value} is not a directory: pass the --user-dir the model "
                              "was trained with (fairseq_gradinit for this plugin)")
    return path.resolve()


def data_subsets(data: Path) -> List[str]:
    """The binarized splits in ``data`` (from the names of its ``.idx``/``.bin`` files)."""
    names = {f.name.split(".", 1)[0] for f in data.iterdir() if f.suffix in (".idx", ".bin")}
    return sorted(names)


def check_inputs(args) -> None:
    """Refuse a data folder that is no data-bin, a split it lacks and a damaged checkpoint before
    fairseq-generate loads anything (``ArgumentProblem``)."""
    data = Path(args.data)
    if not data.is_dir():
        raise ArgumentProblem(f"argument data: {data} is not a directory")
    if not any(data.glob("dict.*.txt")):
        inner = [d for d in sorted(data.iterdir()) if d.is_dir() and any(d.glob("dict.*.txt"))]
        hint = (f"its subfolder {inner[0]} is one: pass {inner[0]}" if inner else
                "pass the folder fairseq-preprocess (or prepare_corpus.py's bin/) wrote")
        raise ArgumentProblem(f"argument data: {data} holds no fairseq data-bin (no dict.*.txt); {hint}")
    subsets = data_subsets(data)
    if args.gen_subset not in subsets:
        raise ArgumentProblem(f"argument --gen-subset: invalid choice {args.gen_subset!r}: {data} holds "
                              f"{', '.join(subsets) or 'no binarized split'}")
    path = Path(args.path)
    if not path.is_file():
        raise ArgumentProblem(f"argument --path: {path}: no such checkpoint file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if not magic:
        raise ArgumentProblem(f"argument --path: {path} is empty: pick another checkpoint")
    if magic == b"PK\x03\x04":  # torch.save's zip format: a cut-off file has no central directory
        try:
            with zipfile.ZipFile(path) as z:
                z.namelist()
        except (zipfile.BadZipFile, OSError) as e:
            raise ArgumentProblem(f"argument --path: {path} is truncated or damaged ({e}): pick another "
                                  "checkpoint, e.g. an earlier checkpoint_*.pt of the same run") from None
    if subset_size(data, args.gen_subset) == 0:
        raise ArgumentProblem(f"argument --gen-subset: the split {args.gen_subset!r} of {data} has no sentences: "
                              "there is nothing to translate; pick another split")
    if not args.user_dir:
        need = plugin_need(path)
        if need:
            raise ArgumentProblem(f"argument --path: {path} was trained with the fairseq_gradinit plugin ({need}), "
                                  "which fairseq-generate needs to load it: add --user-dir fairseq_gradinit")


#: Architectures the plugin registers (a checkpoint of one needs it to load).
PLUGIN_ARCHS = ("transformer_wskip", "transformer_lm_postln")


def plugin_need(path: Path) -> Optional[str]:
    """What in the checkpoint ``path`` only loads with the fairseq_gradinit plugin (its task, its
    per-use multipliers, one of its architectures), or None. The tensors are memory-mapped, not read."""
    try:
        state = load_trusted_checkpoint(path, map_location="cpu", mmap=True)
    except Exception:  # an old format, or a pickle fairseq cannot read: fairseq-generate will say
        return None
    def get(obj, key):  # fairseq saves its config as a dict (or an omegaconf/argparse object)
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    if not isinstance(state, dict):
        return None
    cfg = state.get("cfg") or state.get("args")
    name = str(get(get(cfg, "task"), "_name") or get(cfg, "task") or "")
    if name == "translation_gradinit":
        return "its task is translation_gradinit"
    multipliers = sorted(k for k in (state.get("model") or {}) if k.endswith("embed_scale"))
    if multipliers:
        return f"it holds per-use scales of tied embeddings ({', '.join(multipliers)})"
    model = get(cfg, "model")
    arch = str(get(model, "_name") or get(model, "arch") or get(cfg, "arch") or "")
    if arch.startswith(PLUGIN_ARCHS):
        return f"its architecture {arch} is the plugin's"
    return None


def reference_problem(ref: Path, data: Optional[Path], subset: str) -> Optional[str]:
    """Why ``ref`` cannot be the plain-text references of the split ``subset`` of ``data``: unreadable,
    not UTF-8, or not one line per sentence of the split (line i is sentence i); None when it may be."""
    if not ref.is_file():
        return f"{ref} is not a file" if ref.exists() else f"{ref}: no such file"
    problem = utf8_problem(ref)
    if problem:
        return f"{ref}, {problem}; the references must be UTF-8 text (convert them, e.g. iconv -f latin1 -t utf-8)"
    expected = subset_size(data, subset) if data is not None and Path(data).is_dir() else None
    if expected is not None:
        n = len(read_reference_file(ref))
        if n != expected:
            return (f"{ref} has {n} lines, but the split {subset!r} of {data} has {expected} sentences: line i of the "
                    "references must be sentence i of the split; pass the plain-text target file of that split")
    return None


def option_value(argv: Sequence[str], *names: str) -> Optional[str]:
    """The last value of one of the options ``names`` in ``argv`` (as argparse takes it), or None."""
    value = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name:  # fairseq's --remove-bpe alone means subword_nmt
                value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else "subword_nmt"
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1:]
    return value


#: A dictionary's segmentation: fairseq-generate's ``--remove-bpe`` that joins its entries back into words (None:
#: they are words, printed as they are) and what its entries look like.
SEGMENTATIONS = {
    "sentencepiece": ("sentencepiece", "SentencePiece pieces ('\u2581' starts a word)"),
    "subword_nmt": ("subword_nmt", "subword-nmt pieces ('@@' ends a piece that a word goes on from)"),
    "words": (None, "whole words (no '\u2581' or '@@' pieces)"),
}


@dataclass(frozen=True)
class Segmentation:
    """How the target side of a data-bin is segmented (a key of :data:`SEGMENTATIONS`), read from ``dictionary``."""

    kind: str
    dictionary: Path

    @property
    def post_process(self) -> Optional[str]:
        return SEGMENTATIONS[self.kind][0]

    @property
    def entries(self) -> str:
        return SEGMENTATIONS[self.kind][1]

    def note(self) -> str:
        """The one line that says how the decode turns this segmentation into the text it scores."""
        how = (f"the decode joins them with --remove-bpe {self.post_process}" if self.post_process else
               "the decode scores them as they are (no --remove-bpe)")
        return f"{self.dictionary} holds {self.entries}: {how}"


def dictionary_segmentation(path: Path) -> Optional[str]:
    """How the fairseq dictionary ``path`` (``dict.*.txt``) segments text: 'sentencepiece' where a tenth of its
    entries start with '\u2581' (SentencePiece's mark of a word's start, on most of its pieces), 'subword_nmt' where
    one in twenty ends with '@@' (subword-nmt's mark of a piece a word goes on from), else 'words'; None where it
    cannot be read or is empty."""
    try:
        with open(path, encoding="utf-8") as f:
            entries = [line.split(" ", 1)[0] for line in f if line.strip()]
    except (OSError, UnicodeDecodeError):
        return None
    if not entries:
        return None
    starts = sum(e.startswith("\u2581") for e in entries)
    joins = sum(e.endswith("@@") for e in entries)
    if 10 * starts >= len(entries) and starts >= joins:
        return "sentencepiece"
    if 20 * joins >= len(entries):
        return "subword_nmt"
    return "words"


def data_segmentation(data: Path, fairseq_options: Sequence[str] = ()) -> Optional[Segmentation]:
    """How the target side of the data-bin ``data`` is segmented, read from its target dictionary (of the
    ``--target-lang`` among ``fairseq_options``, or of the language pair fairseq infers from the folder; where
    neither names one, the folder's dictionaries where they agree); None where no dictionary tells."""
    data = Path(data)
    if not data.is_dir():
        return None
    target = option_value(fairseq_options, "--target-lang", "-t")
    if target is None:
        from fairseq.data import data_utils

        target = data_utils.infer_language_pair(str(data))[1]
    named = data / f"dict.{target}.txt"
    paths = [named] if target is not None and named.is_file() else sorted(data.glob("dict.*.txt"))
    kinds = {dictionary_segmentation(path) for path in paths}
    if len(kinds) != 1 or None in kinds:
        return None
    return Segmentation(kinds.pop(), paths[0])


def post_process_problem(segmentation: Optional[Segmentation], fairseq_options: Sequence[str]) -> Optional[str]:
    """Why a ``--remove-bpe``/``--post-process`` among the further fairseq-generate options does not fit the
    data-bin's segmentation (SentencePiece's on a dictionary without its pieces removes every space, subword-nmt's on
    SentencePiece pieces leaves their marks in the text), or None."""
    given = option_value(fairseq_options, "--post-process", "--remove-bpe")
    if segmentation is None or given is None:
        return None
    given = "subword_nmt" if given == "@@ " else given
    if given == "sentencepiece" and segmentation.kind != "sentencepiece":
        effect = "removes every space of such a text, which makes each sentence one word and its BLEU near 0"
    elif given == "subword_nmt" and segmentation.kind == "sentencepiece":
        effect = "leaves their '\u2581' marks in every sentence scored"
    else:
        return None
    return (f"argument --remove-bpe {given} (after --): {segmentation.dictionary} holds {segmentation.entries}, and "
            f"--remove-bpe {given} {effect}; drop it: the decode picks the post-processing from the dictionary")


def binarized_references(config: DecodeConfig) -> Optional[List[str]]:
    """The target side of the split ``config.gen_subset`` of ``config.data`` as the decode's ``T-`` lines read (the
    target dictionary's strings, unknown words as ``<<unk>>``, the decode's ``--remove-bpe``/``--post-process``), for
    the language pair its options name or fairseq infers from the folder; None where that cannot be read here
    (no such pair, another format, a ``--bpe``/``--tokenizer`` decoder among the further options)."""
    cmd = config.fairseq_args()
    if option_value(cmd, "--bpe") or option_value(cmd, "--tokenizer"):
        return None
    return target_strings(config.data, config.gen_subset, option_value(cmd, "--post-process", "--remove-bpe"),
                          option_value(cmd, "--source-lang", "-s"), option_value(cmd, "--target-lang", "-t"))


def target_strings(data: Path, subset: str, post_process: Optional[str], src: Optional[str] = None,
                   tgt: Optional[str] = None) -> Optional[List[str]]:
    """The target side of the split ``subset`` of ``data`` as fairseq-generate prints its ``T-`` lines with
    ``--remove-bpe post_process`` (None: none), for the pair ``src``-``tgt`` or the one fairseq infers from the
    folder; None where it cannot be read here."""
    from fairseq.data import Dictionary, data_utils
    from fairseq.data.indexed_dataset import MMapIndexedDataset, infer_dataset_impl

    if src is None or tgt is None:
        src, tgt = data_utils.infer_language_pair(str(data))
    if src is None or tgt is None:
        return None
    for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
        prefix = str(Path(data) / f"{subset}.{pair}.{tgt}")
        dictionary = Path(data) / f"dict.{tgt}.txt"
        if not Path(prefix + ".idx").is_file() or not dictionary.is_file():
            continue
        try:
            if infer_dataset_impl(prefix) != "mmap":
                return None
            tokens = MMapIndexedDataset(prefix)
            target = Dictionary.load(str(dictionary))
            return [target.string(tokens[i].tolist(), post_process, escape_unk=True) for i in range(len(tokens))]
        except (OSError, AssertionError, ValueError, KeyError, IndexError, NotImplementedError):
            return None  # a damaged split: fairseq-generate says what is wrong with it
    return None


def saved_output_problem(parsed, output: Path, data: Path, subset: str) -> Optional[str]:
    """Why the sentences of a saved fairseq-generate output (``--from-output``) are not the plain text BLEU scores:
    its ``T-`` lines are the split's target joined with a ``--remove-bpe`` that does not fit the data-bin's
    segmentation (SentencePiece's on whole words or subword-nmt pieces, or none or subword-nmt's on SentencePiece
    pieces); None where they fit it or are not that split's target joined in any of these ways."""
    segmentation = data_segmentation(data)
    references = getattr(parsed, "references", None)
    if segmentation is None or not references:
        return None
    right = target_strings(data, subset, segmentation.post_process)
    if right is None or max(references) >= len(right):
        return None
    if all(references[i] == right[i] for i in references):
        return None
    wrong = ["sentencepiece"] if segmentation.kind != "sentencepiece" else [None, "subword_nmt"]
    for post_process in wrong:
        strings = target_strings(data, subset, post_process)
        if strings is not None and all(references[i] == strings[i] for i in references):
            used = f"--remove-bpe {post_process}" if post_process else "no --remove-bpe"
            fits = (f"--remove-bpe {segmentation.post_process}" if segmentation.post_process else
                    "no --remove-bpe")
            return (f"--from-output {output}: its T- lines are the split {subset!r} joined with {used}, but "
                    f"{segmentation.dictionary} holds {segmentation.entries}, which need {fits}: its sentences are "
                    "not the plain text BLEU scores; decode again with gradinit-evaluate-bleu, which picks "
                    "the post-processing from the dictionary")
    return None


def binarized_reference_problem(ref: Path, config: DecodeConfig) -> Optional[str]:
    """Which line of ``ref`` is not the sentence of the decoded split at its place (a line lost and another added
    keep the count but shift every line between them), or None; each ``<<unk>>`` of the binarized side stands for
    text within one word (:func:`~.bleu_score.same_reference`)."""
    binarized = binarized_references(config)
    data, subset = config.data, config.gen_subset
    if binarized is None:
        return None
    lines = read_reference_file(ref)
    for i, (line, t_line) in enumerate(zip(lines, binarized)):
        if not same_reference(line, t_line):
            return (f"line {i + 1} of {ref} is not sentence {i} of the split {subset!r} of {data} (the file has "
                    f"{line[:60]!r}, the split {t_line[:60]!r}): line i of the references must be sentence i of the "
                    "split; pass the plain-text target file of that split")
    return None


def check_paths(args) -> None:
    """Before any work: sacreBLEU scores with ``--tokenize``/``--lowercase``, the files read are readable text,
    ``--ref`` has one line per sentence of the split (when the split is translated here), and no file written is
    an input or a file of another kind (``ArgumentProblem``)."""
    problem = scoring_problem(args.tokenize, args.lowercase, args.metric)
    if problem:
        raise ArgumentProblem(problem)
    if args.ref is not None:
        problem = reference_problem(args.ref, None if args.from_output is not None else args.data, args.gen_subset)
        if problem:
            raise ArgumentProblem(f"argument --ref: {problem}")
    if args.from_output is not None and args.from_output.is_file():
        problem = utf8_problem(args.from_output)
        if problem:
            raise ArgumentProblem(f"argument --from-output: {args.from_output}, {problem}; give the text that "
                                  "fairseq-generate printed (saved with --save-output)")
    inputs = {"data": args.data, "--path": args.path, "--ref": args.ref, "--from-output": args.from_output}
    out_json = args.output_json
    if out_json is None and args.path is not None and args.from_output is None:
        out_json = default_json_path(args.path, args.gen_subset)
    try:
        if out_json is not None:
            check_output("--output-json", out_json, json_result("a BLEU result of gradinit-evaluate-bleu", "bleu",
                                                                command=COMMAND), inputs=inputs)
        if args.save_output is not None:
            check_output("--save-output", args.save_output,
                         text_output("fairseq-generate's output saved by gradinit-evaluate-bleu", COMMAND),
                         inputs=inputs)
        if args.progress_json is not None:
            check_output("--progress-json", args.progress_json,
                         json_result("a decode rate of gradinit-evaluate-bleu", "sentences_done", command=COMMAND),
                         inputs=inputs)
    except OutputError as e:
        raise ArgumentProblem(str(e)) from None
