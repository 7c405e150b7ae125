"""A study whose GradInit phase fails still finishes: study.json and bleu.json are written, the
command says which arms did not run and why, and the same --out takes a rerun of those arms."""
import json
import time
from pathlib import Path

import pytest

pytest.importorskip("fairseq")

from fairseq_gradinit.study import cli as study_cli  # noqa: E402
from fairseq_gradinit.study import runner as study_runner  # noqa: E402

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
