"""The no-warmup pages' claims that no generated table carries: the user page docs/no-warmup.md and the research
notebook lab/record/no-warmup.md (quoted figures are the evidence's own). Their tables are generated
(lab/docs_tables/, tested in tests/repo/test_generated_docs.py); the links between the docs:
tests/repo/test_docs_layout.py."""
import csv
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGE = (DOCS / "no-warmup.md").read_text(encoding="utf-8")
DOC = (REPO / "lab" / "record" / "no-warmup.md").read_text(encoding="utf-8")
EVIDENCE = REPO / "lab" / "record" / "evidence"
HOLDA = EVIDENCE / "nowarmup-d512-holdA-2026-11-27"


def test_the_figures_quoted_are_the_evidences_own():
    evidence = (HOLDA / "README.md").read_text(encoding="utf-8")
    shared = ["~240×", "18,283", "556 of 780", "iterations 1–336", "×1.9–×9.7", "9.6–19 sentences/s",
              "10–14 updates/s", "0.002–0.1", "~1e-9", "`4310047`", "2.11.0+cu130", "54 / **64**", "**64** / 68"]
    flat_doc, flat_ev = " ".join(DOC.split()), " ".join(evidence.split())
    for figure in shared:
        f = " ".join(figure.replace("**", "").split())
        assert f in flat_ev.replace("**", ""), figure
    for figure in ("~240×", "18,283", "556 of 780", "iterations 1–336", "×1.9–×9.7", "9.6–19 sentences/s",
                   "10–14 updates/s", "0.002–0.1", "~1e-9", "`4310047`", "2.11.0+cu130", "source 54 / target 64",
                   "source 64 / target 68"):
        assert figure in flat_doc, figure


def test_the_user_page_states_what_the_evidence_measured():
    """docs/no-warmup.md's d=512 figures not in a table (its losses point at the notebook's generated tables): the
    phase's constraint count, and the commands it names."""
    phase = json.loads((EVIDENCE / "nowarmup-d512-authors-2026-11-26" / "authors.gradinit.json").read_text())
    page = " ".join(PAGE.split())
    assert f"in {phase['num_constraint']} of its {phase['iterations']} iterations" in page
    from lab.study.presets import HOLD as HOLD_PRESET
    from lab.study.presets import SHOCK, WARMUP_4000

    lr = HOLD_PRESET.base[HOLD_PRESET.base.index("--lr") + 1]
    assert f"`{' '.join(WARMUP_4000)}`" in page and f"`--lr {lr}`" in page
    warm_args = HOLD_PRESET.base + next(a for a in HOLD_PRESET.arms if a.name == "warm-s1").args  # Xavier
    assert not any(x in warm_args for x in ("--gradinit-iters", "--gradinit-init-file"))
    assert "started from Xavier's initialization, without `--gradinit-iters`" in page
    assert "--warmup-updates 500" in " ".join(a for arm in SHOCK.arms if arm.name == "gi-warm500" for a in arm.args)
    options = (DOCS / "options.md").read_text(encoding="utf-8")
    for flag in set(re.findall(r"`(--gradinit-[\w-]+)", PAGE)):
        assert f"`{flag}" in options, flag


TESTBED = REPO / "lab" / "record" / "testbed-d128"


def curves_of_testbed(folder: Path = TESTBED):
    """arm -> update -> (eval-mode, dropout-on) validation loss of a testbed record's curves.csv."""
    rows = {}
    with open(folder / "curves.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["valid_loss"]:
                rows.setdefault(r["arm"], {})[int(r["num_updates"])] = (float(r["valid_loss"]),
                                                                        float(r["valid_loss_dropout"]))
    return rows


def test_the_branch_ratio_sentence_is_the_stored_monitor():
    at100 = {}
    with open(REPO / "lab" / "record" / "testbed-d128" / "curves.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["num_updates"] == "100" and r["monitor_max_branch_ratio_eval"]:
                at100[r["arm"]] = float(r["monitor_max_branch_ratio_eval"])
    broken = [at100[a] for a in ("gi", "gi-screen", "gi-pairs", "gi-warm50")]
    learning = [at100[a] for a in ("gi-unstepped", "gi-eta-lr")]
    assert (round(min(broken)), round(max(broken)), round(min(learning)), round(max(learning))) == (23, 28, 5, 7)
    assert round(at100["gi-look4"], 1) == 3.2 and all(1 <= at100[a] < 2 for a in ("xavier", "xavier-warm50"))
    page = " ".join((REPO / "docs" / "no-warmup.md").read_text(encoding="utf-8").split())
    assert "23–28× the stream for the arms that break down, 5–7 for these two, 3.2 for our variant, 1–2 for Xavier" in page


def test_eight_cached_arms_fit_the_hour_and_repeat_batch_one():
    """The testbed's budget: batch 1's eight arms, every GradInit phase taken from the cache, in at most 60
    minutes on an idle 2-core machine (the study's own wall time), with every validation loss of batch 1 again."""
    import json

    budget = TESTBED / "budget"
    study = json.loads((budget / "study-study11.json").read_text(encoding="utf-8"))
    assert len(study["arms"]) == 8 and study["gradinit_groups"]
    assert not any(g["computed_now"] for g in study["gradinit_groups"].values())
    minutes = study["wall_s"]["total"] / 60
    assert minutes <= 60
    again, first = curves_of_testbed(budget), curves_of_testbed()
    assert set(again) == set(study["arms"]) and all(again[a] == first[a] for a in again)
    assert sum(len(c) for c in again.values()) == 64
    page = " ".join((REPO / "docs" / "no-warmup.md").read_text(encoding="utf-8").split())
    assert (f"Eight arms whose GradInit phases are cached take {minutes:.0f} minutes on an idle 2-core machine, two "
            "at a time, and a rerun repeats every validation loss to the last digit") in page
