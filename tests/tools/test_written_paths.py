"""Every command that writes refuses a path that is one of its inputs (compared resolved: symlinks and
hard links followed) or an existing file of another kind, before any work, with one argument error
(exit status 2), and leaves the input as it was. docs/reliability.md ("Paths a command writes") maps
each case here."""
import json
import os
from pathlib import Path

import pytest

CHECKPOINT_BYTES = b"PK\x03\x04" + bytes(range(256)) * 4  # a zip (torch.save) header, then binary data


def _checkpoint(path: Path) -> Path:
    path.write_bytes(CHECKPOINT_BYTES)
    return path


def _data_bin(path: Path, *splits: str) -> Path:
    path.mkdir()
    for name in ("dict.de.txt", "dict.en.txt"):
        (path / name).write_text("a 1\n")
    for split in splits:
        (path / f"{split}.de-en.de.idx").write_bytes(b"")
    return path


def test_the_check_follows_links_and_tells_the_kind_of_an_existing_file(tmp_path):
    from fairseq_gradinit.files.paths import FOLDER, OutputError, check_output, json_result

    ckpt = _checkpoint(tmp_path / "checkpoint.pt")
    (tmp_path / "link.json").symlink_to(ckpt)
    os.link(ckpt, tmp_path / "hard.json")
    result = json_result("a BLEU result", "bleu")
    for path in (ckpt, tmp_path / "link.json", tmp_path / "hard.json", tmp_path / "sub" / ".." / "checkpoint.pt"):
        with pytest.raises(OutputError, match=r"is (a link to )?the input --path .*: writing it would destroy that "
                                              r"input; give --output-json another path"):
            check_output("--output-json", path, result, inputs={"--path": ckpt})
    copy = _checkpoint(tmp_path / "copy.json")  # not an input, but a file of another kind
    with pytest.raises(OutputError, match="exists and it holds binary data; this command writes a BLEU result"):
        check_output("--output-json", copy, result)
    (tmp_path / "gradinit.json").write_text(json.dumps({"scales": {}, "fingerprint": {}}))
    with pytest.raises(OutputError, match=r"its keys are \['fingerprint', 'scales'\], not those of a BLEU result"):
        check_output("--output-json", tmp_path / "gradinit.json", result)
    with pytest.raises(OutputError, match="exists and it is a folder"):
        check_output("--output-json", tmp_path, result)
    (tmp_path / "earlier.json").write_text(json.dumps({"bleu": 1.0}))  # a result of the same command: rerun
    (tmp_path / "empty.json").write_text("")
    for fine in ("earlier.json", "empty.json", "new.json"):
        check_output("--output-json", tmp_path / fine, result, inputs={"--path": ckpt})
    corpus = tmp_path / "out" / "bin"
    corpus.mkdir(parents=True)  # a folder whose part the command replaces holds an input
    with pytest.raises(OutputError, match=r"--out .* \(its bin\) holds the input corpus_dir"):
        check_output("--out", tmp_path / "out", FOLDER, inputs={"corpus_dir": corpus / "raw"}, writes=("bin",))


def test_gradinit_report_never_writes_over_its_gradinit_json_and_its_help_exits_0(tmp_path, capsys):
    from fairseq_gradinit.tools import gradinit_report

    run = tmp_path / "run"
    run.mkdir()
    scales = run / "gradinit.json"
    scales.write_text(json.dumps({"scales": {"w": 0.5}}))
    before = scales.read_bytes()
    with pytest.raises(SystemExit) as exc:
        gradinit_report.main(["--gradinit-json", str(scales), "--out", str(run / "gradinit"), "--", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and scales.read_bytes() == before
    assert f"error: --out {run / 'gradinit.json'} is the input --gradinit-json {scales}: writing it would destroy " \
        "that input" in err, err
    with pytest.raises(SystemExit) as exc:
        gradinit_report.main(["--help"])
    assert exc.value.code == 0 and "--gradinit-json" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["output-json is --path", "save-output is --ref", "output-json is a folder",
                                  "progress-json is a link to --ref"])
def test_evaluate_bleu_refuses_to_write_over_its_inputs(tmp_path, capsys, case):
    from fairseq_gradinit.tools import evaluate_bleu

    data = _data_bin(tmp_path / "bin", "test")
    ckpt = _checkpoint(tmp_path / "checkpoint_best.pt")
    ref = tmp_path / "test.en"
    ref.write_text("a\n")
    (tmp_path / "ref-link").symlink_to(ref)
    (tmp_path / "results").mkdir()
    flag, path = {"output-json is --path": ("--output-json", ckpt), "save-output is --ref": ("--save-output", ref),
                  "output-json is a folder": ("--output-json", tmp_path / "results"),
                  "progress-json is a link to --ref": ("--progress-json", tmp_path / "ref-link")}[case]
    with pytest.raises(SystemExit) as exc:
        evaluate_bleu.main([str(data), "--path", str(ckpt), "--ref", str(ref), "--cpu", flag, str(path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err and err.count("error:") == 1, err
    assert f"error: {flag} {path} " in err and ("is a folder" in err if "folder" in case else "the input" in err), err
    assert ckpt.read_bytes() == CHECKPOINT_BYTES and ref.read_text() == "a\n"


def test_plot_curves_and_study_table_refuse_outputs_that_are_inputs_or_other_files(tmp_path, capsys):
    from fairseq_gradinit.tools import plot_curves
    from lab import study_table

    log = tmp_path / "runs.md"
    log.write_text("2026-11-27 10:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.5 | "
                   "num_updates 2\n")
    assert plot_curves.main(["--run", f"a={log}", "--out", str(tmp_path / "runs"), "--no-png"]) == 2
    assert f"error: --out {tmp_path / 'runs.md'} is the input --run {log}" in capsys.readouterr().err
    (tmp_path / "curves.json").write_text(json.dumps({"scales": {}}))  # another command's JSON
    assert plot_curves.main(["--run", f"a={log}", "--out", str(tmp_path / "curves"), "--no-png"]) == 2
    assert "its keys are ['scales'], not those of curves of gradinit-plot-curves" in capsys.readouterr().err
    assert log.read_text().startswith("2026") and json.loads((tmp_path / "curves.json").read_text()) == {"scales": {}}

    study = tmp_path / "study"
    study.mkdir()
    (study / "curves.csv").write_text("arm,num_updates,valid_loss\n")
    before = (study / "curves.csv").read_bytes()
    assert study_table.main([str(study), "--md", str(study / "curves.csv")]) == 2
    assert f"study_table: error: --md {study / 'curves.csv'} is the input study_dir" in capsys.readouterr().err
    assert (study / "curves.csv").read_bytes() == before


def test_valid_loss_modes_refuses_to_write_over_its_checkpoint(tmp_path, capsys):
    pytest.importorskip("fairseq")
    from fairseq_gradinit.tools import valid_loss_modes

    data = _data_bin(tmp_path / "bin", "valid")
    ckpt = _checkpoint(tmp_path / "checkpoint_last.pt")
    with pytest.raises(SystemExit) as exc:
        valid_loss_modes.main([str(data), "--path", str(ckpt), "--output-json", str(ckpt)])
    assert exc.value.code == 2 and ckpt.read_bytes() == CHECKPOINT_BYTES
    assert f"error: --output-json {ckpt} is the input --path {ckpt}" in capsys.readouterr().err


def test_prepare_corpus_never_replaces_a_folder_that_holds_its_corpus(tmp_path, caplog):
    from fairseq_gradinit.tools import prepare_corpus

    corpus = tmp_path / "out" / "bin"
    corpus.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            (corpus / f"{split}.{lang}").write_text("ein satz\nnoch einer\n")
    before = {p.name: p.read_bytes() for p in corpus.iterdir()}
    assert prepare_corpus.main([str(corpus), "--src", "de", "--tgt", "en", "--out", str(tmp_path / "out"),
                                "--overwrite", "--vocab-size", "20"]) == 2
    assert f"--out {tmp_path / 'out'} (its bin) is the input corpus_dir {corpus}" in caplog.text
    assert {p.name: p.read_bytes() for p in corpus.iterdir()} == before


def test_train_vision_output_dir_that_cannot_be_written_is_found_before_the_data(tmp_path, capsys):
    from fairseq_gradinit.tools.train_vision import cli

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    rc = cli.cli(["--dataset", "fashion-mnist", "--data-dir", str(tmp_path / "nothing-here"), "--model", "vgg19", "--width", "0.0625",
                  "--epochs", "1", "--output-dir", str(blocker / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and f"error: --output-dir {blocker / 'run'}: {blocker / 'run'} is below the file {blocker}, not a " \
        "folder; give a path you can write" in err, err
    assert "not found" not in err  # refused before the data is looked for


def test_every_row_of_the_doc_section_names_a_test_that_exists():
    """docs/reliability.md's section on the commands' paths: each item's test is a test function of the
    file it names (this file when it names none)."""
    import re

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "reliability.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Paths a command writes, and files it reads"):]
    rows = [line for line in section.splitlines() if line.startswith("  - test")]  # each item's test
    assert len(rows) >= 15
    previous = []
    for row in rows:
        cell = row.split(": ", 1)[1]
        names = re.findall(r"`(?:(tests/[\w./]+)::)?(test_\w+)`", cell) or previous
        assert names, row
        for file, name in names:
            source = (root / (file or "tests/tools/test_written_paths.py")).read_text(encoding="utf-8")
            assert f"def {name}(" in source, (file, name)
        previous = names
