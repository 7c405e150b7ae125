"""gradinit-demo: both runs end to end on a tiny corpus (numbers, plot, printout), a folder of the user's is
never written into, and the printed reading follows the numbers."""
import json
import math

from fairseq_helpers import small_corpus

from fairseq_gradinit.tools import demo


def _arms(x_loss, x_gap, g_loss, g_gap):
    return {"xavier": {"label": demo.ARMS["xavier"], "final_loss": x_loss, "final_src_gap": x_gap,
                       "last_update": 200},
            "gradinit": {"label": demo.ARMS["gradinit"], "final_loss": g_loss, "final_src_gap": g_gap,
                         "last_update": 200}}


def test_the_demo_trains_both_runs_and_reports_loss_and_source_gap(tmp_path, capfd):
    corpus = small_corpus(tmp_path, (("train", 300), ("valid", 40), ("test", 40)))
    out = tmp_path / "demo"
    argv = ["--corpus", str(corpus), "--out", str(out), "--vocab-size", "200", "--updates", "4",
            "--gradinit-iters", "2", "--valid-every", "2", "--valid-batches", "1", "--max-tokens", "512"]
    assert demo.main(argv) == 0
    printed = capfd.readouterr().out
    result = json.loads((out / "demo.json").read_text())
    for arm in demo.ARMS:
        rec = result["arms"][arm]
        assert sorted(map(int, rec["valid_loss"])) == [2, 4]
        assert math.isfinite(rec["final_loss"]) and math.isfinite(rec["final_src_gap"])
        assert f"{rec['final_loss']:.3f}" in printed
    assert "gradinit iter 2/2" in (out / "gradinit" / "train.log").read_text()
    assert "gradinit iter" not in (out / "xavier" / "train.log").read_text()
    assert (out / "demo.png").read_bytes()[:4] == b"\x89PNG"
    assert "source gap" in printed and "docs/no-warmup.md" in printed


def test_a_folder_with_the_users_files_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    assert demo.main(["--corpus", str(corpus), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "notes.txt" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_missing_corpus_is_named(tmp_path, capsys):
    assert demo.main(["--corpus", str(tmp_path / "nope.tar.xz"), "--out", str(tmp_path / "d")]) == 2
    assert "nope.tar.xz" in capsys.readouterr().err


def test_the_reading_follows_the_numbers():
    same = demo.reading(_arms(9.84, 0.01, 9.83, 0.0))
    assert same[0].startswith("Both runs are within 0.05") and "Neither run uses its source" in same[1]
    lower_no_source = demo.reading(_arms(9.84, 0.6, 9.30, 0.02))
    assert "0.54 bits per token lower" in lower_no_source[0]
    assert "does not use its source" in lower_no_source[1]
    both_use = demo.reading(_arms(9.84, 0.6, 9.30, 0.7))
    assert not any("source" in line and "not" in line for line in both_use[:-1])


def test_a_run_is_compared_only_with_stored_runs_of_its_settings(tmp_path):
    stored = demo.stored_runs()
    assert stored, "docs/demo-runs/ holds the stored demo runs"
    defaults = demo.build_parser().parse_args([])
    plan = demo.DemoPlan(out=tmp_path, corpus=tmp_path, updates=defaults.updates,
                         gradinit_iters=defaults.gradinit_iters, valid_every=defaults.valid_every,
                         max_tokens=defaults.max_tokens, valid_batches=defaults.valid_batches, seed=defaults.seed,
                         vocab_size=defaults.vocab_size)
    same = demo.comparable(stored, plan)
    assert same, "a stored run was made with the demo's defaults"
    losses = [r["arms"]["gradinit"]["final_loss"] for r in same]
    low, high = f"{min(losses):.2f}", f"{max(losses):.2f}"
    assert f"loss {low if low == high else low + '–' + high}," in demo.stored_range(same)
    assert demo.comparable(stored, demo.DemoPlan(**{**plan.__dict__, "updates": plan.updates + 1})) == []
