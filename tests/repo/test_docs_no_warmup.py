"""The no-warmup pages' numbers from the stored evidence: the user page docs/no-warmup.md and the research
notebook lab/record/no-warmup.md (its table is recomputed from the curves and monitor records, quoted figures
are the evidence's own). The links between the docs: tests/repo/test_docs_layout.py."""
import csv
import gzip
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGE = (DOCS / "no-warmup.md").read_text(encoding="utf-8")
DOC = (REPO / "lab" / "record" / "no-warmup.md").read_text(encoding="utf-8")
EVIDENCE = REPO / "lab" / "record" / "evidence"
HOLDA = EVIDENCE / "nowarmup-d512-holdA-2026-11-27"
HOLD = EVIDENCE / "nowarmup-d512-hold-2026-11-27"
ARMS = ("ctl-fp16", "fp32", "admin-ls", "clamp-strong", "clamp-mild")
#: An eval-mode loss above the train-mode loss by more than this on the fixed batch marks the breakdown
#: (before it the difference stays between -0.33 and +0.17 in every arm).
GAP = 0.2


def _curves(folder=HOLDA):
    rows = {}
    with open(folder / "curves.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["valid_loss"]:
                rows.setdefault(r["arm"], {})[int(r["num_updates"])] = float(r["valid_loss"])
    return rows


def _onset(records):
    gaps = [(r["update"], r["fixed_batch_loss"]["eval"] - r["fixed_batch_loss"]["train"])
            for r in records if r["type"] == "interval" and r.get("fixed_batch_loss")]
    return next(u for u, g in gaps if g > GAP)


def _monitor(arm):
    with gzip.open(HOLDA / "arms" / arm / "monitor.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_the_holdA_table_is_the_stored_curves_and_monitor_records():
    curves = _curves()
    section = DOC[DOC.index("## Evidence (2026-11-27, preset `hold` call A)"):]
    total = 0
    for arm in ARMS:
        valid = curves[arm]
        best_u = min(valid, key=lambda u: (valid[u], u))
        last_u = max(valid)
        records = _monitor(arm)
        gaps = [(r["update"], r["fixed_batch_loss"]["eval"] - r["fixed_batch_loss"]["train"])
                for r in records if r["type"] == "interval" and r.get("fixed_batch_loss")]
        onset = next(u for u, g in gaps if g > GAP)
        late = [r for r in records if r["type"] == "overflow" and r["update"] > 3]
        total += len(late)
        row = next(line for line in section.splitlines() if line.startswith(f"| `{arm}`"))
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert cells[:3] == [f"{valid[u]:.2f}" for u in (500, 1000, 2000)], arm
        assert cells[3] == f"{valid[best_u]:.2f} @ {best_u}", arm
        assert cells[4].startswith(f"{valid[last_u]:.2f} @ {last_u}"), arm
        assert cells[5:] == [str(onset), str(len(late))], arm
        # the overflow at start-up is the only one at or before update 3, and fp32 has none
        assert all(r["update"] == 3 for r in records if r["type"] == "overflow" and r["update"] <= 3)
    assert total == 81 and "All 81 overflows after start-up" in section


def test_the_figures_quoted_are_the_evidences_own():
    evidence = (HOLDA / "README.md").read_text(encoding="utf-8")
    shared = ["~240×", "18,283", "556 of 780", "iterations 1–336", "×1.9–×9.7", "9.6–19 sentences/s",
              "10–14 updates/s", "0.002–0.1", "~1e-9", "`4310047`", "2.11.0+cu130", "54 / **64**", "**64** / 68",
              "7.82 @1000, 6.05 @2000,\n5.17 @3000"]
    flat_doc, flat_ev = " ".join(DOC.split()), " ".join(evidence.split())
    for figure in shared:
        f = " ".join(figure.replace("**", "").split())
        assert f in flat_ev.replace("**", ""), figure
    for figure in ("~240×", "18,283", "556 of 780", "iterations 1–336", "×1.9–×9.7", "9.6–19 sentences/s",
                   "10–14 updates/s", "0.002–0.1", "~1e-9", "`4310047`", "2.11.0+cu130", "source 54 / target 64",
                   "source 64 / target 68", "7.82 at 1000, 6.05 at 2000, 5.17 at 3000"):
        assert figure in flat_doc, figure


def test_health_and_remedies_quote_the_measured_clamp_arms():
    curves = _curves()
    best = {arm: min(curves[arm].values()) for arm in ("clamp-strong", "clamp-mild", "ctl-fp16")}
    onset = {}
    for arm in ("clamp-strong", "clamp-mild"):
        gaps = [(r["update"], r["fixed_batch_loss"]["eval"] - r["fixed_batch_loss"]["train"])
                for r in _monitor(arm) if r["type"] == "interval" and r.get("fixed_batch_loss")]
        onset[arm] = next(u for u, g in gaps if g > GAP)
    remedies = " ".join((DOCS / "remedies.md").read_text(encoding="utf-8").split())
    assert (f"broke down from update ~{onset['clamp-strong']}, the mild one's at ~{onset['clamp-mild']}"
            in remedies)
    assert (f"(best validation loss {best['clamp-strong']:.2f} and {best['clamp-mild']:.2f} against "
            f"{best['ctl-fp16']:.2f} unclamped)") in remedies


def test_the_user_page_states_what_the_evidence_measured():
    """docs/no-warmup.md keeps few numbers: each is recomputed here from the stored runs."""
    page = " ".join(PAGE.split())
    curves = _curves()
    best = {arm: min(curves[arm].values()) for arm in ARMS}
    for arm in ARMS:  # every no-warmup remedy broke down before update 3000 and got worse after its best
        assert _onset(_monitor(arm)) < 3000 and curves[arm][max(curves[arm])] > best[arm], arm
    assert f"the best of them reached a validation loss of {min(best.values()):.2f} and then got worse" in page
    hold = _curves(HOLD)
    assert f"reached {hold['warm-s1'][3000]:.2f} at update 3000" in page
    gi, warm = hold["gi98-s1"], hold["warm-s1"]
    common = sorted(set(gi) & set(warm))
    assert all(gi[u] < warm[u] for u in common if u <= 800) and all(gi[u] > warm[u] for u in common if u >= 900)
    assert "below the warmup run's at every validation up to update 800, and above it from update 900 on" in page
    phase = json.loads((EVIDENCE / "nowarmup-d512-authors-2026-11-26" / "authors.gradinit.json").read_text())
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


def test_the_cpu_testbed_table_is_the_stored_curves():
    """Every row of docs/no-warmup.md's CPU-testbed table: the eval-mode and dropout-on validation losses at
    updates 400 and 800 as the stored curves have them, and the preset arm it names exists."""
    from lab.study.presets import TESTBED as PRESET

    section = PAGE.split("## CPU testbed", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.-]+)` \| ([^|]+) \| ([\d.]+) / ([\d.]+) \| ([\d.]+) / ([\d.]+) \| (\d+) \|",
                      section, re.M)
    curves = curves_of_testbed()
    assert len(rows) >= 8 and {a.name for a in PRESET.arms} >= {r[0] for r in rows}
    for arm, _, e400, d400, e800, d800, warnings in rows:
        assert curves[arm][400] == (float(e400), float(d400)), arm
        assert curves[arm][800] == (float(e800), float(d800)), arm
        with gzip.open(TESTBED / "arms" / arm / "train.log.gz", "rt", encoding="utf-8") as f:
            assert sum("monitor: eval - train loss" in line for line in f) == int(warnings), arm
    look, warm = curves["gi-look4"], curves["warmup"]  # "below the warmup run at every validation from 100 on"
    assert all(look[u][0] < warm[u][0] for u in warm) and "below the warmup run at every validation" in section


def test_the_branch_ratio_sentence_is_the_stored_monitor():
    import csv

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
