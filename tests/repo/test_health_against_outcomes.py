"""The health check of every stored testbed phase against what its model did: did it use its source?

Each GradInit arm of the source-use batches (lab/record/testbed-d128/source-use/) has its phase's gradinit.json
(inside the batch's gradinit.tar.gz) and its validation curves with the source gap. An arm *ignored its source*
when its gap stayed below 0.1 bits to its last validation; it *used* it when its gap ended within
:data:`~lab.study.verdict.SOURCE_GAP_MARGIN` of the warmup run's. The health check must flag every phase whose
model ignored its source, and the encoder-silencing reason must not be given to any phase whose model used it.
"""
import json
import tarfile
from pathlib import Path

import pytest

from fairseq_gradinit.core.health import BlockGradient, HealthThresholds, encoder_silencing
from lab.study.tables import read_curves_csv
from lab.study.verdict import SOURCE_GAP_MARGIN

SOURCE_USE = Path(__file__).resolve().parents[2] / "lab" / "record" / "testbed-d128" / "source-use"
IGNORED = 0.1
SIDES = ("encoder", "decoder")  # fairseq's, as the plugin names them to the health check


def _phases():
    """``{arm: (stored health block, last source gap, the warmup run's last gap)}`` of every stored batch."""
    out = {}
    for batch in sorted(p for p in SOURCE_USE.iterdir() if (p / "study.json").is_file()):
        study = json.loads((batch / "study.json").read_text(encoding="utf-8"))
        curves = read_curves_csv(batch / "curves.csv")
        with tarfile.open(batch / "gradinit.tar.gz") as tar:
            members = {m.name: m for m in tar.getmembers()}
            for arm, info in study["arms"].items():
                group = info.get("gradinit_group")
                gap = curves.get(arm, {}).get("valid_src_gap")
                if not group or not gap:
                    continue
                saved = json.load(tar.extractfile(members[f"{group}/gradinit.json"]))
                warmup = _warmup_gap(arm)
                out[arm] = (saved["health"], gap[max(gap)], warmup)
    return out


def _warmup_gap(arm):
    """The warmup run's last gap of the same seed (`warmup` for seed 1, `warmup-s2` for seed 2), from whichever
    stored batch ran it."""
    name = "warmup-s2" if arm.endswith("-s2") else "warmup"
    for batch in sorted(p for p in SOURCE_USE.iterdir() if (p / "curves.csv").is_file()):
        gap = read_curves_csv(batch / "curves.csv").get(name, {}).get("valid_src_gap")
        if gap:
            return gap[max(gap)]
    return None


def test_every_phase_whose_model_ignored_its_source_is_flagged():
    phases = _phases()
    assert len(phases) >= 1
    ignored = {a for a, (_, gap, _) in phases.items() if gap < IGNORED}
    assert ignored, "the stored batches hold the runs that ignored their source"
    for arm in ignored:
        health = phases[arm][0]
        assert health["verdict"] == "degenerate", arm


@pytest.mark.parametrize("threshold", [HealthThresholds().max_encoder_quieting_ratio])
def test_encoder_silencing_is_never_said_of_a_model_that_used_its_source(threshold):
    used = {a: v for a, v in _phases().items() if v[2] is not None and v[1] >= v[2] - SOURCE_GAP_MARGIN}
    for arm, (health, _, _) in used.items():
        blocks = [BlockGradient(b["name"], b["rms_after"], b.get("rms_before")) for b in health["blocks"]]
        silencing = encoder_silencing(blocks, SIDES)
        assert silencing is None or silencing["ratio"] < threshold, arm


def test_the_stored_verdicts_name_encoder_silencing_where_the_stored_blocks_show_it():
    """The reason in each stored gradinit.json agrees with the rule applied to its stored blocks (phases computed
    before the rule existed have no such reason; the rule is recomputed for them)."""
    th = HealthThresholds().max_encoder_quieting_ratio
    for arm, (health, _, _) in _phases().items():
        blocks = [BlockGradient(b["name"], b["rms_after"], b.get("rms_before")) for b in health["blocks"]]
        silencing = encoder_silencing(blocks, SIDES)
        named = any(r.startswith("the encoder's blocks are") for r in health["reasons"])
        if "encoder_silencing" in health:  # written by a version with the rule
            assert named == (silencing is not None and silencing["ratio"] >= th), arm


def test_every_phase_whose_loss_on_s_rose_trained_a_model_that_fails():
    """Recomputed from each stored phase's history: every arm whose phase raised L(S) by more than
    ``max_loss_rise`` fails its verdict against the warmup run of its seed (the rise is a sufficient sign, not a
    necessary one: the phases that silenced the encoder lowered L(S)), and the stored phases hold such arms."""
    from fairseq_gradinit.core.health import phase_health
    from lab.study.verdict import judge

    th = HealthThresholds()
    curves_of = {}
    for batch in sorted(p for p in SOURCE_USE.iterdir() if (p / "curves.csv").is_file()):
        curves_of.update(read_curves_csv(batch / "curves.csv"))
    risen = {}
    for batch in sorted(p for p in SOURCE_USE.iterdir() if (p / "gradinit.tar.gz").is_file()):
        study = json.loads((batch / "study.json").read_text(encoding="utf-8"))
        with tarfile.open(batch / "gradinit.tar.gz") as tar:
            for arm, info in study["arms"].items():
                group = info.get("gradinit_group")
                if not group:
                    continue
                saved = json.load(tar.extractfile(f"{group}/gradinit.json"))
                rise = phase_health(saved["history"], saved.get("gamma")).loss_rise
                if rise > th.max_loss_rise:
                    risen[arm] = rise
    assert len(risen) >= 5, risen
    for arm in risen:
        ref = "warmup-s2" if arm.endswith("-s2") else "warmup"
        verdict = judge(arm, curves_of[arm], ref, curves_of[ref])
        assert verdict.holds is False, (arm, risen[arm], verdict.line())
