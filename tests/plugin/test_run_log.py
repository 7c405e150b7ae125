"""What a fairseq-train run with GradInit prints: wall-time progress lines during training, one summary line at
the end, and no line longer than MAX_LINE characters at the default log level (printouts at debug level)."""
import json
import logging
import math
import subprocess
import sys

import pytest
import torch

pytest.importorskip("fairseq")

from fairseq_gradinit.core.progress import format_duration  # noqa: E402
from fairseq_gradinit.fairseq_plugin.phase.run_log import TrainingProgress, summary_line  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.options import NO_WARMUP_TAU  # noqa: E402

from fairseq_helpers import REPO, make_tiny_bin  # noqa: E402

MAX_LINE = 300
BIN = sys.executable.rsplit("/", 1)[0]
TINY = [
    "--arch", "transformer_iwslt_de_en", "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
    "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "400", "--cpu",
    "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "100", "--num-workers", "0",
    "--no-progress-bar", "--max-update", "4",
]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_line_every_interval_with_the_mean_loss_in_base_2(caplog):
    clock = Clock()
    progress = TrainingProgress(10.0, clock=clock)
    caplog.set_level(logging.INFO, logger="fairseq_gradinit.fairseq_plugin.phase.run_log")
    for update in range(6):  # two train_steps per update (--update-freq 2): 12 nats over 4 samples each
        for _ in range(2):
            progress.on_train_step(update, (torch.tensor(12.0), 4, {}), ignore_grad=False)
        progress.on_train_step(update, (torch.tensor(1e9), 4, {}), ignore_grad=True)  # a dummy batch: not counted
        clock.t += 4.0
    lines = [r.getMessage() for r in caplog.records]
    # due at the first step at 12 s (update 3, the fourth); 8 s later the run ends
    assert len(lines) == 1 and lines[0].startswith("gradinit: training progress: update 4, 12s elapsed, 0.333 updates/s")
    assert f"loss {3 / math.log(2):.4g} over the last 4 updates" in lines[0]


def test_progress_line_says_the_time_left_to_max_update(caplog):
    clock = Clock()
    progress = TrainingProgress(10.0, clock=clock, max_update=100)
    caplog.set_level(logging.INFO, logger="fairseq_gradinit.fairseq_plugin.phase.run_log")
    for update in range(10):  # 2 s per update: 0.5 updates/s
        progress.on_train_step(update, (torch.tensor(1.0), 1, {}), ignore_grad=False)
        clock.t += 2.0
    lines = [r.getMessage() for r in caplog.records]
    # due at update 6, 10 s in: 0.6 updates/s, so the 94 updates left take 157 s
    assert lines[0].startswith("gradinit: training progress: update 6/100, 10s elapsed, 0.6 updates/s, ETA 2m37s")


def test_summary_line_reads_the_result_file(tmp_path):
    record = {"iterations": 20, "num_objective": 0, "num_constraint": 20, "num_skipped": 0, "wall_time": 75.0,
              "health": {"verdict": "degenerate"}}
    (tmp_path / "gradinit.json").write_text(json.dumps(record))
    (tmp_path / "monitor.jsonl").write_text("")
    line = summary_line(str(tmp_path / "gradinit.json"), str(tmp_path))
    assert line == (f"gradinit: summary: 20 iterations (0 objective, 20 constraint, 0 skipped) in 1m15s; health: "
                    f"DEGENERATE; files: {tmp_path / 'gradinit.json'}, {tmp_path / 'monitor.jsonl'}")
    assert summary_line(str(tmp_path / "missing.json"), str(tmp_path)) is None


def test_fairseq_train_says_what_happened_in_short_lines(tmp_path):
    data = make_tiny_bin(tmp_path, {"train": 120, "valid": 20, "test": 20}, 300)
    save = tmp_path / "ck"
    cmd = [f"{BIN}/fairseq-train", str(data), "--user-dir", "fairseq_gradinit", *TINY, "--save-dir", str(save),
           "--gradinit-iters", "3", "--gradinit-progress-seconds", "0.001"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    lines = out.splitlines()
    long = [f"{len(line)}: {line[:120]}" for line in lines if len(line) > MAX_LINE]
    assert not long, long
    assert sum("gradinit: training progress: update " in line for line in lines) >= 3
    assert all(", ETA " in line for line in lines if "gradinit: training progress: update " in line)
    summary = [line for line in lines if "gradinit: summary: 3 iterations (" in line]
    assert len(summary) == 1 and str(save / "gradinit.json") in summary[0]
    # the phase's one measured time: its last line, the summary and gradinit.json say the same
    saved = json.loads((save / "gradinit.json").read_text())
    took = format_duration(saved["wall_time"])
    assert sum(line.endswith(f" skipped) in {took}") and "gradinit: 3 iterations (" in line for line in lines) == 1
    assert f" skipped) in {took}; health: " in summary[0] and saved["wall_time_total"] >= saved["wall_time"]
    assert saved["config"]["tau"] == NO_WARMUP_TAU and "lr" not in saved["config"]  # the default tau, not the training lr
    assert lines.index(summary[0]) > max(i for i, line in enumerate(lines) if "done training" in line)
    # the model printout and the whole configuration: not at the default level, and still recorded
    assert "TransformerEncoder(" not in out and "'common': {" not in out
    assert "scales by group" not in out
    assert json.loads((save / "gradinit.json").read_text())["summary"]
