"""Progress of the scale-learning loops: lines at a steady interval of wall time with an ETA, and the end of a
GradInit run warns when no objective iteration ran."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_gradinit.core import GradInitConfig, gradinit
from fairseq_gradinit.core import progress
from fairseq_gradinit.core.errors import flag_name
from fairseq_gradinit.core.progress import ProgressClock, format_duration, no_objective_advice


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_format_duration():
    assert [format_duration(s) for s in (0, 42.4, 60, 258, 3599, 3720)] == \
        ["0s", "42s", "1m00s", "4m18s", "59m59s", "1h02m"]


def test_clock_is_due_at_the_first_iteration_every_n_iterations_and_every_t_seconds():
    clock = FakeClock()
    pc = ProgressClock(every_iters=5, every_seconds=30, clock=clock)
    assert pc.due(1) == "iterations"
    assert pc.timing(1, 20) == "0s elapsed, ETA 0s"
    clock.now += 10
    assert pc.due(2) is None
    clock.now += 20
    assert pc.due(3) == "time"  # 30 s since the last line
    assert pc.timing(3, 20) == "30s elapsed, ETA 2m50s"  # 10 s an iteration, 17 left
    clock.now += 1
    assert pc.due(4) is None and pc.due(5) == "iterations"
    assert pc.timing(5, None) == "31s elapsed"  # no total, no ETA
    off = ProgressClock(every_iters=5, every_seconds=0, clock=clock)
    clock.now += 1e6
    assert off.due(2) is None


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def tiny_run(gamma, monkeypatch=None, seconds_per_loss=0.0, **overrides):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g))
               for _ in range(8)]
    fn = loss_fn
    if monkeypatch is not None:
        clock = FakeClock()
        monkeypatch.setattr(progress.time, "monotonic", clock)

        def fn(model, batch):  # every forward pass "takes" seconds_per_loss of wall time
            clock.now += seconds_per_loss
            return loss_fn(model, batch)
    cfg = GradInitConfig(optimizer="adam", eta=1e-3, lr=1e-2, gamma=gamma, **overrides)
    return gradinit(model, batches, fn, cfg)


def progress_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("gradinit iter ")]


def test_progress_lines_by_wall_time_with_eta(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="fairseq_gradinit")
    tiny_run(1e-9, monkeypatch, seconds_per_loss=10.0, iters=12, log_interval=1000, log_seconds=25.0)
    lines = progress_lines(caplog)
    # the first iteration, the last one, and some (not all) in between because 25 s passed
    assert lines[0].startswith("gradinit iter 1/12 | constraint |") and lines[-1].startswith("gradinit iter 12/12")
    assert 2 < len(lines) < 12
    assert all("elapsed, ETA " in line and "(gamma 1e-09)" in line for line in lines)
    assert lines[-1].endswith("ETA 0s")
    # lines by wall time show the last settled iteration, in order
    numbers = [int(line.split(" ")[2].split("/")[0]) for line in lines]
    assert numbers == sorted(set(numbers))

    caplog.clear()
    tiny_run(1e-9, monkeypatch, seconds_per_loss=10.0, iters=12, log_interval=1000, log_seconds=0)
    assert [line.split(" |")[0] for line in progress_lines(caplog)] == ["gradinit iter 1/12", "gradinit iter 12/12"]


def test_summary_warns_when_no_objective_iteration_ran(caplog):
    caplog.set_level(logging.INFO, logger="fairseq_gradinit")
    res = tiny_run(1e-9, iters=6)
    assert res.num_objective == 0 and res.num_constraint == 6
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith("gradinit: no objective iteration ran: 6 constraint iterations (|g|_1 ")
    # a Python caller is told the keywords to change (the plugin passes flag_name: tests/plugin)
    assert "against gamma 1e-09" in warnings[0] and "(iters=...)" in warnings[0] and "(gamma=...)" in warnings[0]
    assert "--gradinit" not in warnings[0]
    # with the log's prefix (date, level, logger) the line stays under 300 characters
    name = next(r.name for r in caplog.records if r.levelno == logging.WARNING)
    assert len(f"2026-01-01 00:00:00 | WARNING | {name} | {warnings[0]}") <= 300

    caplog.clear()
    res = tiny_run(1e9, iters=6)
    assert res.num_objective == 6
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("gradinit: 6 iterations")]
    assert summary == [summary[0]] and "(6 objective, 0 constraint, 0 skipped)" in summary[0]


def test_advice_counts_only_iterations_that_were_not_skipped():
    text = no_objective_advice(["constraint", "skipped", "constraint"], [5.0, None, 3.0], 1.0, 2)
    assert "no objective iteration ran: 2 constraint iterations and 1 skipped (|g|_2 5 -> 3 against gamma 1)" in text
    flags = no_objective_advice(["constraint"], [5.0], 1.0, 2, flag_name)
    assert "(--gradinit-iters)" in flags and "(--gradinit-gamma)" in flags and "=..." not in flags
    assert no_objective_advice(["skipped"], [None], 1.0, 2) is None
    assert no_objective_advice(["constraint", "objective"], [5.0, 0.5], 1.0, 2) is None


@pytest.mark.parametrize("value", [-1, float("nan"), True, "30"])
def test_log_seconds_must_be_a_finite_number_at_least_zero(value):
    with pytest.raises(ValueError, match="log_seconds"):
        GradInitConfig(log_seconds=value)
