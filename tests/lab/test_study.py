"""The study runner (python -m lab.study, lab/study/): arm specs, presets,
GradInit groups, the budgeted scheduler, and one end-to-end run on a tiny model on the CPU."""
import csv
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fairseq")

from lab.study import arms as study_arms  # noqa: E402
from lab.study import cli as study_cli  # noqa: E402
from lab.study import plan as study_plan  # noqa: E402
from lab.study import results as study_results  # noqa: E402
from lab.study import runner as study_runner  # noqa: E402
from lab.study import scheduler as study_scheduler  # noqa: E402
from lab.study.arms import Arm  # noqa: E402
from lab.study.plan import StudyConfig  # noqa: E402
from lab.study.scheduler import Job  # noqa: E402
from lab.study.presets import PRESETS, describe_presets  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.init_file import compute_only_flags  # noqa: E402

from fairseq_helpers import REPO, make_tiny_bin  # noqa: E402

TINY_BASE = (
    "--arch", "transformer_iwslt_de_en", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
    "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings", "--dropout", "0.1", "--criterion", "label_smoothed_cross_entropy",
    "--label-smoothing", "0.1", "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "fixed",
    "--max-tokens", "500", "--num-workers", "0", "--seed", "1",
)
GI_TINY = ("--gradinit-iters", "3", "--gradinit-lr", "1e-2", "--gradinit-log-interval", "1")


@pytest.fixture(scope="module")
def tiny_bin(tmp_path_factory):
    return make_tiny_bin(tmp_path_factory.mktemp("studydata"), {"train": 120, "valid": 16, "test": 8}, 300)


# ------------------------------------------------------------------------------------------------
# arm specs and argument merging
# ------------------------------------------------------------------------------------------------
def test_arm_spec_round_trip_drop_and_data():
    arm = study_arms.parse_arm_spec("sep@separate=!--share-all-embeddings --share-decoder-input-output-embed "
                               "--adam-betas '(0.9, 0.999)'")
    assert arm.name == "sep" and arm.data == "separate" and arm.drop == ("--share-all-embeddings",)
    assert arm.args == ("--share-decoder-input-output-embed", "--adam-betas", "(0.9, 0.999)")
    assert study_arms.parse_arm_spec(arm.spec()) == arm
    assert study_arms.parse_arm_spec("x=").args == ()
    for bad in ("no-equals", "=--lr 1", "bad name=--lr 1"):
        with pytest.raises(ValueError):
            study_arms.parse_arm_spec(bad)


def test_merge_args_overrides_and_drops_base_options():
    base = ["--lr", "5e-4", "--adam-betas", "(0.9, 0.98)", "--share-all-embeddings", "--fp16", "--seed", "-1"]
    merged = study_arms.merge_args(base, ["--adam-betas", "(0.9, 0.999)", "--lr=1e-3"], drop=["--fp16"])
    assert merged == ["--share-all-embeddings", "--seed", "-1", "--adam-betas", "(0.9, 0.999)", "--lr=1e-3"]
    assert study_arms.substitute_files(["--gradinit-init-file", "{g98}", "{'x': 1}"], {"g98": "/a/b.json"}, arm="a") == \
        ["--gradinit-init-file", "/a/b.json", "{'x': 1}"]
    with pytest.raises(ValueError, match="--file other=PATH"):
        study_arms.substitute_files(["{other}"], {"g98": "/a"}, arm="a")


def test_arms_file(tmp_path):
    f = tmp_path / "arms.txt"
    f.write_text("# two arms\na=--lr 1e-3\n\nb@sep=!--fp16 \\\n  --seed 2\n")
    arms = study_arms.read_arms_file(f)
    assert [a.name for a in arms] == ["a", "b"] and arms[1].drop == ("--fp16",) and arms[1].args == ("--seed", "2")
    f.write_text("a=--lr 1\nbroken line\n")
    with pytest.raises(ValueError, match=":2:"):
        study_arms.read_arms_file(f)


# ------------------------------------------------------------------------------------------------
# presets
# ------------------------------------------------------------------------------------------------
def test_presets_parse_with_fairseq_and_group_as_documented(tiny_bin, tmp_path):
    """Every preset arm's command line is accepted by fairseq-train's parser, calls name existing
    arms, and GradInit groups follow what determines the scales: g98 and g999 (training betas only)
    share one."""
    text = describe_presets()
    for preset in PRESETS.values():
        assert f"== {preset.name}:" in text
        names = {a.name for a in preset.arms}
        for call in preset.calls:
            assert set(call.arms) <= names and set(call.prepare) <= names, call
        # parsing checks that an init file holds scales
        files = {key: str(tmp_path / f"{key}.json") for key in preset.files}
        for path in files.values():
            Path(path).write_text(json.dumps({"scales": {"encoder.embed_tokens.weight": 0.5}}))
        cfg = StudyConfig(data={"main": str(tiny_bin), "separate": str(tiny_bin)}, out=tmp_path / preset.name,
                          arms=tuple(preset.arms), base=preset.base, files=files, max_update=preset.max_update)
        plans, groups = study_plan.plan_study(cfg)
        assert [p.arm.name for p in plans] == [a.name for a in preset.arms]
        for plan in plans:  # an arm applies its group's scales without the settings that computed them
            if plan.group is not None:
                cmd = study_plan.arm_command(cfg, plan, groups)
                assert not any(t.split("=")[0] in compute_only_flags() for t in cmd), (plan.arm.name, cmd)
                assert cmd[cmd.index("--gradinit-init-file") + 1] == str(groups[plan.group].scales_file)
        if preset.name == "evidence":
            by_arm = {p.arm.name: p.group for p in plans}
            assert by_arm["g98"] == by_arm["g999"] and by_arm["g98"] is not None
            assert len({by_arm["g98"], by_arm["g98shared"], by_arm["g98tau1e-2"]}) == 3
            assert by_arm["x98"] is None and by_arm["w98"] is None
        if preset.name == "screen":
            cmd = study_plan.arm_command(cfg, next(p for p in plans if p.arm.name == "d1-sepdict"), groups)
            assert "--share-all-embeddings" not in cmd and "--share-decoder-input-output-embed" in cmd
            d8 = study_plan.arm_command(cfg, next(p for p in plans if p.arm.name == "d8-fp32"), groups)
            assert "--fp16" not in d8 and d8[d8.index("--gradinit-init-file") + 1] == files["g98"]
        if preset.name == "ablate":
            by_arm = {p.arm.name: p.group for p in plans}
            computed = [n for n, g in by_arm.items() if g is not None]
            assert by_arm["authors"] is None and by_arm["no-recipe"] is None
            assert len({by_arm[n] for n in computed}) == len(computed) == 7  # every setting its own phase
            ablate_groups = groups
        if preset.name == "wskip":
            by_arm = {p.arm.name: p.group for p in plans}
            assert by_arm["giw-s1"] == by_arm["giw999-s1"] is not None and len(groups) == 1
            admin = study_plan.arm_command(cfg, next(p for p in plans if p.arm.name == "admin-s2"), groups)
            assert admin[admin.index("--optimizer") + 1] == "radam" and "--wskip-profile-seed" in admin
        if preset.name == "confirm":
            by_arm = {p.arm.name: p.group for p in plans}
            assert by_arm["gi98-s2"] == by_arm["gi999-s2"] is not None and by_arm["gisgd-s1"] is not None
            # seed 2's scales are the ones ablate's call A caches as confirm-s2
            assert ablate_groups[by_arm["gi98-s2"]].arms == ["confirm-s2"]
            sgd = study_plan.arm_command(cfg, next(p for p in plans if p.arm.name == "xsgd-s1"), groups)
            assert "--adam-betas" not in sgd and sgd[sgd.index("--optimizer") + 1] == "sgd"


def test_screen_needs_its_second_data_bin(tiny_bin, tmp_path):
    sep = next(a for a in PRESETS["screen"].arms if a.name == "d1-sepdict")
    cfg = StudyConfig(data={"main": str(tiny_bin)}, out=tmp_path, arms=(sep,), base=PRESETS["screen"].base)
    with pytest.raises(ValueError, match="--data-bin separate=PATH"):
        study_plan.plan_study(cfg)


def test_bad_arguments_are_reported_before_anything_runs(tiny_bin, tmp_path):
    cfg = StudyConfig(data={"main": str(tiny_bin)}, out=tmp_path, base=TINY_BASE,
                      arms=(Arm("typo", ("--gradinit-iterz", "3")),))
    with pytest.raises(ValueError, match="arm typo: fairseq-train rejects"):
        study_plan.plan_study(cfg)
    with pytest.raises(ValueError, match="--save-dir"):
        StudyConfig(data={"main": str(tiny_bin)}, out=tmp_path, base=("--save-dir", "x"), arms=(Arm("a"),))


# ------------------------------------------------------------------------------------------------
# scheduler
# ------------------------------------------------------------------------------------------------
def test_scheduler_dependencies_parallelism_and_budget_kill(tmp_path):
    """A job waits for its dependency, a failed dependency skips its dependents, and a job still
    running at the deadline is killed (with its process group) instead of running on."""
    py = sys.executable
    jobs = [
        Job("fast", "phase", [py, "-c", "print('ok')"], tmp_path / "fast.log"),
        Job("bad", "phase", [py, "-c", "import sys; sys.exit(3)"], tmp_path / "bad.log"),
        Job("after-fast", "arm", [py, "-c", "print('ran')"], tmp_path / "a.log", deps=("fast",)),
        Job("after-bad", "arm", [py, "-c", "print('never')"], tmp_path / "b.log", deps=("bad",)),
        Job("sleeper", "arm", [py, "-c", "import time; time.sleep(60)"], tmp_path / "s.log", stop_time=True),
    ]
    t0 = time.time()
    study_scheduler.run_jobs(jobs, parallel=2, deadline=t0 + 4.0, finish_margin_s=1.0, poll_s=0.1)
    assert time.time() - t0 < 20
    status = {j.name: j.status for j in jobs}
    assert status == {"fast": "done", "bad": "failed", "after-fast": "done", "after-bad": "skipped",
                      "sleeper": "killed"}
    assert jobs[4].stop_time_hours is not None and 0 < jobs[4].stop_time_hours < 4 / 3600
    assert "--stop-time-hours" in (tmp_path / "s.log").read_text()
    assert (tmp_path / "a.log").read_text().strip().endswith("ran")


def test_common_update_and_curve_rows(tmp_path):
    for arm, updates in (("a", (2, 4, 6)), ("b", (2, 4)), ("c", ())):
        (tmp_path / arm).mkdir()
        for u in updates:
            (tmp_path / arm / f"checkpoint_1_{u}.pt").write_bytes(b"")
        (tmp_path / arm / "checkpoint_last.pt").write_bytes(b"")
    ck = {a: study_results.checkpoint_updates(tmp_path / a) for a in ("a", "b", "c")}
    assert study_results.common_update(ck) == 4  # the arm without checkpoints is left out
    assert study_results.common_update({"a": {1: Path("x")}, "b": {2: Path("y")}}) is None
    log = [
        "2026-11-26 18:53:44 | INFO | train_inner | epoch 001:    101 / 187 loss=10.191, nll_loss=9.784, ppl=881.56, "
        "wps=8469.7, ups=2.89, wpb=2934.2, bsz=214.6, num_updates=100, lr=0.0005, gnorm=0.604, loss_scale=64, "
        "train_wall=39, gb_free=138.2, wall=46",
        "2026-11-26 18:53:45 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.86 | nll_loss 9.5 | "
        "ppl 1 | num_updates 100",
        "2026-11-26 18:53:50 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.76 | nll_loss 9.4 | "
        "ppl 1 | num_updates 150 | best_loss 9.76",
    ]
    from fairseq_gradinit.tools import curves

    rows = study_results.curve_rows("g98", curves.parse_training_log(log))
    assert rows[0] == {"arm": "g98", "num_updates": 100, "valid_loss": 9.86, "valid_nll_loss": 9.5,
                       "train_loss": 10.191, "train_nll_loss": 9.784, "loss_scale": 64.0, "lr": 0.0005,
                       "gnorm": 0.604, "wall_s": 46.0}
    assert rows[1]["valid_loss"] == 9.76 and rows[1]["train_loss"] == "" and rows[1]["loss_scale"] == ""


def _interval(update, scale, gain, ratio, overflows=0):
    return json.dumps({"type": "interval", "update": update, "loss_scale": scale, "overflows": overflows,
                       "skipped_updates": overflows, "fixed_batch_loss": {"eval": 9.0, "train": 9.5},
                       "groups": {"decoder.4.fc1": {"weight_norm": 3.0, "update_ratio": ratio}},
                       "norms": {}, "summary": {"max_update_ratio": ratio, "max_update_ratio_group": "decoder.4.fc1",
                                                "max_ln_gain_eval": gain, "min_ln_input_std_eval": 1 / gain,
                                                "max_ln_gain_train": gain, "min_ln_input_std_train": 1 / gain}})


def test_curves_include_the_training_monitor_beside_the_loss(tmp_path):
    """An arm whose save dir has monitor.jsonl gets its series in curves.csv (and two more PNG panels);
    an arm without one keeps the plain columns; the export packs the monitor with the logs."""
    import tarfile

    from fairseq_gradinit.tools import curves

    log_lines = [
        "2026-11-26 18:53:44 | INFO | train_inner | epoch 001:    101 / 187 loss=10.191, nll_loss=9.784, "
        "num_updates=100, lr=0.0005, gnorm=0.604, loss_scale=64, train_wall=39, wall=46",
        "2026-11-26 18:53:45 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.86 | nll_loss 9.5 | "
        "ppl 1 | num_updates 100",
    ]
    for arm in ("gi", "warm"):
        (tmp_path / "arms" / arm).mkdir(parents=True)
        (tmp_path / "arms" / arm / "train.log").write_text("\n".join(log_lines) + "\n")
    (tmp_path / "arms" / "gi" / "monitor.jsonl").write_text("\n".join([
        json.dumps({"type": "start", "update": 0}),
        _interval(100, 64.0, 2.0, 0.01),
        json.dumps({"type": "overflow", "update": 150, "nonfinite": None}),
        _interval(200, 32.0, 8.6, 0.5, overflows=1),
        json.dumps({"type": "start", "update": 100}),  # resumed from the checkpoint at 100
        _interval(200, 16.0, 14.4, "inf", overflows=2),
        "{not json",
    ]) + "\n")
    all_curves = {arm: study_results.arm_curves(tmp_path / "arms" / arm / "train.log") for arm in ("gi", "warm")}
    gi = all_curves["gi"]
    assert gi["monitor_loss_scale"] == {100: 64.0, 200: 16.0}  # the resumed run's record of 200 wins
    assert gi["monitor_max_ln_gain_eval"] == {100: 2.0, 200: 14.4}
    assert gi["monitor_max_update_ratio"][200] == float("inf") and gi["monitor_overflows"] == {100: 0, 200: 2}
    assert gi["monitor_fixed_loss_train"] == {100: 9.5, 200: 9.5}
    assert gi["valid_loss"] == {100: 9.86} and not any(k.startswith("monitor_") for k in all_curves["warm"])
    assert curves.parse_monitor(["{}", "[]"]) == {k: {} for k in curves.MONITOR_SERIES}

    written = study_results.write_curves(tmp_path, all_curves)
    with open(written["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(study_results.CSV_FIELDS + study_results.MONITOR_FIELDS)
    by = {(r["arm"], r["num_updates"]): r for r in rows}
    assert by[("gi", "100")]["monitor_max_ln_gain_eval"] == "2.0" and by[("gi", "100")]["loss_scale"] == "64.0"
    assert by[("gi", "200")]["loss_scale"] == "" and by[("gi", "200")]["monitor_loss_scale"] == "16.0"
    assert by[("gi", "200")]["monitor_min_ln_input_std_eval"] == str(1 / 14.4)
    assert by[("warm", "100")]["monitor_max_ln_gain_eval"] == "" and ("warm", "200") not in by
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "png" not in written
    else:
        assert Path(written["png"]).stat().st_size > 0

    # without any monitor the CSV keeps its columns
    plain = tmp_path / "plain"
    plain.mkdir()
    with open(study_results.write_curves(plain, {"warm": all_curves["warm"]})["csv"], newline="") as f:
        assert tuple(next(csv.reader(f))) == study_results.CSV_FIELDS

    study_results.export_results(tmp_path, tmp_path / "export", [], tmp_path / "cache")
    with tarfile.open(tmp_path / "export" / "logs.tar.gz") as tar:
        assert {"gi/monitor.jsonl", "gi/train.log", "warm/train.log"} <= set(tar.getnames())


# ------------------------------------------------------------------------------------------------
# end to end (CPU, tiny model)
# ------------------------------------------------------------------------------------------------
def test_study_end_to_end_on_cpu(tiny_bin, tmp_path):
    """Two GradInit arms that differ only in the training betas share one GradInit group: it is
    computed once, both arms start from it through --gradinit-init-file; a third arm with a huge
    --max-update is stopped by the wall-time budget; curves (CSV, PNG, Markdown), BLEU at the
    common checkpoint and study.json are written; a second plan finds the scales cached."""
    out = tmp_path / "study"
    # relative paths, run from another folder than the repository: they are the caller's
    argv = [os.path.relpath(tiny_bin, tmp_path), "--out", "study", "--cpu", "--parallel", "3", "--max-update", "4",
            "--valid-every", "2", "--save-every", "2", "--time-budget", "1", "--finish-margin", "20",
            "--base-args", " ".join(f"'{t}'" if " " in t else t for t in TINY_BASE),
            "--arm", "gA=" + " ".join(GI_TINY) + " --gradinit-monitor-interval 2",
            "--arm", "gB=" + " ".join(GI_TINY) + " --adam-betas '(0.9, 0.999)'",
            "--arm", "long=--max-update 100000",
            "--bleu-args", "--max-len-b 5", "--export", str(tmp_path / "export"),
            "--archive", str(tmp_path / "call.tar.gz")]
    # from another folder the lab is found through PYTHONPATH, as lab/README.md says
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "lab.study", *argv], capture_output=True,
                          text=True, timeout=600, cwd=str(tmp_path), env=env)
    result_file = out / "study.json"
    logs = "\n".join(p.read_text()[-2000:] for p in out.rglob("*.log")) if out.exists() else ""
    assert proc.returncode == 0 and result_file.is_file(), proc.stdout[-3000:] + proc.stderr[-5000:] + logs
    result = json.loads(result_file.read_text())

    (group, info), = result["gradinit_groups"].items()
    assert info["arms"] == ["gA", "gB"] and info["computed_now"]
    scales = Path(info["scales"])
    assert scales.is_file() and json.loads(scales.read_text())["iterations"] == 3
    assert len(list((out / "gradinit").glob("gi-*"))) == 1
    for arm in ("gA", "gB"):
        log = (out / "arms" / arm / "train.log").read_text()
        assert f"--gradinit-init-file {scales}" in log.splitlines()[0]
        assert "gradinit: applied" in log and "gradinit iter" not in log  # no GradInit of its own
        assert result["arms"][arm]["ended_by"] == "max_update" and result["arms"][arm]["last_update"] == 4
        assert not (out / "arms" / arm / "gradinit.json").exists()
    # the arm's own flag reached fairseq's config (the run's config is in its checkpoints)
    ckpt_cfg = torch.load(out / "arms" / "gB" / "checkpoint_last.pt", map_location="cpu", weights_only=False)["cfg"]
    assert ckpt_cfg["optimizer"]["adam_betas"] in ("(0.9, 0.999)", [0.9, 0.999], (0.9, 0.999))
    long = result["arms"]["long"]
    assert long["gradinit_group"] is None and long["run"]["stop_time_hours"] <= 1 / 60
    assert long["ended_by"] in ("stop_time", "killed") and 4 <= long["last_update"] < 100000

    with open(out / "curves.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["arm"] for r in rows} == {"gA", "gB", "long"}
    ga = {int(r["num_updates"]): r for r in rows if r["arm"] == "gA"}
    assert set(ga) >= {2, 4} and float(ga[4]["valid_loss"]) > 0 and float(ga[2]["train_loss"]) > 0
    # gA's training monitor, beside its loss (the monitor does not split the GradInit group)
    assert float(ga[4]["monitor_max_ln_gain_eval"]) > 0 and float(ga[2]["monitor_max_update_ratio"]) > 0
    assert float(ga[4]["monitor_overflows"]) == 0 and all(r["monitor_max_ln_gain_eval"] == "" for r in rows
                                                     if r["arm"] == "gB")
    assert (out / "curves.md").read_text().count("|") > 10
    pytest.importorskip("matplotlib")
    assert (out / "curves.png").stat().st_size > 1000

    bleu = json.loads((out / "bleu.json").read_text())
    assert bleu["update"] == 4 and bleu["beam"] == 5
    from fairseq_gradinit.tools.user_dir import user_dir

    bleu_cmd = (out / "arms" / "gA" / "bleu.log").read_text().splitlines()[0]  # the installed package's BLEU step
    assert " -m fairseq_gradinit.tools.evaluate_bleu " in bleu_cmd and f"--user-dir {user_dir()} " in bleu_cmd
    for arm in ("gA", "gB", "long"):
        assert bleu["arms"][arm]["status"] == "done" and bleu["arms"][arm]["bleu"] is not None
        assert bleu["arms"][arm]["checkpoint"].endswith("_4.pt")
    exported = {p.name for p in (tmp_path / "export").iterdir()}
    assert {"study.json", "curves.csv", "bleu.json", "logs.tar.gz", "gradinit.tar.gz"} <= exported
    import tarfile

    with tarfile.open(tmp_path / "export" / "logs.tar.gz") as tar:
        assert "gA/monitor.jsonl" in tar.getnames()

    # one archive holds what the study exports, its GradInit group included, and no checkpoint
    import tarfile

    with tarfile.open(tmp_path / "call.tar.gz") as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path / "unpacked")
    assert {"study.json", "study.log", "curves.csv", "bleu.json", "arms/gA/train.log", "arms/long/bleu.json",
            f"gradinit/{group}/gradinit.json", f"gradinit/{group}/fingerprint.json"} <= names
    assert not any(n.endswith(".pt") for n in names)
    # the same study again, from the unpacked archive's cache: the scales are reused, nothing to compute
    cfg = StudyConfig(data={"main": str(tiny_bin)}, out=tmp_path / "again", base=TINY_BASE, cpu=True,
                      arms=(Arm("gC", GI_TINY),), gradinit_cache=tmp_path / "unpacked" / "gradinit")
    _, groups = study_plan.plan_study(cfg)
    (g,) = groups.values()
    assert g.cached and f"gi-{g.key}" == group


def test_a_phase_says_where_its_log_stays(tiny_bin, tmp_path, monkeypatch, caplog):
    """A GradInit phase writes its log in a temporary folder; the line that starts it names where the log stays."""
    seen = []

    def capture(jobs, **kwargs):
        seen.extend(jobs)
        raise KeyboardInterrupt

    monkeypatch.setattr(study_runner, "run_jobs", capture)
    cfg = StudyConfig(data={"main": str(tiny_bin)}, out=tmp_path / "out", base=TINY_BASE + ("--cpu",),
                      arms=(Arm("g", GI_TINY),))
    with pytest.raises(KeyboardInterrupt):
        study_runner.run_study(cfg)
    (phase,) = [j for j in seen if j.kind == "phase"]
    (failed,) = [p for p in cfg.cache_dir.iterdir()]  # where the interrupted phase's folder went
    assert f"in {failed} if it fails" in phase.kept_at
    assert f"kept as {cfg.cache_dir / phase.name / 'gradinit.log'} when the phase ends" in phase.kept_at

    caplog.set_level("INFO", logger=study_scheduler.__name__)
    job = Job("gi-x", "phase", [sys.executable, "-c", "pass"], tmp_path / "tmp" / "x.log.part", kept_at="kept as y")
    study_scheduler.run_jobs([job], parallel=1, poll_s=0.05)
    assert f"study: started phase gi-x (log {job.log}; kept as y)" in caplog.text


def test_interrupted_study_leaves_no_temporary_cache_folder(tiny_bin, tmp_path, monkeypatch):
    """Ctrl-C while a GradInit phase runs: its temporary folder becomes failed-gi-KEY (log kept),
    nothing half-written stays where a later study would look for cached scales."""
    def interrupted(jobs, **kwargs):
        for job in jobs:
            job.log.parent.mkdir(parents=True, exist_ok=True)
            job.log.write_text("# started\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(study_runner, "run_jobs", interrupted)
    cfg = StudyConfig(data={"main": str(tiny_bin)}, out=tmp_path / "out", base=TINY_BASE + ("--cpu",),
                      arms=(Arm("g", GI_TINY),))
    with pytest.raises(KeyboardInterrupt):
        study_runner.run_study(cfg)
    names = sorted(p.name for p in cfg.cache_dir.iterdir())
    assert len(names) == 1 and names[0].startswith("failed-gi-"), names
    assert (cfg.cache_dir / names[0] / "gradinit.log.part").read_text() == "# started\n"



def test_ctrl_c_ends_the_study_with_one_line_and_status_130(tiny_bin, tmp_path, monkeypatch, capsys):
    """Ctrl-C prints no traceback."""
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(study_runner, "run_jobs", interrupted)
    code = study_cli.main([str(tiny_bin), "--out", str(tmp_path / "out"), "--cpu", "--arm", "x=--seed 2",
                       "--base-args", " ".join(f"'{t}'" if " " in t else t for t in TINY_BASE)])
    err = capsys.readouterr().err
    assert code == 130 and "Traceback" not in err
    assert "study: interrupted (Ctrl-C); its jobs were stopped and no study.json was written" in err
    assert not (tmp_path / "out" / "study.json").exists()

def test_device_setup_dry_run(tmp_path):
    """scripts/device_setup.sh --dry-run: names the pip command for a complete cp312 wheel set and
    refuses a set that lacks a package or holds a wheel for another Python."""
    script = REPO / "scripts" / "device_setup.sh"
    names = ["ve_fairseq-0.12.3-cp312-cp312-manylinux_2_28_x86_64.whl", "hydra_core-1.3.2-py3-none-any.whl",
             "omegaconf-2.3.0-py3-none-any.whl", "bitarray-3.12.3-cp312-cp312-manylinux_2_17_x86_64.whl",
             "antlr4_python3_runtime-4.9.3-py3-none-any.whl"]
    for n in names:
        (tmp_path / n).write_bytes(b"")
    ok = subprocess.run(["bash", str(script), "--dry-run", str(tmp_path), "/tmp/site"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "--no-index --no-deps" in ok.stdout and "--target /tmp/site" in ok.stdout
    assert all(n in ok.stdout for n in names) and f"PYTHONPATH=/tmp/site:{REPO}" in ok.stdout  # wheels, checkout
    (tmp_path / names[4]).unlink()
    missing = subprocess.run(["bash", str(script), "--dry-run", str(tmp_path)], capture_output=True, text=True)
    assert missing.returncode == 1 and "antlr4_python3_runtime" in missing.stderr
    (tmp_path / names[4]).write_bytes(b"")
    (tmp_path / "bitarray-3.12.3-cp311-cp311-manylinux_2_17_x86_64.whl").write_bytes(b"")
    wrong = subprocess.run(["bash", str(script), "--dry-run", str(tmp_path)], capture_output=True, text=True)
    assert wrong.returncode == 1 and "not a cp312 wheel" in wrong.stderr


def test_study_json_of_a_failed_gradinit_phase_names_no_missing_files(tmp_path):
    """A failed phase is not 'computed_now' and names no scales file that does not
    exist; its log path is the one the failure moved it to; a computed group names its scales."""
    failed_log = tmp_path / "failed-gi-k" / "gradinit.log.part"
    failed_log.parent.mkdir()
    failed_log.write_text("boom\n")
    group = study_plan.GradInitGroup(key="k", fingerprint={}, arms=["a"], phase_argv=[], dir=tmp_path / "gi-k")
    job = Job(name="gi-k", kind="phase", cmd=["x"], log=failed_log, status="failed", reason="exit status 1")
    entry = study_runner.group_entry(group, job, 0.0)
    assert entry["computed_now"] is False and entry["scales"] is None
    assert Path(entry["phase"]["log"]).is_file()
    assert entry["error"] == f"no scales: the GradInit phase failed (exit status 1); see {failed_log}"
    group.dir.mkdir()
    group.scales_file.write_text("{}")
    job.status, job.reason = "done", ""
    entry = study_runner.group_entry(group, job, 0.0)
    assert entry["computed_now"] is True and entry["scales"] == str(group.scales_file) and "error" not in entry


FAKE_BLEU = '''import json, sys
out = sys.argv[sys.argv.index("--output-json") + 1]
if "/b/" in out:
    sys.exit("decoding failed")
json.dump({"bleu": 1.5, "argv": sys.argv}, open(out, "w"))
'''


def test_bleu_step_uses_length_limits_and_every_arm_gets_a_score_or_reason(tmp_path):
    """fairseq-generate gets --max-len-a 1.2 --max-len-b 10 unless --bleu-args
    overrides one, and every arm's bleu.json holds a score or why it has none."""
    script = tmp_path / "fake_bleu.py"
    script.write_text(FAKE_BLEU)
    plans = []
    for name, ckpts in (("a", [2, 4]), ("b", [2, 4]), ("c", [])):
        save = tmp_path / name
        save.mkdir()
        for u in ckpts:
            (save / f"checkpoint_1_{u}.pt").write_bytes(b"")
        plans.append(study_plan.ArmPlan(arm=Arm(name, ()), argv=[], data=str(tmp_path), save_dir=save))
    cfg = StudyConfig(data={"main": str(tmp_path)}, out=tmp_path, arms=tuple(p.arm for p in plans), bleu_script=script,
                      bleu_args=("--max-len-b", "5"))
    result = study_runner.run_bleu(cfg, plans, dict(os.environ))
    a = json.loads((tmp_path / "a" / "bleu.json").read_text())
    assert a["bleu"] == 1.5 and result["arms"]["a"]["bleu"] == 1.5
    gen = a["argv"][a["argv"].index("--") + 1:]
    assert gen == ["--max-len-a", "1.2", "--max-len-b", "5"]
    b = json.loads((tmp_path / "b" / "bleu.json").read_text())
    assert b["bleu"] is None and b["reason"].startswith("BLEU step failed") and result["arms"]["b"]["reason"] == b["reason"]
    c = json.loads((tmp_path / "c" / "bleu.json").read_text())
    assert c["bleu"] is None and "no checkpoint" in c["reason"]
    assert result["budget_s"] is None  # no --time-budget: no limit
    # with a time budget, the BLEU step is sized from the arms: 30 s per round of --bleu-parallel arms
    budgeted = dataclasses.replace(cfg, time_budget_s=600.0, bleu_parallel=2)
    assert [study_runner.bleu_budget_s(budgeted, n) for n in (1, 2, 3, 5)] == [30.0, 30.0, 60.0, 90.0]
    assert study_runner.bleu_budget_s(dataclasses.replace(budgeted, bleu_budget_s=12.0), 5) == 12.0
    at_once = dataclasses.replace(cfg, time_budget_s=600.0, parallel=5)  # by default as many as train at once
    assert at_once.bleu_at_once == 5 and study_runner.bleu_budget_s(at_once, 5) == 30.0
    one_at_a_time = dataclasses.replace(at_once, bleu_parallel=1)
    assert [study_runner.bleu_budget_s(one_at_a_time, n) for n in (1, 2, 5)] == [30.0, 60.0, 150.0]
    # each translation's limit is its round's share, less the time to write its result
    assert study_runner.bleu_arm_limit_s(one_at_a_time, 150.0, 5) == 30.0 - study_runner.BLEU_STOP_GRACE_S
    assert study_runner.bleu_arm_limit_s(budgeted, 90.0, 5) == 30.0 - study_runner.BLEU_STOP_GRACE_S
    assert study_runner.bleu_arm_limit_s(one_at_a_time, None, 5) is None


RATE_BLEU = '''import json, sys
out = sys.argv[sys.argv.index("--output-json") + 1]
decode = {"sentences_per_s": 50.0, "source_tokens_per_s": 700.0, "startup_s": 4.0, "projected_total_s": 34.0,
          "sentences_done": 1500, "sentences_total": 1500}
if "/slow/" in out:  # stopped by its own --time-limit: no score, the rate and the reason
    json.dump({"bleu": None, "reason": "fairseq-generate stopped after 200 of 1500 sentences", "argv": sys.argv,
               "decode": dict(decode, projected_total_s=90.0, sentences_done=200)}, open(out, "w"))
    sys.exit(1)
json.dump({"bleu": 2.5, "argv": sys.argv, "precision": "fp16" if "--fp16" in sys.argv else "fp32",
           "decode": decode}, open(out, "w"))
'''


def test_bleu_step_decodes_fp16_arms_in_fp16_and_records_the_measured_rate(tmp_path):
    """The BLEU step asks for fp16 decoding where the arm trained in fp16, gives each translation the
    budget as its --time-limit (it stops itself when its measured rate cannot finish), and bleu.json
    keeps every arm's measured decode rate and the budget the rates ask for."""
    script = tmp_path / "rate_bleu.py"
    script.write_text(RATE_BLEU)
    plans = []
    for name, argv in (("half", ["--fp16"]), ("full", []), ("slow", ["--fp16"])):
        save = tmp_path / name
        save.mkdir()
        (save / "checkpoint_1_10.pt").write_bytes(b"")
        plans.append(study_plan.ArmPlan(arm=Arm(name, ()), argv=argv, data=str(tmp_path), save_dir=save))
    cfg = StudyConfig(data={"main": str(tmp_path)}, out=tmp_path, arms=tuple(p.arm for p in plans), bleu_script=script,
                      bleu_budget_s=30.0, parallel=3, bleu_parallel=3)
    result = study_runner.run_bleu(cfg, plans, dict(os.environ))
    half = json.loads((tmp_path / "half" / "bleu.json").read_text())
    full = json.loads((tmp_path / "full" / "bleu.json").read_text())
    assert "--fp16" in half["argv"] and "--fp16" not in full["argv"]
    limit = half["argv"][half["argv"].index("--time-limit") + 1]
    assert float(limit) == 30.0 - study_runner.BLEU_STOP_GRACE_S
    assert result["arms"]["half"]["precision"] == "fp16" and result["arms"]["half"]["bleu"] == 2.5
    slow = json.loads((tmp_path / "slow" / "bleu.json").read_text())
    assert slow["bleu"] is None and slow["reason"].startswith("fairseq-generate stopped")
    assert slow["decode"]["projected_total_s"] == 90.0
    assert result["decode_rates"]["half"]["sentences_per_s"] == 50.0 and set(result["decode_rates"]) == {
        "half", "full", "slow"}
    assert result["budget_s"] == 30.0 and result["budget_needed_s"] == 90.0 + study_runner.BLEU_STOP_GRACE_S
    assert json.loads((tmp_path / "bleu.json").read_text())["budget_needed_s"] == result["budget_needed_s"]


TIMED_BLEU = '''import json, os, sys, time
out = sys.argv[sys.argv.index("--output-json") + 1]
start = time.time()
time.sleep(0.3)
json.dump({"bleu": 3.0, "n_sentences": 6, "argv": sys.argv, "start": start, "end": time.time(),
           "omp": os.environ.get("OMP_NUM_THREADS"),
           "batches": {"max_tokens": 65536, "batch_size": 4096, "num_workers": 0},
           "decode": {"sentences_per_s": 20.0, "projected_total_s": 1.0}}, open(out, "w"))
'''


def test_bleu_step_decodes_one_arm_at_a_time_each_within_its_share(tmp_path, monkeypatch):
    """With --bleu-parallel 1 the arms are translated one after the other with all cores each; each gets its
    share of the budget as --time-limit; bleu.json records the schedule, each arm's batch settings, time and rates."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    script = tmp_path / "timed_bleu.py"
    script.write_text(TIMED_BLEU)
    plans = []
    for name in ("a", "b", "c"):
        save = tmp_path / name
        save.mkdir()
        (save / "checkpoint_1_10.pt").write_bytes(b"")
        plans.append(study_plan.ArmPlan(arm=Arm(name, ()), argv=[], data=str(tmp_path), save_dir=save))
    cfg = StudyConfig(data={"main": str(tmp_path)}, out=tmp_path, arms=tuple(p.arm for p in plans), bleu_script=script,
                      bleu_budget_s=60.0, parallel=3, bleu_parallel=1)
    result = study_runner.run_bleu(cfg, plans, dict(os.environ, OMP_NUM_THREADS="1"))
    runs = [json.loads((tmp_path / n / "bleu.json").read_text()) for n in ("a", "b", "c")]
    spans = sorted((r["start"], r["end"]) for r in runs)
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:]))  # never two at once
    cores = str(os.cpu_count() or 1)
    assert {r["omp"] for r in runs} == {cores}  # the study's own thread share of the arms is not the decode's
    limits = {float(r["argv"][r["argv"].index("--time-limit") + 1]) for r in runs}
    assert limits == {60.0 / 3 - study_runner.BLEU_STOP_GRACE_S}
    schedule = result["schedule"]
    assert schedule["decodes_at_once"] == 1 and schedule["rounds"] == 3 and schedule["omp_num_threads"] == cores
    assert schedule["arm_time_limit_s"] == min(limits) and schedule["wall_s"] >= 0.9
    a = result["arms"]["a"]
    assert a["bleu"] == 3.0 and a["batches"]["max_tokens"] == 65536 and a["batches"]["batch_size"] == 4096
    assert a["wall_s"] >= 0.3 and a["sentences_per_s_overall"] == round(6 / a["wall_s"], 2)
    assert result["budget_needed_s"] == 3 * (1.0 + study_runner.BLEU_STOP_GRACE_S)
    assert json.loads((tmp_path / "bleu.json").read_text())["schedule"] == schedule
    # the lab's page on the BLEU step names these records
    docs = (Path(__file__).resolve().parents[2] / "lab" / "study.md").read_text(encoding="utf-8")
    paragraph = docs[docs.index("**The BLEU step.**"):].split("\n\n")[0]
    for key in ("schedule", "batches", "wall_s", "sentences_per_s_overall", "decode_rates", "budget_s",
                "budget_needed_s"):
        assert f"`{key}`" in paragraph and (key in result or key in a), key
    assert set(schedule) == {"decodes_at_once", "rounds", "arm_time_limit_s", "omp_num_threads", "wall_s"}
    assert "`benchmarks/bench_bleu_decode.py`" in paragraph and (REPO / "benchmarks" / "bench_bleu_decode.py").is_file()
    # two at once: two rounds, half the cores each, and a longer share per translation
    both = study_runner.run_bleu(dataclasses.replace(cfg, bleu_parallel=2), plans, dict(os.environ))
    assert both["schedule"]["rounds"] == 2 and both["schedule"]["omp_num_threads"] == str(max(1, int(cores) // 2))
    assert both["schedule"]["arm_time_limit_s"] == 60.0 / 2 - study_runner.BLEU_STOP_GRACE_S
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the caller's own setting stays
    assert study_runner.bleu_env({"OMP_NUM_THREADS": "3"}, 2)["OMP_NUM_THREADS"] == "3"


def _valid_line(update, loss):
    return (f"2026-11-29 03:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {loss} | nll_loss {loss} "
            f"| ppl 2 | wps 1 | wpb 1 | bsz 1 | num_updates {update} | best_loss {loss}\n")


def test_bleu_best_also_decodes_the_checkpoint_of_lowest_validation_loss(tmp_path):
    """--bleu-best: an arm whose lowest validation loss is at an earlier checkpoint gets that one decoded too (into
    bleu_best.json, its entry's 'best'); an arm whose best is the decoded one is not decoded twice."""
    script = tmp_path / "fake_bleu.py"
    script.write_text(FAKE_BLEU.replace('"/b/"', '"/never/"'))
    plans = []
    for name, losses in (("early", {2: 5.0, 4: 6.0}), ("late", {2: 6.0, 4: 5.0})):
        save = tmp_path / name
        save.mkdir()
        for u in losses:
            (save / f"checkpoint_1_{u}.pt").write_bytes(b"")
        (save / "train.log").write_text("".join(_valid_line(u, v) for u, v in losses.items()))
        plans.append(study_plan.ArmPlan(arm=Arm(name, ()), argv=[], data=str(tmp_path), save_dir=save))
    cfg = StudyConfig(data={"main": str(tmp_path)}, out=tmp_path, arms=tuple(p.arm for p in plans), bleu_script=script,
                      bleu_best=True)
    result = study_runner.run_bleu(cfg, plans, dict(os.environ))
    assert result["update"] == 4
    early = result["arms"]["early"]["best"]
    assert early["update"] == 2 and early["bleu"] == 1.5 and early["checkpoint"].endswith("checkpoint_1_2.pt")
    decoded = json.loads((tmp_path / "early" / "bleu_best.json").read_text())
    assert decoded["argv"][decoded["argv"].index("--path") + 1].endswith("checkpoint_1_2.pt")
    assert result["arms"]["late"]["best"] == {"update": 4, "same_as_decoded": True}
    assert not (tmp_path / "late" / "bleu_best.json").exists()
    # without the flag nothing more is decoded
    plain = study_runner.run_bleu(dataclasses.replace(cfg, bleu_best=False), plans, dict(os.environ))
    assert "best" not in plain["arms"]["early"]
