"""The headline table of the converge preset, from stored studies: mean and spread over seeds, a verdict per seed
against the strongest warmup baseline's run of that seed with BLEU deciding, the best checkpoint's BLEU, and GradInit
arms compute-matched."""
import json

from lab.docs_tables.converge import best_update, converge_runs, headline_table

CURVE_HEAD = "arm,num_updates,valid_loss,valid_src_gap\n"


def _study(folder, arms, *, max_update=1000, bleu=None, args=None):
    folder.mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({
        "settings": {"max_update": max_update},
        "arms": {a: {"args": (args or {}).get(a, "")} for a in arms},
        "bleu": {"arms": bleu or {}}}))
    rows = [f"{a},{u},{loss},{gap}" for a, points in arms.items() for u, (loss, gap) in points.items()]
    (folder / "curves.csv").write_text(CURVE_HEAD + "\n".join(rows) + "\n")


def test_rows_are_arms_over_their_seeds_judged_by_bleu_against_the_warmup_run_of_the_seed(tmp_path):
    points = {500: (9.0, 1.0), 1000: (8.0, 2.0)}
    worse = {500: (9.0, 0.2), 1000: (7.5, 0.3)}  # a lower loss, no source use
    _study(tmp_path / "a", {"warmup": points, "warmup-s2": points, "gi-x": points, "gi-x-s2": worse,
                            "admin": points},
           bleu={"warmup": {"bleu": 2.0, "distinct_hypotheses": 1400}, "warmup-s2": {"bleu": 3.0},
                 "gi-x": {"bleu": 2.5, "distinct_hypotheses": 1300}, "gi-x-s2": {"bleu": 0.5},
                 "admin": {"bleu": 1.0}},
           args={"gi-x": "gi-x=--gradinit-iters 100", "gi-x-s2": "gi-x-s2=--gradinit-iters 100 --seed 2",
                 "warmup": "warmup=--warmup-updates 200", "warmup-s2": "warmup-s2=--warmup-updates 200 --seed 2"})
    table = headline_table([tmp_path / "a"])
    rows = {line.split(" | ")[0][3:-1]: line.split(" | ") for line in table.splitlines()[2:]}
    assert list(rows)[0] == "warmup"
    only = "the comparator (the only warmup baseline stored)"
    assert rows["warmup"][7] == f"s1: {only}; s2: {only}"
    assert rows["warmup"][1:4] == ["1, 2", "2.50 ± 0.50", "2.50 ± 0.50"]
    gi = rows["gi-x"]
    assert gi[3] == "1.50 ± 1.00"
    assert "s1: holds" in gi[7] and "s2: fails:" in gi[7] and "BLEU 0.50 below warmup-s2's 3.00" in gi[7]
    assert "source gap" in gi[7]
    # the phase's cost: 100 iterations x the benchmarked updates per iteration, rounded up to a validation
    assert "phase ≈" in gi[8]
    assert rows["admin"][7] == "s1: fails: BLEU 1.00 below warmup's 2.00"
    assert rows["admin"][8].strip(" |") == "–"


def test_the_best_checkpoint_is_the_lowest_validation_loss_and_only_runs_of_the_presets_length_count(tmp_path):
    assert best_update({"valid_loss": {500: 7.0, 750: 6.0, 1000: 7.5}}) == 500  # checkpoints every 500 only
    assert best_update({"valid_loss": {500: 7.0, 1000: 7.0}}) == 1000  # a tie: the later
    _study(tmp_path / "short", {"warmup": {500: (9.0, 1.0)}}, max_update=300)
    _study(tmp_path / "full", {"warmup": {500: (9.0, 1.0)}}, max_update=4500)
    assert [p.name for p in converge_runs(tmp_path, 4500)] == ["full"]


def test_the_comparator_is_the_warmup_baseline_with_the_highest_bleu_over_its_seeds(tmp_path):
    points = {500: (9.0, 1.0), 1000: (8.0, 2.0)}
    _study(tmp_path / "a", {"warmup": points, "warmup-s2": points, "admin": points, "admin-s2": points},
           bleu={"warmup": {"bleu": 0.4}, "warmup-s2": {"bleu": 0.6}, "admin": {"bleu": 5.0},
                 "admin-s2": {"bleu": 5.0}},
           args={"warmup": "warmup=--warmup-updates 200", "warmup-s2": "warmup-s2=--warmup-updates 200 --seed 2"})
    # a later study: a longer warmup, stronger on average (one seed below admin's BLEU, one above)
    _study(tmp_path / "b", {"warmup600": points, "warmup600-s2": points},
           bleu={"warmup600": {"bleu": 4.0}, "warmup600-s2": {"bleu": 7.0}},
           args={"warmup600": "warmup600=--warmup-updates 600",
                 "warmup600-s2": "warmup600-s2=--warmup-updates 600 --seed 2"})
    table = headline_table([tmp_path / "a", tmp_path / "b"])
    rows = {line.split(" | ")[0][3:-1]: line.split(" | ") for line in table.splitlines()[2:]}
    assert list(rows) == ["warmup600", "warmup", "admin"]
    assert rows["warmup600"][7] == ("s1: the comparator (the strongest of 2 warmup baselines); "
                                    "s2: the comparator (the strongest of 2 warmup baselines)")
    assert rows["warmup"][7] == "s1: a warmup baseline; s2: a warmup baseline"
    assert rows["admin"][7] == "s1: holds; s2: fails: BLEU 5.00 below warmup600-s2's 7.00"
