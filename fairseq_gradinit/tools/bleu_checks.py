"""gradinit-evaluate-bleu's checks before any work: the data folder, the split, the checkpoint, the references and
the files it writes (:class:`ArgumentProblem`, reported as argparse reports its own errors)."""
from __future__ import annotations

import zipfile
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


def binarized_references(config: DecodeConfig) -> Optional[List[str]]:
    """The target side of the split ``config.gen_subset`` of ``config.data`` as the decode's ``T-`` lines read (the
    target dictionary's strings, unknown words as ``<<unk>>``, the decode's ``--remove-bpe``/``--post-process``), for
    the language pair its options name or fairseq infers from the folder; None where that cannot be read here
    (no such pair, another format, a ``--bpe``/``--tokenizer`` decoder among the further options)."""
    from fairseq.data import Dictionary, data_utils
    from fairseq.data.indexed_dataset import MMapIndexedDataset, infer_dataset_impl

    cmd, data, subset = config.fairseq_args(), config.data, config.gen_subset
    if option_value(cmd, "--bpe") or option_value(cmd, "--tokenizer"):
        return None
    src, tgt = option_value(cmd, "--source-lang", "-s"), option_value(cmd, "--target-lang", "-t")
    if src is None or tgt is None:
        src, tgt = data_utils.infer_language_pair(str(data))
    if src is None or tgt is None:
        return None
    post_process = option_value(cmd, "--post-process", "--remove-bpe")
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


def binarized_reference_problem(ref: Path, config: DecodeConfig) -> Optional[str]:
    """Which line of ``ref`` is not the sentence of the decoded split at its place (a line lost and another added
    keep the count but shift every line between them), or None; each ``<<unk>>`` of the binarized side stands for
    any text (:func:`~.bleu_score.same_reference`)."""
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
