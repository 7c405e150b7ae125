"""The d=128 CPU testbed (``python -m lab.study DATA --preset testbed --cpu``): its arms and groups, the
dry-run's CPU estimate, and a tiny-size run that records both validation losses and reuses cached phases."""
import csv
import json

import pytest

pytest.importorskip("fairseq")

from lab.study import plan as study_plan  # noqa: E402
from lab.study.estimate import CPU2, GPU_THROUGHPUT  # noqa: E402
from lab.study.plan import StudyConfig  # noqa: E402
from lab.study.presets import TESTBED  # noqa: E402

from fairseq_helpers import make_tiny_bin, study_main  # noqa: E402

#: The tiny model the run uses instead of the testbed's d=128 one (the base's later options win).
TINY = ("--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 16 --decoder-embed-dim 16 "
        "--encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 "
        "--decoder-attention-heads 2 --max-tokens 500 --gradinit-monitor-interval 2")


@pytest.fixture(scope="module")
def tiny_bin(tmp_path_factory):
    return make_tiny_bin(tmp_path_factory.mktemp("testbed"), {"train": 120, "valid": 16, "test": 8}, 300)


def test_testbed_arms_groups_and_base(tiny_bin, tmp_path):
    """Every arm records both validation losses and the monitor; gi and gi-warm50 share one phase; each
    explanation and variant of the screening phase is a phase of its own; the references have none."""
    base = " ".join(TESTBED.base)
    assert "--gradinit-valid-dropout-loss" in TESTBED.base and "--gradinit-monitor-interval 100" in base
    assert "--lr 1e-3" in base and "--max-tokens 2048" in base and "--max-tokens 4096" not in base
    assert (TESTBED.max_update, TESTBED.valid_every, TESTBED.parallel, TESTBED.throughput) == (800, 100, 2, "cpu2")
    cfg = StudyConfig(data={"main": str(tiny_bin)}, out=tmp_path, arms=TESTBED.arms, base=TESTBED.base,
                      max_update=TESTBED.max_update, cpu=True)
    plans, groups = study_plan.plan_study(cfg)
    by_arm = {p.arm.name: p.group for p in plans}
    assert by_arm["gi"] == by_arm["gi-warm50"] is not None
    screened = ("gi-screen", "gi-pairs", "gi-unstepped", "gi-eta-lr", "gi-dropout", "gi-ratio", "gi-floors", "gi-K2",
                "gi-look4", "gi-look4-g", "gi-look4-floors")
    assert len({by_arm[n] for n in screened} | {by_arm["gi"]}) == len(screened) + 1
    assert by_arm["gi-default"] is not None and by_arm["gi-default-780"] not in (None, by_arm["gi-default"])
    for ref in ("xavier", "warmup", "nodrop", "nodrop-warmup", "xavier-s2", "warmup-s2", "xavier-warm50",
                "admin", "admin-s2", "radam"):
        assert by_arm[ref] is None, ref


def test_dry_run_estimates_from_the_cpu_figures(tiny_bin, tmp_path):
    rc, out, err = study_main([str(tiny_bin), "--preset", "testbed", "--cpu", "--no-bleu", "--out",
                               str(tmp_path / "s"), "--arms", "xavier,warmup,gi,gi-warm50", "--dry-run"])
    assert rc == 0, err
    assert f"estimate on one {CPU2.label}" in out
    # one phase for gi and gi-warm50 (780 iterations), then four arms two at a time
    assert out.count("phase gi-") == 1 and "780 GradInit iterations" in out
    assert all(f"arm {a}: starts" in out for a in ("xavier", "warmup", "gi", "gi-warm50"))
    assert not (tmp_path / "s").exists()
    # the CPU's figures are no GPU's: --gpu offers GPUs only, and a GPU's figures never estimate a CPU run
    assert "cpu2" not in GPU_THROUGHPUT
    rc, out, _ = study_main([str(tiny_bin), "--preset", "testbed", "--cpu", "--no-bleu", "--out", str(tmp_path / "t"),
                             "--arms", "xavier", "--gpu", "h200", "--dry-run"])
    assert rc == 0 and "no estimate on the CPU" in out


def test_dry_run_prices_the_simulated_steps_of_a_lookahead_phase(tiny_bin, tmp_path):
    """A phase with K simulated Adam steps costs K - 1 more passes per objective iteration: its estimate is
    the screening phase's times the measured factor, and the line says how many steps it simulates."""
    import re

    from lab.study.estimate import lookahead_factor

    rc, out, err = study_main([str(tiny_bin), "--preset", "testbed", "--cpu", "--no-bleu", "--out",
                               str(tmp_path / "s"), "--arms", "gi-screen,gi-look4", "--parallel", "1", "--dry-run"])
    assert rc == 0, err
    phases = re.findall(r"phase gi-\w+: starts \d+ s, ends \d+ s \((\d+) s, 200 GradInit iterations(, 4 simulated "
                        r"steps)?\)", out)
    assert len(phases) == 2, out
    (plain,), (look,) = [[int(s) for s, steps in phases if bool(steps) is k] for k in (False, True)]
    assert lookahead_factor(1) == 1.0 and lookahead_factor(4) > 1.0
    assert abs((look - CPU2.startup_s) / (plain - CPU2.startup_s) - lookahead_factor(4)) < 0.01


def test_dry_run_prices_the_plugins_default_simulated_steps(tiny_bin, tmp_path):
    """An arm with the plain usage line (no --gradinit-lookahead-steps) gets the plugin's default steps with
    Adam: its phase is priced as gi-look4's, not as a one-step phase."""
    import re

    rc, out, err = study_main([str(tiny_bin), "--preset", "testbed", "--cpu", "--no-bleu", "--out",
                               str(tmp_path / "s"), "--arms", "gi-default,gi-K2", "--parallel", "1",
                               "--dry-run"])
    assert rc == 0, err
    steps = re.findall(r"phase gi-\w+: starts \d+ s, ends \d+ s \(\d+ s, 200 GradInit iterations(, 4 simulated "
                       r"steps)?\)", out)
    # gi-K2 pins one step; gi-default gives none and gets four
    assert sorted(bool(s) for s in steps) == [False, True], out


def test_tiny_testbed_records_both_losses_and_reuses_cached_phases(tiny_bin, tmp_path):
    common = [str(tiny_bin), "--preset", "testbed", "--cpu", "--no-bleu", "--base-args", TINY,
              "--max-update", "4", "--valid-every", "2", "--save-every", "4", "--gradinit-cache", str(tmp_path / "cache")]
    rc, _, err = study_main(common + ["--out", str(tmp_path / "a"), "--arms", "xavier,gi-screen"])
    assert rc == 0, err
    with open(tmp_path / "a" / "curves.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["valid_loss"]]
    assert {r["arm"] for r in rows} == {"xavier", "gi-screen"}
    for r in rows:  # eval mode and dropout on, at every validation of every arm
        assert float(r["valid_loss"]) > 0 and float(r["valid_loss_dropout"]) > 0
        assert r["valid_loss"] != r["valid_loss_dropout"]  # dropout 0.3 scores the model differently
    md = (tmp_path / "a" / "curves.md").read_text()
    assert "valid loss (eval mode)" in md and "valid loss (dropout on)" in md
    study = json.loads((tmp_path / "a" / "study.json").read_text())
    assert study["arms"]["xavier"]["last_valid_loss_dropout"] > 0
    (group, info), = study["gradinit_groups"].items()
    assert info["computed_now"] and info["arms"] == ["gi-screen"]
    # a later study with the same cache reuses the screening phase instead of computing it again
    rc, _, err = study_main(common + ["--out", str(tmp_path / "b"), "--arms", "gi-screen"])
    assert rc == 0, err
    again = json.loads((tmp_path / "b" / "study.json").read_text())["gradinit_groups"]
    assert list(again) == [group] and not again[group]["computed_now"]
