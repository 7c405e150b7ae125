"""A study whose GradInit phase fails still finishes: study.json and bleu.json are written, the
command says which arms did not run and why, and the same --out takes a rerun of those arms."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fairseq")

from lab.study import cli as study_cli  # noqa: E402
from lab.study import runner as study_runner  # noqa: E402

TINY = "--arch transformer_iwslt_de_en --encoder-layers 1 --decoder-layers 1 --max-tokens 500 --lr 1e-3"
VALID_LINE = ("2026-11-27 10:00:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.5 | nll_loss 9.1 | "
              "ppl 550 | wps 0 | wpb 10 | bsz 2 | num_updates 2\n")


def fake_jobs(phase_fails):
    """run_jobs without processes: phases fail (or write scales), arms log one validation and save a
    checkpoint, BLEU jobs score 1.0. Dependencies are honoured as the real scheduler does."""
    def run(jobs, **kwargs):
        by_name = {j.name: j for j in jobs}
        for job in jobs:
            if any(by_name[d].status != "done" for d in job.deps):
                job.status, job.reason = "skipped", f"{', '.join(job.deps)} did not succeed"
                continue
            job.log.parent.mkdir(parents=True, exist_ok=True)
            job.started = job.ended = time.time()
            if job.kind == "phase":
                job.log.write_text("gradinit: error: every one of the 120 training samples was skipped\n")
                if phase_fails:
                    job.status, job.reason = "failed", f"exit code 1 (see {job.log})"
                    continue
                (job.log.parent / "gradinit.json").write_text(json.dumps({"scales": {}, "iterations": 1}))
                job.status = "done"
                job.on_success(job)
            elif job.kind == "arm":
                job.log.write_text(VALID_LINE)
                (job.log.parent / "checkpoint_1_2.pt").write_bytes(b"")
                job.status = "done"
            else:
                out = Path(job.cmd[job.cmd.index("--output-json") + 1])
                out.write_text(json.dumps({"bleu": 1.0, "signature": "s"}))
                job.status = "done"
    return run


def test_a_failed_gradinit_phase_with_bleu_on_finishes_the_study_and_a_rerun_works(tmp_path, monkeypatch, capsys):
    data = tmp_path / "bin"
    data.mkdir()
    for name in ("dict.de.txt", "dict.en.txt"):
        (data / name).write_text("a 1\n")
    for split in ("train", "test"):  # the split the GradInit arm reads, and BLEU's (never read here)
        (data / f"{split}.de-en.de.idx").write_bytes(b"")
    out = tmp_path / "out"
    script = tmp_path / "bleu.py"
    script.write_text("")
    argv = [str(data), "--out", str(out), "--cpu", "--base-args", TINY, "--max-update", "2", "--save-every", "2",
            "--gradinit-cache", str(tmp_path / "cache"),
            "--arm", "gi=--gradinit-iters 3", "--arm", "plain=--seed 2"]
    monkeypatch.setattr(study_runner, "run_jobs", fake_jobs(phase_fails=True))
    code = study_cli.main(argv, bleu_script=script)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    result = json.loads((out / "study.json").read_text())
    (group, entry), = result["gradinit_groups"].items()
    assert entry["error"].startswith("no scales: the GradInit phase failed (exit code 1")
    assert result["arms"]["gi"]["run"]["status"] == "skipped" and result["arms"]["plain"]["run"]["status"] == "done"
    bleu = json.loads((out / "bleu.json").read_text())
    assert bleu["arms"]["plain"]["bleu"] == 1.0
    assert bleu["arms"]["gi"]["bleu"] is None and bleu["arms"]["gi"]["reason"].startswith(
        f"the arm did not run ({group} did not succeed)")
    assert not (out / "arms" / "gi").exists()  # nothing that a rerun would take for a started arm
    said = [line for line in err.splitlines() if line.startswith("study: ")]
    assert said == [f"study: arm gi did not run: {group} did not succeed; see "
                    f"{tmp_path / 'cache' / f'failed-{group}' / 'gradinit.log.part'}"], err

    # the failed arm again, into the same --out: runs
    monkeypatch.setattr(study_runner, "run_jobs", fake_jobs(phase_fails=False))
    code = study_cli.main(argv[:-2], bleu_script=script)
    assert code == 0, capsys.readouterr().err
    again = json.loads((out / "study.json").read_text())
    assert again["arms"]["gi"]["run"]["status"] == "done" and again["gradinit_groups"][group]["computed_now"]


def test_a_study_from_any_folder_resolves_paths_against_it(tmp_path, monkeypatch):
    """Relative data, --out, --gradinit-cache and --file paths are the caller's: resolved against its
    folder before anything starts, and the jobs run in that folder (not the repository's)."""
    work = tmp_path / "work"
    (work / "bin").mkdir(parents=True)
    for name in ("dict.de.txt", "dict.en.txt"):
        (work / "bin" / name).write_text("a 1\n")
    for split in ("train", "test"):
        (work / "bin" / f"{split}.de-en.de.idx").write_bytes(b"")
    (work / "scales.json").write_text(json.dumps({"scales": {"encoder.embed_tokens.weight": 0.5}}))
    (work / "bleu.py").write_text("")
    seen = []
    fake = fake_jobs(phase_fails=False)

    def run(jobs, **kwargs):
        seen.append((kwargs["cwd"], kwargs["env"].get("PYTHONSAFEPATH"), [list(j.cmd) for j in jobs]))
        fake(jobs, **kwargs)

    monkeypatch.setattr(study_runner, "run_jobs", run)
    monkeypatch.chdir(work)
    code = study_cli.main(["bin", "--out", "out", "--cpu", "--base-args", TINY, "--max-update", "2",
                           "--save-every", "2", "--gradinit-cache", "cache", "--file", "s=scales.json",
                           "--arm", "gi=--gradinit-iters 3", "--arm", "file=--gradinit-init-file {s}"],
                          bleu_script=Path("bleu.py"))
    assert code == 0
    result = json.loads((work / "out" / "study.json").read_text())
    assert result["out"] == str(work / "out") and result["data"]["main"] == str(work / "bin")
    (group,) = result["gradinit_groups"].values()
    assert group["scales"].startswith(str(work / "cache") + "/")
    assert f"--gradinit-init-file {work / 'scales.json'}" in result["arms"]["file"]["command"]
    for cwd, safe_path, commands in seen:  # training jobs, then BLEU
        assert cwd == work and safe_path == "1"
        for cmd in commands:
            for path in (cmd[cmd.index(flag) + 1] for flag in ("--save-dir", "--output-json", "--path") if flag in cmd):
                assert path.startswith(str(work) + "/"), cmd


def _processes_mentioning(text):
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_sigterm_stops_the_study_and_its_jobs_and_leaves_no_temporary_folder(tmp_path):
    """`timeout` or a scheduler sends SIGTERM: the GradInit phase it runs is stopped too, its temporary
    folder in the cache becomes failed-gi-KEY (log kept), and the study ends with one line, status 143."""
    from fairseq_helpers import REPO, make_tiny_bin

    data = make_tiny_bin(tmp_path, {"train": 60, "valid": 8, "test": 8}, 200)
    cache = tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab.study", str(data), "--out", str(tmp_path / "out"), "--cpu",
         "--no-bleu", "--gradinit-cache", str(cache), "--base-args", TINY + " --encoder-embed-dim 16 "
         "--decoder-embed-dim 16 --encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 "
         "--decoder-attention-heads 2 --share-all-embeddings --optimizer adam --num-workers 0",
         "--arm", "g=--gradinit-iters 100000 --gradinit-log-interval 1"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            logs = list(cache.glob(".gi-*.tmp*/gradinit.log.part"))
            if logs and "gradinit iter 1/100000" in logs[0].read_text(errors="replace"):
                break
            time.sleep(0.5)
        assert proc.poll() is None and logs, proc.communicate()[1][-3000:]
        children = _processes_mentioning(str(logs[0].parent))
        assert children  # the phase is running
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        left = _processes_mentioning(str(cache))
        for pid in left:  # never leave a GradInit phase running after the test
            os.kill(pid, signal.SIGKILL)
    assert left == []
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    assert err.splitlines()[-1].startswith("study: stopped by SIGTERM; its jobs were stopped and no study.json "
                                           "was written. Rerun with a new --out")
    assert not list(cache.glob(".gi-*")) and len(list(cache.glob("failed-gi-*/gradinit.log.part"))) == 1
    assert not (tmp_path / "out" / "study.json").exists()


@pytest.mark.parametrize("flag", ["--out", "--gradinit-cache"])
def test_an_out_folder_that_cannot_be_written_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, flag):
    monkeypatch.setattr(study_runner, "run_jobs", lambda *a, **k: pytest.fail("a job was started"))
    (tmp_path / "bin").mkdir()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = [str(tmp_path / "bin"), "--out", str(tmp_path / "out"), "--cpu", "--arm", "x=--seed 2"]
    code = study_cli.main(argv + [flag, str(blocker / "sub")])
    err = capsys.readouterr().err
    assert code == 2 and f"error: {flag} {blocker / 'sub'} is below the file {blocker}, not a folder; give a folder " \
        "you can write" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_damaged_cached_group_is_computed_again_and_said_so(tmp_path, caplog):
    from lab.study import plan as study_plan
    from lab.study.arms import Arm
    from lab.study.plan import StudyConfig
    import shlex

    data = tmp_path / "bin"
    data.mkdir()
    for name in ("dict.de.txt", "dict.en.txt"):
        (data / name).write_text("a 1\n")
    (data / "train.de-en.de.idx").write_bytes(b"")
    cfg = StudyConfig(data={"main": str(data)}, out=tmp_path / "out", base=tuple(shlex.split(TINY)) + ("--cpu",),
                      arms=(Arm("g", ("--gradinit-iters", "3")),))
    _, groups = study_plan.plan_study(cfg)
    (group,) = groups.values()
    group.dir.mkdir(parents=True)
    (group.dir / "fingerprint.json").write_text(json.dumps(group.fingerprint))
    (group.dir / "gradinit.json").write_text(json.dumps({"scales": {}, "fingerprint": group.fingerprint}))
    assert study_plan.plan_study(cfg)[1][group.key].cached  # a whole entry is reused
    (group.dir / "gradinit.json").write_text('{"scales": {"encoder.')  # cut off
    caplog.set_level("WARNING")
    assert not study_plan.plan_study(cfg)[1][group.key].cached
    assert f"study: WARNING: the cached GradInit group {group.dir} is damaged (JSONDecodeError: " in caplog.text


@pytest.mark.parametrize("extra, expected", [
    (["--max-update", "0"], "--max-update must be an integer >= 1, got 0"),
    (["--valid-every", "-1"], "--valid-every must be an integer >= 1, got -1"),
    (["--save-every", "0"], "--save-every must be an integer >= 1, got 0"),
    (["--finish-margin", "-5"], "--finish-margin must be >= 0 seconds, got -5.0"),
    (["--finish-margin", "nan"], "--finish-margin must be >= 0 seconds, got nan"),
    (["--bleu-budget", "0"], "--bleu-budget must be a positive number of minutes, got 0.0"),
    (["--time-budget", "-1"], "--time-budget must be positive"),
])
def test_bad_study_numbers_are_refused_before_anything_runs(tmp_path, monkeypatch, capsys, extra, expected):
    monkeypatch.setattr(study_runner, "run_jobs", lambda *a, **k: pytest.fail("a job was started"))
    (tmp_path / "bin").mkdir()
    code = study_cli.main([str(tmp_path / "bin"), "--out", str(tmp_path / "out"), "--cpu", "--arm", "x=--seed 2",
                           *extra])
    err = capsys.readouterr().err
    assert code == 2 and f"error: {expected}" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def _tiny_bin(path: Path) -> Path:
    path.mkdir()
    for name in ("dict.de.txt", "dict.en.txt"):
        (path / name).write_text("a 1\n")
    for split in ("train", "test"):
        (path / f"{split}.de-en.de.idx").write_bytes(b"")
    return path


def test_a_second_study_into_the_same_out_merges_its_arms(tmp_path, monkeypatch, capsys, caplog):
    """The earlier arms stay in study.json, curves.csv and bleu.json; other settings are refused before
    anything runs."""
    data = _tiny_bin(tmp_path / "bin")
    script = tmp_path / "bleu.py"
    script.write_text("")
    out = tmp_path / "out"
    common = [str(data), "--out", str(out), "--cpu", "--base-args", TINY, "--max-update", "2", "--save-every", "2"]
    monkeypatch.setattr(study_runner, "run_jobs", fake_jobs(phase_fails=False))
    assert study_cli.main(common + ["--arm", "a=--seed 2"], bleu_script=script) == 0
    caplog.set_level("INFO")
    assert study_cli.main(common + ["--arm", "b=--seed 3"], bleu_script=script) == 0
    assert f"study: merged with the earlier study in {out} (its arms a)" in caplog.text
    result = json.loads((out / "study.json").read_text())
    assert list(result["arms"]) == ["a", "b"] and result["merged_arms"] == ["a"]
    assert result["arms"]["a"]["run"]["status"] == result["arms"]["b"]["run"]["status"] == "done"
    rows = (out / "curves.csv").read_text().splitlines()[1:]
    assert sorted({r.split(",")[0] for r in rows}) == ["a", "b"]
    bleu = json.loads((out / "bleu.json").read_text())
    assert {n: (e["bleu"], e["update"]) for n, e in bleu["arms"].items()} == {"a": (1.0, 2), "b": (1.0, 2)}
    assert bleu["update"] == 2
    assert result["bleu"] == bleu
    capsys.readouterr()

    monkeypatch.setattr(study_runner, "run_jobs", lambda *a, **k: pytest.fail("a job was started"))
    before = (out / "study.json").read_bytes()
    code = study_cli.main(common[:-4] + ["--max-update", "4", "--save-every", "2", "--arm", "c=--seed 4"],
                          bleu_script=script)
    err = capsys.readouterr().err
    assert code == 2 and f"error: --out {out} holds a study with other settings (max_update 2 -> 4): its arms and " \
        "this study's would not be comparable in one table; use another --out" in err, err
    for extra, differs in ((["--base-args", TINY + " --dropout 0.2"], "base arguments "),
                           (["--bleu-subset", "train"], "BLEU on test against T- lines -> train against T- lines"),
                           (["--no-bleu", "--valid-every", "50"], "valid_every 100 -> 50")):
        code = study_cli.main(common + extra + ["--arm", "c=--seed 4"], bleu_script=script)
        err = capsys.readouterr().err
        assert code == 2 and "holds a study with other settings (" + differs in err, err
    code = study_cli.main(common + ["--arm", "a=--seed 2"], bleu_script=script)  # an arm that ran: not again
    err = capsys.readouterr().err
    assert code == 2 and f"error: {out / 'arms' / 'a'} is not empty: fairseq would resume from it" in err, err
    assert (out / "study.json").read_bytes() == before
    (out / "study.json").write_text('{"arms": ')  # cut off: not merged blindly, not overwritten
    code = study_cli.main(common + ["--arm", "c=--seed 4"], bleu_script=script)
    err = capsys.readouterr().err
    assert code == 2 and f"error: --out {out} holds {out / 'study.json'}, which is not a study.json of this study " \
        "runner (JSONDecodeError" in err, err
    assert before != (out / "study.json").read_bytes() == b'{"arms": '


@pytest.mark.parametrize("extra, expected", [
    (["--archive", "{blocker}/call.tar.gz"], "--archive {blocker}/call.tar.gz: {blocker} is a file, not a folder; "
                                              "give a path you can write"),
    (["--archive", "{tmp}/notes.tgz"], "--archive {tmp}/notes.tgz exists and it does not start as a .tar.gz "
                                       "archive does"),
    (["--export", "{tmp}/out"], "--export {tmp}/out (its study.json) is the input --out {tmp}/out/study.json"),
    (["--bleu-args=--lenpen abc"], "--bleu-args: fairseq-generate rejects them: argument "
                                   "--lenpen: invalid float value: 'abc'"),
    (["--bleu-subset", "tst"], "--bleu-subset tst: {tmp}/bin has no such split (it has: test, train); pick one of "
                               "them, or pass --no-bleu"),
    (["--bleu-ref", "{tmp}/latin1.en"], "--bleu-ref {tmp}/latin1.en, line 2: byte 0xe9 at byte 2 of the line is not "
                                        "UTF-8; the references must be UTF-8 text"),
    (["--arm", "y=--dropout abc"], "arm y: fairseq-train rejects its arguments: argument "
                                   "--dropout: invalid float value: 'abc'"),
    (["--bleu-ref", "{tmp}/short.en"], "--bleu-ref {tmp}/short.en has 2 lines, but the split 'test' of {tmp}/bin has "
                                       "3 sentences: line i of the references must be sentence i of the split"),
])
def test_what_would_fail_after_the_study_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, extra,
                                                                         expected):
    monkeypatch.setattr(study_runner, "run_jobs", lambda *a, **k: pytest.fail("a job was started"))
    _tiny_bin(tmp_path / "bin")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    (tmp_path / "notes.tgz").write_text("my notes\n")
    (tmp_path / "latin1.en").write_bytes(b"fine\nd\xe9j\xe0 vu\n")
    (tmp_path / "short.en").write_text("one\ntwo\n")
    # the test split's index: fairseq's mmap format (version 1, int32 tokens), 3 sentences of 2 tokens
    (tmp_path / "bin" / "test.de-en.de.idx").write_bytes(
        b"MMIDIDX\x00\x00" + (1).to_bytes(8, "little") + bytes([4]) + (3).to_bytes(8, "little")
        + b"".join((2).to_bytes(4, "little") for _ in range(3)) + b"".join((8 * i).to_bytes(8, "little") for i in range(3)))
    (tmp_path / "bin" / "test.de-en.de.bin").write_bytes(bytes(24))
    fill = {"tmp": tmp_path, "blocker": blocker}
    code = study_cli.main([str(tmp_path / "bin"), "--out", str(tmp_path / "out"), "--cpu", "--base-args", TINY,
                           "--arm", "x=--seed 2", *[e.format(**fill) for e in extra]])
    err = capsys.readouterr().err
    assert code == 2 and f"error: {expected.format(**fill)}" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists() and (tmp_path / "notes.tgz").read_text() == "my notes\n"


def test_merged_bleu_names_one_update_only_when_every_score_is_at_it():
    from lab.study.merge import merge_bleu

    earlier = {"update": 2, "arms": {"a": {"bleu": 1.0}, "gone": {"bleu": 3.0}}}
    now = {"update": 4, "arms": {"b": {"bleu": 2.0}}}
    merged = merge_bleu(earlier, now, kept={"a": {}})
    assert merged["update"] is None and merged["arms"] == {"a": {"bleu": 1.0, "update": 2},
                                                            "b": {"bleu": 2.0, "update": 4}}
    assert merge_bleu(earlier, dict(now, update=2), kept={"a": {}})["update"] == 2
