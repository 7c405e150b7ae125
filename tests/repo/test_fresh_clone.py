"""The repository is self-contained: its corpus is what data/README.md says, and the README's quick start runs
from a fresh clone with no folder beside it, all three steps (at a tiny size)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_helpers import corpus_file

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_corpus_archive_matches_its_readme():
    """Every split in the archive has the line count and sha256 that data/README.md's table states."""
    rows = re.findall(r"^\| (\w+)\.(de|en) \| ([\d,]+) \| `([0-9a-f]{64})` \|$",
                      (REPO / "data" / "README.md").read_text(encoding="utf-8"), flags=re.M)
    assert len(rows) == 6
    for split, lang, pairs, sha in rows:
        data = corpus_file(split, lang)
        assert data.count(b"\n") == int(pairs.replace(",", "")), f"{split}.{lang}"
        assert hashlib.sha256(data).hexdigest() == sha, f"{split}.{lang}"


def quick_start_commands(readme: str) -> list:
    """The commands of the README's quick-start block, continuation lines joined, comments dropped."""
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line, comments=True) for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _with(argv: list, **values) -> list:
    """``argv`` with the value of each ``--flag`` (keyword ``flag`` with ``_`` for ``-``) replaced."""
    argv = list(argv)
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        argv[argv.index(flag) + 1] = str(value)
    return argv


def test_quick_start_runs_from_a_fresh_clone(tmp_path):
    """`git clone` of this commit into an empty folder, then the quick start's first two steps exactly as the
    README writes them, at a tiny size: the corpus cut to 300/40/40 pairs, 300 pieces, 2+2 layers, 2 GradInit
    iterations of 768 tokens, 3 updates."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    pytest.importorskip("sentencepiece")
    if importlib.util.find_spec("fairseq_cli") is None:
        pytest.skip("fairseq is not installed")
    head = subprocess.run([git, "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    clone = tmp_path / "clone"
    subprocess.run([git, "clone", "--quiet", "--no-checkout", str(REPO), str(clone)], check=True)
    subprocess.run([git, "-C", str(clone), "checkout", "--quiet", head], check=True)
    assert not (tmp_path / "shared").exists()

    commands = quick_start_commands((clone / "README.md").read_text(encoding="utf-8"))
    unpack, prepare, train, evaluate = commands[:4]
    assert unpack[0] == "tar" and prepare[:2] == ["python", "scripts/prepare_corpus.py"]
    assert train[0] == "fairseq-train" and evaluate[:2] == ["python", "scripts/evaluate_bleu.py"]
    env = dict(os.environ, PYTHONPATH=str(clone))

    def run(argv, timeout):
        proc = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stderr[-3000:]}"
        return proc.stdout + proc.stderr

    run(unpack, 120)
    assert (clone / evaluate[evaluate.index("--ref") + 1]).is_file()  # step 3's reference file
    corpus = clone / prepare[2]
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        for lang in ("de", "en"):
            path = corpus / f"{split}.{lang}"
            path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:n]))
    prepare_log = run([sys.executable, *_with(prepare[1:], vocab_size=300), "--workers", "1"], 300)
    log = run([str(BIN / "fairseq-train"), *_with(train[1:], max_update=3, gradinit_iters=2, max_tokens=512,
                                                          encoder_layers=2, decoder_layers=2)], 600)
    save = clone / train[train.index("--save-dir") + 1]
    assert (save / "gradinit.json").is_file() and (save / "checkpoint_last.pt").is_file()
    assert re.search(r"gradinit iter 2/2 \| .* \| \d+s elapsed, ETA 0s", log)
    assert "gradinit: 2 iterations (" in log
    # what the README says the quick start's health line says, and why
    # with Adam, gamma measured at the init: every iteration optimizes the loss after the simulated steps
    assert "gradinit: 2 iterations (2 objective, 0 constraint, 0 skipped)" in log
    # docs/run-output.md's example is a stored run of this size: a fresh one prints lines of the same shapes
    # (the training progress lines come with wall time, so their number varies)
    spec = importlib.util.spec_from_file_location("run_output_example", REPO / "scripts" / "run_output_example.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    shapes = lambda text: {example.shape(line) for line in example.plugin_lines(text)  # noqa: E731
                           if "training progress" not in line}
    assert shapes(log) == shapes(example.STORED.read_text(encoding="utf-8"))

    # step 3 as written: BLEU of the trained checkpoint against the raw test file, as JSON next to the checkpoint
    # (where the README's comment says), nothing in the repository's root
    bleu_log = run([sys.executable, *evaluate[1:]], 600)
    named = re.search(r"JSON next to the\s+#\s+checkpoint: (\S+)", (clone / "README.md").read_text(encoding="utf-8"))
    bleu = json.loads((clone / named.group(1)).read_text(encoding="utf-8"))
    assert isinstance(bleu["bleu"], float) and bleu["signature"].startswith("nrefs:1")
    assert not list(clone.glob("*.json")), list(clone.glob("*.json"))

    # the known third-party deprecation noise is hidden, fairseq's own lines are not (fairseq-train imports
    # torch.jit and fairseq's tasks before it loads the plugin: that warning and the tensorboardX hint stay there)
    assert "torch.jit.script" not in prepare_log and "torch.jit.script" not in bleu_log
    assert "tensorboardX" not in prepare_log and "tensorboardX" not in bleu_log
    # fairseq's configuration printouts and hydra's debug lines are at the debug level only; no line is long
    assert "Namespace(" not in prepare_log and "'common': {" not in bleu_log and "'common': {" not in log
    assert "DEBUG" not in prepare_log + log + bleu_log
    long = [line[:150] for line in (prepare_log + log + bleu_log).splitlines() if len(line) > 300]
    assert not long, long
    for noise in ("hydra.experimental", "version_base", "ConfigStore schema", "strict flag", "key_padding_mask",
                  "pin_memory", "torch.cuda.amp"):
        assert noise not in log and noise not in prepare_log, noise
    assert "| fairseq_cli.train | " in log and "| fairseq_cli.preprocess | " in prepare_log
    # every line of this package starts with "gradinit" (grep finds them all)
    ours = [line.split(" | ", 3) for line in log.splitlines() if " | fairseq_gradinit." in line]
    assert len(ours) > 10
    assert all(msg.startswith("gradinit") for _, _, _, msg in ours), ours


def test_readme_and_docs_commands_need_no_folder_outside_the_repository():
    """No command block of the README or docs/ reads ../shared or an absolute path of the development machine."""
    offenders = []
    docs = sorted((REPO / "docs").glob("*.md"))
    for path in [REPO / "README.md", *docs]:
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            for line in block.splitlines():
                if ("../shared" in line or "/work/" in line) and not line.lstrip().startswith("#"):
                    offenders.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
