"""Preset 'shock': its arms (each one change against the control), its calls' budgets, the seed
twins of its repeat call, --dry-run's commands and estimate, and the commands lab/record/no-warmup.md states."""
import json
import re
from pathlib import Path

import pytest

from lab.study.arms import option_groups
from lab.study.presets import SHOCK, call_estimate, describe_presets, seed_twin

REPO = Path(__file__).resolve().parents[2]
ARMS = {arm.name: arm for arm in SHOCK.arms}
#: Options of the preset that other parts of the plugin declare.
NEEDED = ("--gradinit-cudnn-sdpa-guard", "--gradinit-gamma-init-factor", "--gradinit-pairs",
          "--gradinit-unstepped-uses", "--gradinit-monitor-interval")


def value(arm, option):
    groups = [g for g in option_groups(arm.args) if g[0] == option]
    assert len(groups) <= 1, (arm.name, option, "given twice")
    return groups[0][1] if groups and len(groups[0]) > 1 else (True if groups else None)


def test_each_arm_changes_one_thing_against_the_control():
    ctl = ARMS["ctl"]
    for arm in SHOCK.arms:
        assert arm.data == "separate" and "--share-all-embeddings" in arm.drop, arm.name
        assert value(arm, "--gradinit-monitor-interval") == "100" and value(arm, "--gradinit-cudnn-sdpa-guard") == "on"
        assert "--fp16" not in arm.drop
    assert value(ctl, "--gradinit-init-file") == "{authors}" and value(ctl, "--warmup-updates") == "0"
    assert value(ctl, "--attention-dropout") == "0.1" and value(ctl, "--lr-scheduler") == "polynomial_decay"

    def differs(name):
        a, b = dict((g[0], tuple(g[1:])) for g in option_groups(ARMS[name].args)), \
            dict((g[0], tuple(g[1:])) for g in option_groups(ctl.args))
        return {k for k in set(a) | set(b) if a.get(k) != b.get(k)}

    assert differs("nodrop") == {"--dropout", "--attention-dropout", "--activation-dropout"}
    assert all(value(ARMS["nodrop"], o) == "0" for o in ("--dropout", "--attention-dropout", "--activation-dropout"))
    assert differs("attdrop0") == {"--attention-dropout"} and value(ARMS["attdrop0"], "--attention-dropout") == "0"
    assert differs("gi-warm500") == {"--warmup-updates"} and value(ARMS["gi-warm500"], "--warmup-updates") == "500"
    # x-warm500 is gi-warm500 from Xavier: no scales, the same schedule
    x = ARMS["x-warm500"]
    assert value(x, "--gradinit-init-file") is None and value(x, "--gradinit-iters") is None
    assert value(x, "--warmup-updates") == "500" and value(x, "--lr-scheduler") == "polynomial_decay"
    warm = ARMS["warm-s1"]
    assert value(warm, "--lr-scheduler") == "inverse_sqrt" and value(warm, "--warmup-updates") == "4000"
    # the GradInit arms: the authors' settings with one change each
    assert value(ARMS["gi-gamma"], "--gradinit-gamma-init-factor") == "2"
    assert value(ARMS["gi-gamma"], "--gradinit-gamma") is None  # the factor replaces the fixed gamma
    assert value(ARMS["gi-unstepped"], "--gradinit-unstepped-uses") == r"decoder\.output_projection\."
    assert value(ARMS["gi-pairs"], "--gradinit-pairs") == "authors"
    for name in ("gi-gamma", "gi-unstepped", "gi-pairs"):
        assert value(ARMS[name], "--gradinit-iters") == "780" and value(ARMS[name], "--gradinit-eta") == "1e-3"
        assert value(ARMS[name], "--warmup-updates") == "0"
    # the CPU testbed's variant at d=512: its own GradInit settings, the plugin's defaults otherwise
    look = ARMS["gi-look4"]
    assert (value(look, "--gradinit-iters"), value(look, "--gradinit-lr"), value(look, "--gradinit-gamma-init-factor"),
            value(look, "--gradinit-lookahead-steps")) == ("200", "1e-2", "2", "4")
    assert value(look, "--gradinit-eta") is None and value(look, "--gradinit-gamma") is None
    assert value(look, "--warmup-updates") == "0" and SHOCK.call("E").arms == ("gi-look4",)


def test_the_calls_fit_eight_minutes_on_one_h200():
    assert set(SHOCK.call("A").arms) == {"ctl", "nodrop", "attdrop0", "gi-warm500", "warm-s1"}
    assert set(SHOCK.call("B").prepare) == set(SHOCK.call("C").arms) == {"gi-gamma", "gi-unstepped", "gi-pairs"}
    assert SHOCK.call("B").arms == ("x-warm500",)
    for call in SHOCK.calls:
        assert call.limit_s == 480.0
        if call.repeat_seed is not None:
            assert call_estimate(SHOCK, call) is None  # its arms are named when it runs
            continue
        e = call_estimate(SHOCK, call)
        assert e.fits and e.total_s <= 480 and e.upper_bound_s <= 480, e.describe()
        assert all(j.done == 3000 for j in e.jobs if j.kind == "arm")
    text = describe_presets(("shock",))
    assert len(re.findall(r"expected duration on one H200: ~\d+ s, at most \d+ s; limit 480 s: fits", text)) == 4
    assert "call D: trains the seed-2 twins of the arms you name" in text


def test_seed_twins_compute_their_own_scales_where_the_arm_applied_seed_1_scales():
    twin = seed_twin(SHOCK, ARMS["gi-warm500"], 2)
    assert twin.name == "gi-warm500-s2" and twin.data == "separate" and twin.drop == ARMS["gi-warm500"].drop
    assert value(twin, "--seed") == "2" and value(twin, "--gradinit-init-file") is None
    assert value(twin, "--gradinit-iters") == "780" and value(twin, "--warmup-updates") == "500"
    plain = seed_twin(SHOCK, ARMS["warm-s1"], 2)
    assert [g for g in option_groups(plain.args) if g[0] != "--seed"] == \
        [g for g in option_groups(ARMS["warm-s1"].args) if g[0] != "--seed"]
    assert value(plain, "--seed") == "2" and value(plain, "--gradinit-iters") is None
    gamma = seed_twin(SHOCK, ARMS["gi-gamma"], 2)
    assert value(gamma, "--gradinit-gamma-init-factor") == "2" and value(gamma, "--seed") == "2"


def test_a_repeat_call_needs_the_arms_named():
    from lab.study import cli as study_cli

    parser = study_cli.build_parser()
    with pytest.raises(ValueError, match="pass --arms NAME"):
        study_cli.config_from_args(parser.parse_args(["d", "--out", "o", "--preset", "shock", "--call", "D"]))
    with pytest.raises(ValueError, match="unknown arm"):
        study_cli.config_from_args(parser.parse_args(["d", "--out", "o", "--preset", "shock", "--call", "D",
                                                      "--arms", "nosuch"]))
    with pytest.raises(ValueError, match="--call already chooses"):
        study_cli.config_from_args(parser.parse_args(["d", "--out", "o", "--preset", "shock", "--call", "A",
                                                      "--arms", "ctl"]))


# ------------------------------------------------------------------------------------------------
# --dry-run, with fairseq's parser
# ------------------------------------------------------------------------------------------------
def _missing_options():
    pytest.importorskip("fairseq")
    from fairseq_gradinit.fairseq_plugin.registration.task import TranslationGradInitConfig

    fields = {"--" + n.replace("_", "-") for n in TranslationGradInitConfig.__dataclass_fields__}
    return [o for o in NEEDED if o not in fields]


@pytest.fixture(scope="module")
def sep_bin(tmp_path_factory):
    missing = _missing_options()
    if missing:
        pytest.skip(f"the plugin does not declare {', '.join(missing)} yet; preset shock's arms need them")
    from fairseq_helpers import make_tiny_bin

    return make_tiny_bin(tmp_path_factory.mktemp("shockdata"), {"train": 40, "valid": 8, "test": 8}, 100)


def _dry_run(argv):
    from fairseq_helpers import study_main

    return study_main(argv)


def test_dry_run_prints_every_call_and_its_estimate_fits(sep_bin, tmp_path):
    scales = tmp_path / "authors.json"
    scales.write_text(json.dumps({"scales": {"encoder.embed_tokens.weight": 0.5}}))
    common = [str(sep_bin), "--preset", "shock", "--data-bin", f"separate={sep_bin}", "--file",
              f"authors={scales}", "--dry-run"]
    fits = "budget check: fits the call's limit of 480 s"
    rc, out, err = _dry_run(common + ["--call", "A", "--out", str(tmp_path / "a")])
    assert rc == 0 and fits in out, out[-2000:] + err[-2000:]
    for name in SHOCK.call("A").arms:
        line = next(ln for ln in out.splitlines() if ln.startswith(f"arm {name}: "))
        assert "--gradinit-monitor-interval 100" in line and "--gradinit-cudnn-sdpa-guard on" in line
        assert " --fp16 " in line + " " and "3000/3000 updates" in out
    assert f"--gradinit-init-file {scales}" in next(ln for ln in out.splitlines() if ln.startswith("arm nodrop: "))
    rc, out, err = _dry_run(common + ["--call", "B", "--out", str(tmp_path / "b")])
    assert rc == 0 and out.count("prepare ") == 3 and out.count("  phase gi-") == 3 and fits in out, err[-2000:]
    # call C without call B's cache would compute the three phases first: refused by its own estimate
    rc, out, err = _dry_run(common + ["--call", "C", "--out", str(tmp_path / "c")])
    assert rc == 1 and "DOES NOT FIT" in out and "--gradinit-cache" in err.strip().splitlines()[-1]
    # the repeat call: seed-2 twins; an arm that applied seed-1 scales computes its own first
    rc, out, err = _dry_run(common + ["--call", "D", "--arms", "x-warm500,warm-s1", "--out", str(tmp_path / "d")])
    assert rc == 0 and fits in out and "arm x-warm500-s2: " in out and "--seed 2" in out, err[-2000:]
    rc, out, err = _dry_run(common + ["--call", "D", "--prepare-arms", "gi-warm500", "--out", str(tmp_path / "e")])
    assert rc == 0 and "prepare gi-warm500-s2" in out and fits in out, err[-2000:]
    rc, out, err = _dry_run(common + ["--call", "D", "--arms", "gi-warm500", "--out", str(tmp_path / "f")])
    assert rc == 1 and "DOES NOT FIT" in out  # phase and 3000 updates do not fit one call


# ------------------------------------------------------------------------------------------------
# the docs
# ------------------------------------------------------------------------------------------------
def test_docs_state_the_commands_and_estimates():
    doc = (REPO / "lab" / "record" / "no-warmup.md").read_text(encoding="utf-8")
    section = doc[doc.index("## What is being tested: preset `shock`"):]
    for call in SHOCK.calls:
        if call.repeat_seed is None:
            e = call_estimate(SHOCK, call)
            row = next(line for line in section.splitlines() if line.startswith(f"| {call.name} |"))
            assert f"~{e.total_s:.0f} s, at most {e.upper_bound_s:.0f} s" in row, row
    for arm in SHOCK.arms:
        assert f"| `{arm.name}` |" in section, arm.name
    assert "--preset shock --call A" in section and "--archive RESULTS/shock-A.tar.gz" in section
    assert "--call D --arms" in section and "--call D --prepare-arms" in section
    a, b = SHOCK.call("A"), SHOCK.call("B")
    flat = " ".join(section.split())
    assert (f"`--parallel {a.parallel} --time-budget {a.time_budget:g} --bleu-budget {a.bleu_budget:g} "
            f"--finish-margin {a.finish_margin:g}`, the other calls `--time-budget {b.time_budget:g} "
            f"--bleu-budget {b.bleu_budget:g}`") in flat
    assert all((c.time_budget, c.bleu_budget) == (b.time_budget, b.bleu_budget) for c in SHOCK.calls if c is not a)
    # what hold's call A took: the study's own record and fairseq's
    holda = REPO / "lab" / "record" / "evidence" / "nowarmup-d512-holdA-2026-11-27"
    total = json.loads((holda / "study.json").read_text())["wall_s"]["total"]
    trained = [float(m) for arm in sorted((holda / "arms").iterdir())
               for m in re.findall(r"done training in ([\d.]+) seconds", (arm / "train.log").read_text())]
    assert f"took {total:.0f} s in all" in flat and len(trained) == 3
    assert f"~{sum(trained) / len(trained):.0f} s for 3000 updates" in flat
    assert f"BLEU {(a.bleu_budget * 60):.0f} s" in flat and f"training {(a.time_budget - 7) * 60:.0f} s more" in flat
