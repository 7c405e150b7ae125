"""The lab's verdict: an arm holds by source use first (and BLEU at convergence), never by loss alone."""
import csv
import json

import pytest

from lab.study.tables import build_table, markdown
from lab.study.verdict import FROM_UPDATE, LOSS_MARGIN, SOURCE_GAP_MARGIN, judge

# Batch 7 of the CPU testbed as its logs say (every 100 updates to 900): a warmup run that uses its source
# and a no-warmup run with the lower loss whose source gap stays 0.
WARMUP = {"valid_loss": {100: 9.96, 500: 9.154, 900: 8.741}, "valid_src_gap": {100: 0.018, 500: 0.786, 900: 1.415}}
SILENT = {"valid_loss": {100: 9.725, 500: 8.22, 900: 7.787}, "valid_src_gap": {100: 0.0, 500: 0.0, 900: 0.0}}


def test_a_lower_loss_that_ignores_the_source_fails():
    v = judge("gi", SILENT, "warmup", WARMUP)
    assert v.holds is False and v.loss < v.comparator_loss
    assert v.gap_shortfall == {500: 0.786, 900: 1.415} and "source gap 0.00 bits at 500" in v.reasons[0]


def test_a_run_that_uses_its_source_about_as_much_holds():
    close = {"valid_loss": {500: 9.0, 900: 8.6},
             "valid_src_gap": {500: 0.786 - SOURCE_GAP_MARGIN + 0.01, 900: 1.415 - SOURCE_GAP_MARGIN + 0.01}}
    assert judge("admin", close, "warmup", WARMUP).holds is True


def test_a_run_that_uses_its_source_but_ends_far_above_the_comparators_loss_fails():
    broken = {"valid_loss": {500: 9.9, 900: 8.741 + LOSS_MARGIN + 0.3}, "valid_src_gap": dict(WARMUP["valid_src_gap"])}
    v = judge("gi", broken, "warmup", WARMUP)
    assert v.holds is False and v.reasons == (f"eval-mode loss {8.741 + LOSS_MARGIN + 0.3:.2f} at 900, 0.80 above "
                                              "warmup's",)
    near = {"valid_loss": {500: 9.9, 900: 8.741 + LOSS_MARGIN - 0.01}, "valid_src_gap": dict(WARMUP["valid_src_gap"])}
    assert judge("gi", near, "warmup", WARMUP).holds is True


def test_early_validations_are_not_judged_and_missing_gaps_say_so():
    early = {"valid_src_gap": {u: g for u, g in WARMUP["valid_src_gap"].items() if u < FROM_UPDATE}}
    assert judge("gi", SILENT, "warmup", early).holds is None
    assert judge("gi", {"valid_loss": {100: 1.0}}, "warmup", WARMUP).holds is None


def test_bleu_decides_at_convergence():
    same = dict(WARMUP)
    assert judge("gi", same, "warmup", WARMUP, bleu=10.0, comparator_bleu=12.0, bleu_decides=True).holds is False
    assert judge("gi", same, "warmup", WARMUP, bleu=12.0, comparator_bleu=12.0, bleu_decides=True).holds is True
    assert judge("gi", same, "warmup", WARMUP, bleu=None, comparator_bleu=12.0, bleu_decides=True).holds is None


def _study(tmp_path, arms):
    with open(tmp_path / "curves.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["arm", "num_updates", "valid_loss", "valid_src_gap"])
        w.writeheader()
        for name, c in arms.items():
            for u in sorted(c["valid_loss"]):
                w.writerow({"arm": name, "num_updates": u, "valid_loss": c["valid_loss"][u],
                            "valid_src_gap": c["valid_src_gap"][u]})
    (tmp_path / "bleu.json").write_text(json.dumps({"update": 900, "arms": {
        "warmup": {"bleu": 0.5, "distinct_hypotheses": 1400}, "gi": {"bleu": 0.4, "distinct_hypotheses": 1}}}))
    return tmp_path


def test_the_table_shows_gaps_distinct_hypotheses_and_verdicts_by_seed(tmp_path):
    study = _study(tmp_path, {"warmup": WARMUP, "gi": SILENT, "warmup-s2": WARMUP, "gi-s2": WARMUP})
    table = build_table(study, updates=[500, 900], comparator="warmup")
    rows = {r.arm: r for r in table.rows}
    assert rows["gi"].verdict.startswith("fails: source gap") and rows["gi"].distinct == 1
    assert rows["gi-s2"].verdict == "holds" and rows["warmup"].verdict == "" and rows["warmup-s2"].verdict == ""
    assert rows["gi"].src_gap == {500: 0.0, 900: 0.0}
    text = markdown(table)
    assert "src gap @900" in text and "distinct hyps" in text and "| fails: source gap" in text


def test_judging_needs_the_comparator_arm(tmp_path):
    study = _study(tmp_path, {"warmup": WARMUP, "gi": SILENT})
    assert all(r.verdict == "" for r in build_table(study, updates=[900], comparator="nope").rows)
    with pytest.raises(ValueError):
        build_table(study, updates=[900], arms=["missing"])
