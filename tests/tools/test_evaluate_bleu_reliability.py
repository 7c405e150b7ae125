"""scripts/evaluate_bleu.py refuses a --ref file of another split, and
bad inputs (split, truncated checkpoint, the data-bin's parent, --user-dir) get one message each.
docs/reliability.md ('Plugin, BLEU and study') maps each case here."""
import json
import re

import pytest

pytest.importorskip("fairseq")

from fairseq_helpers import REPO  # noqa: E402
from fairseq_train import TINY_MODEL, train_inprocess  # noqa: E402


from fairseq_gradinit.tools import evaluate_bleu  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint(tiny_data, tmp_path_factory):
    """An untrained tiny translation_gradinit model (one update at lr 0)."""
    save = tmp_path_factory.mktemp("bleu-ckpt")
    train_inprocess([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "0", "--max-update", "1",
                     "--save-dir", str(save), "--no-save-optimizer-state"])
    return save / "checkpoint_last.pt"


FAST = ["--cpu", "--batch-size", "40", "--beam", "1", "--user-dir", "gradinit", "--", "--max-len-a", "0",
        "--max-len-b", "3"]


def test_ref_file_of_another_split_is_refused(tiny_data, checkpoint, tmp_path, capsys):
    raw = tiny_data.parent  # make_tiny_bin wrote the plain-text splits beside bin/
    saved = tmp_path / "gen.txt"
    rc = evaluate_bleu.main([str(tiny_data), "--path", str(checkpoint), "--ref", str(raw / "test.en"),
                             "--save-output", str(saved), "--output-json", str(tmp_path / "ok.json"), *FAST])
    assert rc == 0 and json.loads((tmp_path / "ok.json").read_text())["references"] == str(raw / "test.en")
    capsys.readouterr()
    rc = evaluate_bleu.main([str(tiny_data), "--from-output", str(saved), "--ref", str(raw / "valid.en"),
                             "--output-json", str(tmp_path / "bad.json")])
    err = capsys.readouterr().err
    assert rc == 1 and not (tmp_path / "bad.json").exists()
    assert f"error: --ref {raw / 'valid.en'}: " in err
    assert re.search(r"(\d\d) of \1 lines differ from the references in the binarized subset", err), err
    assert "pass the plain-text target file of the split given as --gen-subset" in err


def test_same_reference_tolerates_unknowns_and_tokenization():
    assert evaluate_bleu.same_reference("Don't remove the <file>!", "don &apos;t remove the <<unk>> !")
    assert not evaluate_bleu.same_reference("Remove the file.", "Keep the <<unk>>.")


def _refusal(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        evaluate_bleu.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err and err.count("error:") == 1, err
    return err


def test_bad_inputs_are_one_argument_error_before_generate(tiny_data, checkpoint, tmp_path, capsys):
    err = _refusal([str(tiny_data), "--path", str(checkpoint), "--gen-subset", "tst"], capsys)
    assert "error: argument --gen-subset: invalid choice 'tst': " in err and "test, train, valid" in err
    err = _refusal([str(tiny_data.parent), "--path", str(checkpoint)], capsys)
    assert (f"error: argument data: {tiny_data.parent} holds no fairseq data-bin (no dict.*.txt); its subfolder "
            f"{tiny_data} is one: pass {tiny_data}") in err
    cut = tmp_path / "cut.pt"
    cut.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    err = _refusal([str(tiny_data), "--path", str(cut)], capsys)
    assert f"error: argument --path: {cut} is truncated or damaged" in err
    err = _refusal([str(tiny_data), "--path", str(checkpoint), "--user-dir", str(tmp_path / "nope")], capsys)
    assert f"error: argument --user-dir: {tmp_path / 'nope'} is not a directory" in err


def test_user_dir_accepts_the_path_fairseq_train_took(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # 'fairseq_gradinit' relative to the repository, run from elsewhere
    for given in ("fairseq_gradinit", "gradinit", str(REPO / "fairseq_gradinit"), "../x/fairseq_gradinit"):
        assert evaluate_bleu.resolve_user_dir(given) == REPO / "fairseq_gradinit"


def test_a_failing_generate_shows_its_traceback_once(tiny_data, tmp_path, capsys):
    import torch

    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)  # a complete file, but no fairseq checkpoint
    rc = evaluate_bleu.main([str(tiny_data), "--path", str(foreign), "--cpu", "--output-json",
                             str(tmp_path / "b.json")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("Traceback (most recent call last)") == 1, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("error: fairseq-generate failed (exit 1): ")


@pytest.mark.parametrize("case", ["a line missing", "not UTF-8", "binary --from-output"])
def test_unusable_references_and_outputs_are_refused_before_generate(tiny_data, tmp_path, monkeypatch, capsys, case):
    """References that cannot be the split's line for line, or are not text, and a generate output that is not
    text: one argument error before fairseq-generate starts (before: a UnicodeDecodeError traceback, or a
    shifted --ref scored after the whole decode)."""
    monkeypatch.setattr(evaluate_bleu, "run_generate", lambda *a, **k: pytest.fail("fairseq-generate was started"))
    lines = (tiny_data.parent / "test.en").read_text(encoding="utf-8").splitlines()
    ckpt = tmp_path / "checkpoint.pt"
    ckpt.write_bytes(b"")
    ref = tmp_path / "ref.en"
    if case == "a line missing":
        ref.write_text("\n".join(lines[1:]) + "\n", encoding="utf-8")
        argv = [str(tiny_data), "--path", str(ckpt), "--ref", str(ref), "--cpu"]
        expected = (f"error: argument --ref: {ref} has {len(lines) - 1} lines, but the split 'test' of {tiny_data} has "
                    f"{len(lines)} sentences: line i of the references must be sentence i of the split")
    elif case == "not UTF-8":
        ref.write_bytes(b"ok\n" + "d\u00e9j\u00e0 vu".encode("latin-1") + b"\n")
        argv = [str(tiny_data), "--path", str(ckpt), "--ref", str(ref), "--cpu"]
        expected = f"error: argument --ref: {ref}, line 2: byte 0xe9 at byte 2 of the line is not UTF-8"
    else:
        ckpt.write_bytes(b"PK\x03\x04\x80\x81binary")
        argv = [str(tiny_data), "--from-output", str(ckpt), "--output-json", str(tmp_path / "bleu.json")]
        expected = f"error: argument --from-output: {ckpt}, line 1: byte 0x80 at byte 5 of the line is not UTF-8"
    err = _refusal(argv, capsys)
    assert expected in err, err


def test_a_lone_cr_inside_a_reference_stays_in_its_sentence(tiny_data, tmp_path):
    """--ref is split at line feeds only: a lone CR (or a Unicode line separator) inside a sentence stays in
    it (before: universal newlines split it, which shifted every later reference by one); CRLF line ends
    read as LF ones."""
    lines = (tiny_data.parent / "test.en").read_text(encoding="utf-8").splitlines()
    with_cr = [lines[0][:3] + "\r" + lines[0][3:], lines[1] + "\u2028x", *lines[2:]]
    ref = tmp_path / "ref.en"
    ref.write_bytes(("\n".join(with_cr) + "\n").encode("utf-8"))
    assert evaluate_bleu.read_reference_file(ref) == with_cr
    assert evaluate_bleu.reference_problem(ref, tiny_data, "test") is None
    crlf = tmp_path / "crlf.en"
    crlf.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))
    assert evaluate_bleu.read_reference_file(crlf) == lines


def test_a_scoring_option_sacrebleu_refuses_stops_before_the_decode(tiny_data, tmp_path, monkeypatch, capsys):
    """--tokenize with a tokenizer sacreBLEU does not have, or cannot run here: one argument error before the
    decode starts (before: a KeyError traceback once the whole split was decoded)."""
    import torch

    started = []
    monkeypatch.setattr(evaluate_bleu, "run_generate", lambda *a, **k: started.append(a) or pytest.fail("decoded"))
    ckpt = tmp_path / "checkpoint.pt"
    torch.save({"model": {}}, ckpt)  # passes the checks of the inputs: only the option can stop it
    argv = [str(tiny_data), "--path", str(ckpt), "--cpu", "--output-json", str(tmp_path / "b.json")]
    err = _refusal([*argv, "--tokenize", "nosuch"], capsys)
    assert "error: argument --tokenize: sacreBLEU has no tokenizer 'nosuch'; choose one of " in err and "13a" in err
    try:
        import MeCab  # noqa: F401
    except ImportError:  # sacreBLEU's ja-mecab needs it: its own reason, on one line
        err = _refusal([*argv, "--tokenize", "ja-mecab"], capsys)
        assert "error: argument --tokenize: sacreBLEU cannot tokenize with 'ja-mecab': " in err
        assert "pip install sacrebleu[ja]" in err.splitlines()[-1]
    assert started == [] and not (tmp_path / "b.json").exists()


def test_a_fairseq_scorer_that_cannot_be_built_stops_before_the_model_loads(tiny_data, tmp_path, monkeypatch):
    """fairseq's own scorer (--scoring, after --) is built before the ensemble and the split load, and its
    failure is one line (before: fairseq's traceback after the start-up)."""
    pytest.importorskip("sacrebleu")
    try:
        import MeCab  # noqa: F401
        pytest.skip("MeCab is installed: sacreBLEU's ja-mecab tokenizer can be built here")
    except ImportError:
        pass
    from fairseq import checkpoint_utils

    from fairseq_gradinit.tools.bleu_decode import DecodeConfig
    from fairseq_gradinit.tools.inprocess_generate import ArgumentsRefused, SplitDecoder

    loaded = []
    monkeypatch.setattr(checkpoint_utils, "load_model_ensemble", lambda *a, **k: loaded.append(a) or pytest.fail("loaded"))
    with pytest.raises(ArgumentsRefused) as exc:
        SplitDecoder(DecodeConfig(tiny_data, tmp_path / "model.pt", cpu=True,
                                  fairseq_options=("--scoring", "sacrebleu", "--sacrebleu-tokenizer", "ja-mecab")))
    assert str(exc.value).startswith("--scoring sacrebleu: RuntimeError: Japanese tokenization requires extra")
    assert "\n" not in str(exc.value) and exc.value.code == 1 and loaded == []


def test_a_ref_with_a_line_lost_and_one_added_is_refused_before_the_decode(tiny_data, tmp_path, monkeypatch, capsys):
    """--ref with the right count but a sentence lost and another added: compared line for line with the split's
    binarized target side before the decode, and refused naming the first shifted line (before: accepted and
    scored against shifted references, as fewer than half of the lines differed). The split's own target file
    passes the check."""
    import torch

    class Decoded(Exception):
        pass

    def decode(*args, **kwargs):
        started.append(args)
        raise Decoded

    started = []
    monkeypatch.setattr(evaluate_bleu, "run_generate", decode)
    ckpt = tmp_path / "checkpoint.pt"
    torch.save({"model": {}}, ckpt)
    lines = (tiny_data.parent / "test.en").read_text(encoding="utf-8").splitlines()
    ref = tmp_path / "ref.en"
    ref.write_text("\n".join(lines[:3] + lines[4:] + ["A sentence of another file."]) + "\n", encoding="utf-8")
    argv = [str(tiny_data), "--path", str(ckpt), "--cpu", "--output-json", str(tmp_path / "b.json")]
    err = _refusal([*argv, "--ref", str(ref)], capsys)
    assert (f"error: argument --ref: line 4 of {ref} is not sentence 3 of the split 'test' of {tiny_data} (the file "
            f"has {lines[4][:60]!r}, the split ") in err, err
    assert "line i of the references must be sentence i of the split" in err and started == []
    with pytest.raises(Decoded):  # the split's own target file goes on to the decode
        evaluate_bleu.main([*argv, "--ref", str(tiny_data.parent / "test.en")])
    assert len(started) == 1


def _dictionary_bin(root, name, entries):
    """A folder with only a target dictionary of ``entries`` (what the segmentation is read from)."""
    data = root / name
    data.mkdir()
    (data / "dict.en.txt").write_text("".join(f"{e} {100 - i}\n" for i, e in enumerate(entries)), encoding="utf-8")
    (data / "dict.de.txt").write_text((data / "dict.en.txt").read_text(encoding="utf-8"), encoding="utf-8")
    return data


def test_the_post_processing_follows_the_dictionarys_segmentation(tiny_data, tmp_path, monkeypatch, capsys):
    """--remove-bpe follows the target dictionary: sentencepiece for '▁' pieces, subword_nmt for '@@' pieces, none
    for words, said in one line (before: sentencepiece always, which removed every space of a word-level or
    subword-nmt split: one word per sentence, BLEU near 0, and the reference check passed); a --remove-bpe after --
    that does not fit is refused before the decode."""
    parser = evaluate_bleu.build_parser()
    kinds = {"sentencepiece": ["\u2581the", "\u2581file", "s", "\u2581open", "ed"],
             "subword_nmt": ["the", "fi@@", "le", "open@@", "ed", "a", "b", "c"],
             "words": ["the", "file", "opened", "e-mail", "a@@b"]}
    for kind, entries in kinds.items():
        data = _dictionary_bin(tmp_path, kind, entries)
        assert evaluate_bleu.data_segmentation(data).kind == kind
        args = parser.parse_args([str(data), "--path", "ck.pt", "--cpu"])
        cmd = evaluate_bleu.decode_config(args, [], cuda=False).fairseq_args()
        expected = {"sentencepiece": ["--remove-bpe", "sentencepiece"], "subword_nmt": ["--remove-bpe", "subword_nmt"],
                    "words": []}[kind]
        assert [a for a in cmd if a in ("--remove-bpe", "sentencepiece", "subword_nmt")] == expected, cmd

    class Decoded(Exception):
        pass

    configs = []

    def decode(config, *args, **kwargs):
        configs.append(config)
        raise Decoded

    monkeypatch.setattr(evaluate_bleu, "run_generate", decode)
    import torch

    ckpt = tmp_path / "checkpoint.pt"
    torch.save({"model": {}}, ckpt)
    argv = [str(tiny_data), "--path", str(ckpt), "--cpu", "--output-json", str(tmp_path / "b.json")]
    with pytest.raises(Decoded):
        evaluate_bleu.main(argv)
    err = capsys.readouterr().err
    assert (f"evaluate_bleu: {tiny_data / 'dict.en.txt'} holds whole words (no '\u2581' or '@@' pieces): the decode "
            "scores them as they are (no --remove-bpe)") in err, err
    assert configs[0].post_process is None and "--remove-bpe" not in configs[0].fairseq_args()
    err = _refusal([*argv, "--", "--remove-bpe", "sentencepiece"], capsys)
    assert (f"error: argument --remove-bpe sentencepiece (after --): {tiny_data / 'dict.en.txt'} holds whole words "
            "(no '\u2581' or '@@' pieces), and --remove-bpe sentencepiece removes every space of such a text") in err
    assert len(configs) == 1
    with pytest.raises(Decoded):  # one that fits is the user's to give
        evaluate_bleu.main([*argv, "--", "--remove-bpe", "subword_nmt"])
    assert len(configs) == 2


def _saved_output(path, references, hypotheses=None):
    hypotheses = references if hypotheses is None else hypotheses
    lines = [f"T-{i}\t{t}\nH-{i}\t-0.5\t{h}\n" for i, (t, h) in enumerate(zip(references, hypotheses))]
    path.write_text("".join(lines), encoding="utf-8")
    return path


def test_a_saved_output_joined_with_another_segmentations_post_processing_is_refused(tiny_data, tmp_path, capsys):
    """--from-output of a decode whose T- lines are the split joined with --remove-bpe sentencepiece on a word-level
    data-bin: refused naming the dictionary (before: scored, BLEU of sentences without spaces); the same output
    joined as the dictionary needs is scored."""
    from fairseq_gradinit.tools.bleu_checks import target_strings

    joined = _saved_output(tmp_path / "joined.txt", target_strings(tiny_data, "test", "sentencepiece"))
    rc = evaluate_bleu.main([str(tiny_data), "--from-output", str(joined), "--output-json", str(tmp_path / "j.json")])
    err = capsys.readouterr().err
    assert rc == 1 and not (tmp_path / "j.json").exists()
    assert (f"error: --from-output {joined}: its T- lines are the split 'test' joined with --remove-bpe sentencepiece, "
            f"but {tiny_data / 'dict.en.txt'} holds whole words (no '\u2581' or '@@' pieces), which need no "
            "--remove-bpe") in err, err
    plain = _saved_output(tmp_path / "plain.txt", target_strings(tiny_data, "test", None))
    rc = evaluate_bleu.main([str(tiny_data), "--from-output", str(plain), "--output-json", str(tmp_path / "p.json")])
    assert rc == 0 and json.loads((tmp_path / "p.json").read_text())["bleu"] == 100.0


def test_a_ref_with_a_line_lost_and_one_added_is_refused_when_scoring_a_saved_output(tiny_data, tmp_path, capsys):
    """--from-output with a --ref of the right count whose line 6 was lost and a line added after line 8: four of 40
    lines differ, and the first is named (before: scored, as fewer than half of the lines differed). The split's own
    target file passes. The saved T- lines are the plain sentences (a dictionary that knows every word)."""
    lines = (tiny_data.parent / "test.en").read_text(encoding="utf-8").splitlines()
    saved = _saved_output(tmp_path / "gen.txt", lines)
    ref = tmp_path / "ref.en"
    ref.write_text("\n".join(lines[:5] + lines[6:9] + ["A sentence of another file."] + lines[9:]) + "\n",
                   encoding="utf-8")
    argv = [str(tiny_data), "--from-output", str(saved), "--output-json", str(tmp_path / "b.json")]
    rc = evaluate_bleu.main([*argv, "--ref", str(ref)])
    err = capsys.readouterr().err
    assert rc == 1 and not (tmp_path / "b.json").exists()
    assert (f"error: --ref {ref}: 4 of 40 lines differ from the references in the binarized subset, the first at line 6 "
            f"(sample 5: the file has {lines[6][:60]!r}") in err, err
    assert evaluate_bleu.main([*argv, "--ref", str(tiny_data.parent / "test.en")]) == 0


def test_the_line_check_keeps_duplicates_and_real_references_and_bounds_unknown_words():
    """Line for line: a test set with repeated sentences and references that differ from the binarized target only
    in what tokenization, case, Unicode forms and unknown words change pass; the same set with one repeat lost and
    another added is refused; an unknown word stands for text within one word (before: for any text, so a T- line of
    unknown words matched every reference)."""
    from fairseq_gradinit.tools.bleu_score import GenerateOutput

    t_lines = ["thank you .", "open the <<unk>>", "thank you .", "Ｆｉｌｅ  saved", "don &apos;t <<unk>> it !"]
    refs = ["Thank you.", "Open the café", "Thank you.", "File saved", "Don't save it!"]
    parsed = GenerateOutput(references=dict(enumerate(t_lines)))
    assert evaluate_bleu.reference_mismatch(parsed, refs) is None
    shifted = [refs[0], refs[1], refs[3], refs[4], "Thank you."]
    assert "3 of 5 lines differ" in evaluate_bleu.reference_mismatch(parsed, shifted)
    assert evaluate_bleu.same_reference("Facebook profile picture", "<<unk>> <<unk>> <<unk>>")
    assert evaluate_bleu.same_reference("Facebook profile picture", "<<unk>><<unk>><<unk>>")  # spaces removed
    assert not evaluate_bleu.same_reference("Loads the paragraph styles", "<<unk>> <<unk>> <<unk>>")
    assert not evaluate_bleu.same_reference("Open the new file", "open the <<unk>>")
