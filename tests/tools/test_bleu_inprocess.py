"""gradinit-evaluate-bleu decodes in its own process (fairseq's Python API): the same hypotheses, references,
fairseq BLEU line and sacreBLEU score as fairseq-generate run as a command, and no output scraping."""
import ast
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("fairseq")

from fairseq_helpers import REPO  # noqa: E402
from fairseq_train import TINY_MODEL, train_inprocess  # noqa: E402

from fairseq_gradinit.tools import evaluate_bleu  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tiny_data, tmp_path_factory):
    """A tiny translation_gradinit model at its initialization (one update at lr 0)."""
    save = tmp_path_factory.mktemp("inprocess-ckpt")
    train_inprocess([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "0", "--max-update", "1",
                     "--save-dir", str(save), "--no-save-optimizer-state"])
    return save / "checkpoint_last.pt"


def fairseq_generate_lines(cmd):
    """Reference: fairseq's own fairseq-generate (``fairseq_cli.generate``, not this package's host_generate) run
    as a command on ``cmd``'s arguments; its H-/T- lines by id (the first H line per id) and its BLEU line."""
    env = {**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "fairseq_cli.generate", *cmd[3:]], capture_output=True, text=True,
                         env=env, cwd=REPO, check=True).stdout
    hyps, refs, bleu = {}, {}, None
    for line in out.splitlines():
        kind, _, rest = line.partition("-")
        if kind == "H" and "\t" in rest:
            parts = rest.split("\t", 2)
            hyps.setdefault(int(parts[0]), parts[2] if len(parts) == 3 else "")
        elif kind == "T" and "\t" in rest:
            sid, text = rest.split("\t", 1)
            refs[int(sid)] = text
        elif line.startswith("Generate test with beam="):
            bleu = line.split(": ", 1)[1]
    return hyps, refs, bleu


def saved_lines(path):
    """The H-/T- lines that --save-output wrote, by id (first H per id)."""
    hyps, refs = {}, {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        kind, _, rest = line.partition("-")
        if kind == "H":
            sid, _, text = rest.split("\t", 2)
            hyps.setdefault(int(sid), text)
        elif kind == "T":
            sid, text = rest.split("\t", 1)
            refs[int(sid)] = text
    return hyps, refs


@pytest.mark.parametrize("settings", [
    ["--beam", "4", "--batch-size", "7", "--", "--lenpen", "0.6", "--max-len-a", "1.2", "--max-len-b", "10",
     "--nbest", "2"],
    ["--beam", "1", "--max-tokens", "150", "--", "--max-len-a", "1", "--max-len-b", "2", "--no-repeat-ngram-size", "2"],
])
def test_inprocess_decode_equals_fairseq_generate(tiny_data, checkpoint, tmp_path, capsys, settings):
    """The in-process decode gives fairseq-generate's hypotheses and references, sentence by sentence, its own BLEU
    line, and the sacreBLEU score and signature of those pairs; its generate_command is that reference command."""
    import sacrebleu

    out, saved = tmp_path / "bleu.json", tmp_path / "gen.txt"
    rc = evaluate_bleu.main([str(tiny_data), "--path", str(checkpoint), "--cpu", "--user-dir", "fairseq_gradinit",
                             "--output-json", str(out), "--save-output", str(saved), *settings])
    err = capsys.readouterr().err
    assert rc == 0, err[-3000:]
    result = json.loads(out.read_text())
    hyps, refs, fairseq_bleu = fairseq_generate_lines(result["generate_command"])
    assert len(hyps) == 40 and len(set(hyps.values())) > 5  # varied hypotheses: the comparison can fail
    assert saved_lines(saved) == (hyps, refs)
    ids = sorted(hyps)
    expected = sacrebleu.metrics.BLEU()
    score = expected.corpus_score([hyps[i] for i in ids], [[refs[i] for i in ids]])
    assert result["bleu"] == round(score.score, 4) and result["signature"] == str(expected.get_signature())
    assert result["fairseq_bleu"] == fairseq_bleu and result["n_sentences"] == 40
    assert result["decode"]["sentences_done"] == 40 and result["decode"]["source_tokens_per_s"] > 0
    # the saved output scores as the decode did (--from-output)
    again = tmp_path / "again.json"
    assert evaluate_bleu.main([str(tiny_data), "--from-output", str(saved), "--output-json", str(again)]) == 0
    assert json.loads(again.read_text())["bleu"] == result["bleu"]


def test_subset_size_and_source_sizes_come_from_fairseqs_dataset(tiny_data, checkpoint):
    from fairseq.data import data_utils

    from fairseq_gradinit.tools.inprocess_generate import SplitDecoder

    args = evaluate_bleu.build_parser().parse_args([str(tiny_data), "--path", str(checkpoint), "--cpu",
                                                    "--user-dir", "fairseq_gradinit"])
    decoder = SplitDecoder(evaluate_bleu.decode_config(args, []))
    source = data_utils.load_indexed_dataset(str(tiny_data / "test.de-en.de"), decoder.src_dict)
    assert decoder.source_sizes == [int(n) for n in source.sizes] and len(decoder.source_sizes) == 40
    assert evaluate_bleu.subset_size(tiny_data, "test") == 40 == len(source)
    assert evaluate_bleu.subset_size(tiny_data, "valid") == 40 and evaluate_bleu.subset_size(tiny_data, "nope") is None


def test_the_bleu_step_neither_runs_nor_scrapes_a_command():
    """No module of the BLEU step imports subprocess, struct or a thread queue, or matches H- lines of a stdout: the
    decode is fairseq's API in this process (parse_generate_output reads only a saved --from-output file)."""
    for name in ("evaluate_bleu", "bleu_decode", "bleu_score", "bleu_checks", "inprocess_generate"):
        source = (REPO / "fairseq_gradinit" / "tools" / f"{name}.py").read_text(encoding="utf-8")
        imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source))
                    if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
        imported |= {node.module for node in ast.walk(ast.parse(source))
                     if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
        assert not imported & {"subprocess", "struct", "queue"}, (name, imported)
        assert "Popen" not in source and "readline" not in source, name


def test_time_limit_stops_the_decode_where_it_is(tiny_data, checkpoint, tmp_path, capsys):
    """--time-limit stops the decode when it is reached, not only between batches (one long batch of the whole
    split here)."""
    out = tmp_path / "bleu.json"
    rc = evaluate_bleu.main([str(tiny_data), "--path", str(checkpoint), "--cpu", "--beam", "8", "--batch-size", "40",
                             "--user-dir", "gradinit", "--output-json", str(out), "--time-limit", "0.05", "--",
                             "--max-len-a", "3", "--max-len-b", "200", "--min-len", "150"])
    err = capsys.readouterr().err
    assert rc == 1 and "--time-limit 0.05 s reached" in err.strip().splitlines()[-1], err[-2000:]
    result = json.loads(out.read_text())
    assert result["bleu"] is None and result["decode"]["sentences_done"] == 0


def test_chrf_scores_the_decoded_sentences(tiny_data, checkpoint, tmp_path, capsys):
    """--metric chrf on a decode in this process: chrF of the saved hypotheses against their references, with
    sacreBLEU's chrF signature."""
    from sacrebleu.metrics import CHRF

    out, saved = tmp_path / "chrf.json", tmp_path / "gen.txt"
    rc = evaluate_bleu.main([str(tiny_data), "--path", str(checkpoint), "--cpu", "--user-dir", "gradinit",
                             "--beam", "2", "--metric", "chrf", "--output-json", str(out), "--save-output", str(saved),
                             "--", "--max-len-a", "0", "--max-len-b", "3"])
    assert rc == 0, capsys.readouterr().err[-3000:]
    result = json.loads(out.read_text())
    hyps, refs = saved_lines(saved)
    ids = sorted(hyps)
    expected = CHRF()
    assert result["chrf"] == round(expected.corpus_score([hyps[i] for i in ids], [[refs[i] for i in ids]]).score, 4)
    assert result["metric"] == "chrf" and result["signature"] == str(expected.get_signature())
    assert result["bleu"] is None and result["n_sentences"] == 40 and result["decode"]["sentences_done"] == 40
