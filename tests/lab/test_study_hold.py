"""The study's duration estimates (study.estimate), its one-file archive (--archive) and preset
'hold': its calls' settings, --dry-run's commands and estimate, and the budget check."""
import json
import re
import tarfile
from pathlib import Path

import pytest

from lab.study import archive as study_archive
from lab.study import estimate as est
from lab.study.presets import HOLD, call_estimate, describe_presets

REPO = Path(__file__).resolve().parents[2]


def _arms(n, **kw):
    return [est.EstJob(f"a{i}", "arm", updates=3000, **kw) for i in range(n)]


# ------------------------------------------------------------------------------------------------
# the throughput model reproduces the figures it is built from
# ------------------------------------------------------------------------------------------------
def test_estimate_reproduces_the_measured_h200_figures():
    h200 = est.H200
    assert est.arm_rate(h200, 2) == 13.0 and est.arm_rate(h200, 5) == 8.0
    assert est.arm_rate(h200, 10) == pytest.approx(4.0)  # beyond five: the GPU's total rate stays 40 updates/s
    # two arms beside three phases: 6.2-7.9 updates/s each measured
    assert 6.2 <= est.arm_rate(h200, 2 + 3 * h200.phase_weight) <= 7.9
    alone = est.estimate_call([est.EstJob("p", "phase")], throughput=h200, parallel=1)
    assert alone.jobs[0].end_s == pytest.approx(h200.startup_s + 161, abs=1)
    beside = est.estimate_call([est.EstJob(f"p{i}", "phase") for i in range(3)] + _arms(2), throughput=h200,
                               parallel=5)
    assert [j.end_s for j in beside.jobs[:3]] == [pytest.approx(h200.startup_s + 299, abs=1)] * 3
    five = est.estimate_call(_arms(5), throughput=h200, parallel=5)
    assert five.training_s == pytest.approx(h200.startup_s + 3000 / 8, abs=1)


def test_estimate_follows_the_scheduler_and_the_time_budget():
    phase_then_arm = [est.EstJob("gi-x", "phase"), est.EstJob("x", "arm", updates=100, deps=("gi-x",))]
    e = est.estimate_call(phase_then_arm, throughput=est.H200, parallel=2)
    assert e.jobs[1].start_s == e.jobs[0].end_s  # the arm waits for its phase
    serial = est.estimate_call(_arms(2), throughput=est.H200, parallel=1)
    assert serial.jobs[1].start_s == serial.jobs[0].end_s
    # arms stop at budget - margin + start-up (fairseq counts --stop-time-hours after start-up)
    cut = est.estimate_call(_arms(5), throughput=est.H200, parallel=5, time_budget_s=300, finish_margin_s=30,
                            bleu_s=30, limit_s=480)
    assert all(j.stopped_by_budget and j.end_s == pytest.approx(290, abs=1) for j in cut.jobs)
    assert not cut.fits and "stopped by the time budget" in cut.describe() and "DOES NOT FIT" in cut.describe()
    over = est.estimate_call(_arms(1), throughput=est.H200, parallel=1, time_budget_s=470, bleu_s=30, limit_s=480)
    assert over.upper_bound_s == est.H200.overhead_s + 470 + 30 and not over.fits


# ------------------------------------------------------------------------------------------------
# preset hold
# ------------------------------------------------------------------------------------------------
def test_hold_calls_state_their_duration_and_fit_eight_minutes():
    a = HOLD.call("A")
    assert set(a.arms) == {"ctl-fp16", "fp32", "admin-ls", "clamp-strong", "clamp-mild"}
    assert set(HOLD.call("B").prepare) == set(HOLD.call("C").arms) == {
        "gi-eta5e-4", "gi-floor", "gi-unstepped-out", "plain-s2"}
    for call in HOLD.calls:
        e = call_estimate(HOLD, call)
        assert e.fits and e.total_s <= 480 and e.upper_bound_s <= 480, e.describe()
        assert all(j.done == 3000 for j in e.jobs if j.kind == "arm")
    text = describe_presets(("hold",))
    assert len(re.findall(r"expected duration on one H200: ~\d+ s, at most \d+ s; limit 480 s: fits", text)) == \
        len(HOLD.calls) == 5
    by_name = {arm.name: arm for arm in HOLD.arms}
    for name in HOLD.call("A").arms + ("warm-s1",) + HOLD.call("C").arms:
        arm = by_name[name]
        assert arm.data == "separate" and "--share-all-embeddings" in arm.drop
        assert arm.args[arm.args.index("--gradinit-monitor-interval") + 1] == "100"
    assert "--fp16" in by_name["fp32"].drop and "--fp16" not in by_name["ctl-fp16"].drop
    assert "--fp16-scale-window" in by_name["admin-ls"].args
    assert "--gradinit-init-clamp" in by_name["clamp-strong"].args and "--gradinit-init-file" in by_name["clamp-mild"].args
    assert r"decoder\.output_projection\." in by_name["gi-unstepped-out"].args
    assert set(HOLD.call("D").prepare) == set(HOLD.call("E").arms) == {"gi-ratio", "gi-dropout"}
    assert "--gradinit-max-step-ratio" in by_name["gi-ratio"].args and "--gradinit-dropout" in by_name["gi-dropout"].args


def test_a_call_gives_its_settings_as_defaults():
    from lab.study import cli as study_cli

    args = study_cli.build_parser().parse_args(["data", "--out", "o", "--preset", "hold", "--call", "A"])
    cfg = study_cli.config_from_args(args)
    assert (cfg.parallel, cfg.time_budget_s, cfg.bleu_budget_s, cfg.finish_margin_s) == (5, 420.0, 30.0, 20.0)
    args = study_cli.build_parser().parse_args(["data", "--out", "o", "--preset", "hold", "--call", "A",
                                                "--parallel", "2", "--time-budget", "3"])
    cfg = study_cli.config_from_args(args)
    assert (cfg.parallel, cfg.time_budget_s) == (2, 180.0)
    assert cfg.bleu_at_once == 2  # as many translations at once as arms train at once, unless --bleu-parallel
    args = study_cli.build_parser().parse_args(["data", "--out", "o", "--preset", "hold", "--call", "A",
                                                "--bleu-parallel", "1"])
    assert study_cli.config_from_args(args).bleu_at_once == 1


def _dry_run(argv):
    pytest.importorskip("fairseq")
    from fairseq_helpers import study_main

    return study_main(argv)


@pytest.fixture(scope="module")
def sep_bin(tmp_path_factory):
    pytest.importorskip("fairseq")
    from fairseq_helpers import make_tiny_bin

    return make_tiny_bin(tmp_path_factory.mktemp("holddata"), {"train": 40, "valid": 8, "test": 8}, 100)


def test_hold_dry_run_prints_the_commands_and_an_estimate_that_fits(sep_bin, tmp_path):
    scales = tmp_path / "authors.json"
    scales.write_text(json.dumps({"scales": {"encoder.embed_tokens.weight": 0.5}}))
    common = [str(sep_bin), "--preset", "hold", "--data-bin", f"separate={sep_bin}", "--file",
              f"authors={scales}", "--dry-run"]
    rc, out, err = _dry_run(common + ["--call", "A", "--out", str(tmp_path / "a")])
    assert rc == 0, err[-2000:]
    for name in HOLD.call("A").arms:
        line = next(ln for ln in out.splitlines() if ln.startswith(f"arm {name}: "))
        assert "--gradinit-monitor-interval 100" in line and f"--gradinit-init-file {scales}" in line
        assert f"  arm {name}: starts 0 s, ends " in out and "3000/3000 updates" in out
    assert "--gradinit-init-clamp" in next(ln for ln in out.splitlines() if ln.startswith("arm clamp-strong: "))
    assert " --fp16 " not in next(ln for ln in out.splitlines() if ln.startswith("arm fp32: ")) + " "
    assert "estimate on one H200" in out and "budget check: fits the call's limit of 480 s" in out
    rc, out, err = _dry_run(common + ["--call", "B", "--out", str(tmp_path / "b")])
    assert rc == 0 and out.count("prepare ") == 4 and out.count("  phase gi-") == 4, err[-2000:]
    # call C without call B's cache would compute the four phases first: refused by its own estimate
    rc, out, err = _dry_run(common + ["--call", "C", "--out", str(tmp_path / "c")])
    assert rc == 1 and "DOES NOT FIT" in out and "--gradinit-cache" in err.strip().splitlines()[-1]
    # call D computes two more phases and trains nothing
    rc, out, err = _dry_run(common + ["--call", "D", "--out", str(tmp_path / "d")])
    assert rc == 0 and out.count("prepare ") == 2 and "budget check: fits the call's limit of 480 s" in out, \
        out[-2000:] + err[-2000:]


def test_dry_run_without_figures_says_so(sep_bin, tmp_path):
    rc, out, _ = _dry_run([str(sep_bin), "--out", str(tmp_path / "x"), "--arm", "x=--lr 1e-3", "--dry-run",
                           "--base-args", "--arch transformer_iwslt_de_en --optimizer adam --lr-scheduler fixed"])
    assert rc == 0 and "no estimate: no throughput figures" in out
    rc, out, _ = _dry_run([str(sep_bin), "--out", str(tmp_path / "y"), "--arm", "x=--lr 1e-3", "--dry-run", "--cpu",
                           "--gpu", "h200", "--base-args",
                           "--arch transformer_iwslt_de_en --optimizer adam --lr-scheduler fixed"])
    assert rc == 0 and "no estimate on the CPU" in out


# ------------------------------------------------------------------------------------------------
# the archive
# ------------------------------------------------------------------------------------------------
def test_archive_holds_summaries_arm_files_and_groups_but_no_checkpoints(tmp_path):
    out, cache = tmp_path / "study", tmp_path / "cache"
    for name in ("study.json", "study.log", "curves.csv", "curves.png", "curves.md", "bleu.json"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(name)
    for arm in ("a", "b"):
        d = out / "arms" / arm
        d.mkdir(parents=True)
        for name in ("train.log", "bleu.json", "bleu.log", "monitor.jsonl", "gradinit.json", "checkpoint_1_500.pt",
                     "checkpoint_last.pt"):
            (d / name).write_text(name)
    for g in ("gi-aaa", "gi-bbb", "failed-gi-ccc", "gi-other"):
        (cache / g).mkdir(parents=True)
        (cache / g / "gradinit.json").write_text("{}")
        (cache / g / "gradinit.log").write_text("log")
    dest = tmp_path / "export" / "call.tar.gz"
    members = study_archive.pack_study(out, dest, cache_dir=cache, groups=["gi-aaa", "gi-ccc"])
    with tarfile.open(dest) as tar:
        names = set(tar.getnames())
    assert names == set(members)
    assert {"study.json", "study.log", "curves.png", "arms/a/train.log", "arms/b/monitor.jsonl",
            "arms/a/gradinit.json", "gradinit/gi-aaa/gradinit.json", "gradinit/failed-gi-ccc/gradinit.log"} <= names
    assert not any(n.endswith(".pt") for n in names) and not any("gi-bbb" in n or "gi-other" in n for n in names)
    everything = study_archive.pack_study(out, tmp_path / "all.tgz", cache_dir=cache)  # groups unknown: all of them
    assert any(n.startswith("gradinit/gi-other/") for n in everything)
    assert not (tmp_path / "export" / "call.tar.gz.part").exists()
    with pytest.raises(ValueError, match=r"\.tar\.gz"):
        study_archive.check_archive_path(tmp_path / "call.zip")


def test_docs_state_the_hold_command_and_its_estimate():
    # the call plan is in the research notebook, the commands and the BLEU step in lab/study.md
    doc = "\n".join((REPO / "lab" / page).read_text(encoding="utf-8") for page in ("record/no-warmup.md", "study.md"))
    assert "--preset hold --call A" in doc and "--archive RESULTS/hold-A.tar.gz" in doc
    for call in HOLD.calls:
        e = call_estimate(HOLD, call)
        row = next(line for line in doc.splitlines() if line.startswith(f"| {call.name} |"))
        assert f"~{e.total_s:.0f} s, at most {e.upper_bound_s:.0f} s" in row, row
    a = HOLD.call("A")
    assert (f"`--call A` sets `--parallel {a.parallel} --time-budget {a.time_budget:g}\n"
            f"--bleu-budget {a.bleu_budget:g} --finish-margin {a.finish_margin:g}`") in doc
    from fairseq_gradinit.tools import evaluate_bleu as bleu

    assert f"{bleu.GPU_MAX_TOKENS:,} tokens and\n{bleu.GPU_BATCH_SIZE:,} sentences" in doc
    assert f"{a.bleu_budget * 60:.0f}-second budget" in doc


def test_cpu_presets_state_their_measured_duration_in_the_listing_and_the_dry_run(sep_bin, tmp_path):
    from lab.study.presets import PRESETS

    listing = describe_presets(("demo", "lm"))
    assert listing.count("duration where measured:") == 2
    # the durations quoted are those of the docs that measured them
    assert "most of a day" in PRESETS["demo"].duration
    assert "most of a day" in (REPO / "lab" / "record" / "debian-demo.md").read_text(encoding="utf-8")
    assert "12 minutes" in PRESETS["lm"].duration
    lm_page = (REPO / "lab" / "record" / "lm-nowarmup.md").read_text(encoding="utf-8")
    assert "(12 minutes: GradInit phase 106 s" in lm_page
    rc, out, err = _dry_run([str(sep_bin), "--preset", "demo", "--cpu", "--no-bleu", "--out", str(tmp_path / "d"),
                             "--dry-run"])
    assert rc == 0, err[-2000:]
    assert "no estimate on the CPU" in out and "duration of preset demo where measured: with --cpu, most of a day" in out
