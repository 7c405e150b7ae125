"""PyTorch's CPU threads for a GradInit run on the CPU: one per core that other programs leave free, only
when the user set no OMP_NUM_THREADS, chosen before the phase."""
import logging

import numpy as np
import pytest
import torch

from fairseq_gradinit.fairseq_plugin.features import cpu_threads
from fairseq_gradinit.fairseq_plugin.features.cpu_threads import busy_cores, choose_cpu_threads, cpu_times, threads_for

# /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice
STAT = "cpu  {user} 0 {system} {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 5\n"


def _stat(user, system, idle):
    return STAT.format(user=user, system=system, idle=idle)


def test_busy_cores_from_two_readings_of_proc_stat():
    assert cpu_times(_stat(100, 50, 850)) == (150, 1000)
    assert cpu_times("intr 5\n") is None
    # over the sample: 60 jiffies busy of 120 on 2 cores -> one core busy
    assert busy_cores(_stat(100, 50, 850), _stat(150, 60, 910), cores=2) == pytest.approx(1.0)
    assert busy_cores(_stat(100, 50, 850), _stat(100, 50, 850), cores=2) is None  # no time passed


@pytest.mark.parametrize("env, cores, current, busy, expected", [
    ({}, 2, 2, 0.05, None),  # idle: PyTorch's default (one thread per core) is the fastest
    ({}, 2, 2, 1.0, 1),  # one core busy: one thread
    ({}, 2, 2, 0.65, 1),
    ({}, 2, 2, 0.5, None),  # half a core is not a busy core
    ({}, 2, 2, 2.0, 1),  # never fewer than one
    ({}, 8, 8, 3.0, 5),
    ({}, 2, 1, 1.0, None),  # already one thread
    ({"OMP_NUM_THREADS": "2"}, 2, 2, 1.0, None),  # the user's choice stands
    ({}, 2, 2, None, None),  # no /proc/stat: nothing known, nothing changed
])
def test_one_thread_per_free_core_unless_the_user_chose(env, cores, current, busy, expected):
    assert threads_for(env=env, cores=cores, current=current, busy=busy) == expected


def test_the_choice_sets_torch_and_says_so(caplog, monkeypatch):
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with caplog.at_level(logging.INFO, logger=cpu_threads.__name__):
            assert choose_cpu_threads(on_cpu=True, env={}, sample=[1.0]) == 1
        assert torch.get_num_threads() == 1
        assert any(r.getMessage().startswith("gradinit: PyTorch uses 1 CPU thread instead of 2: other programs kept "
                                             "1.0 of the 2 cores busy") for r in caplog.records)
        torch.set_num_threads(2)
        assert choose_cpu_threads(on_cpu=True, env={"OMP_NUM_THREADS": "2"}, sample=[1.0]) is None
        assert choose_cpu_threads(on_cpu=False, env={}, sample=[1.0]) is None
        assert choose_cpu_threads(on_cpu=True, env={}, sample=[0.0]) is None
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_reading_is_this_machines(tmp_path):
    """A sample of the real /proc/stat (where there is one) is a number of cores between 0 and all of them."""
    busy = cpu_threads.sample_busy_cores(2, seconds=0.05)
    if busy is not None:
        assert 0.0 <= busy <= 2.0 + 1e-9
    assert cpu_threads.sample_busy_cores(2, seconds=0.0, path=str(tmp_path / "none")) is None


def test_the_plugin_chooses_before_the_phase_on_the_cpu(tiny_data, tmp_path, monkeypatch):
    pytest.importorskip("fairseq")
    from fairseq import tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import fairseq_gradinit.fairseq_plugin  # noqa: F401  (serves fairseq's tasks)
    from fairseq_gradinit.fairseq_plugin.phase.lock import release_save_dirs
    from fairseq_gradinit.fairseq_plugin.registration import hook
    from fairseq_train import TINY_ONE_LAYER as TINY, parse

    calls = []
    monkeypatch.setattr(hook, "choose_cpu_threads",
                        lambda *, on_cpu: calls.append((on_cpu, len(hook_runs))))
    hook_runs = []
    run = hook.GradInitTaskMixin.run
    monkeypatch.setattr(hook.GradInitTaskMixin, "run", lambda self, *a, **k: (hook_runs.append(1), run(self, *a, **k))[1])
    cfg = convert_namespace_to_omegaconf(parse([str(tiny_data), "--task", "translation", *TINY, "--lr", "5e-4",
                                                "--cpu", "--gradinit-iters", "1", "--save-dir", str(tmp_path / "a")]))
    np.random.seed(3)
    utils.set_torch_seed(3)
    try:
        task = tasks.setup_task(cfg.task)
        task.build_model(cfg.model)
        task.build_criterion(cfg.criterion)
    finally:
        release_save_dirs()
    assert calls == [(True, 0)]  # once, on the CPU, before the phase ran
    assert task.gradinit_result is not None


def test_the_plugins_choice_is_the_faster_in_the_stored_measurement():
    """docs/fairseq.md's table of these runs is generated from the same file (tests/repo/test_generated_docs.py)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    runs = json.loads((root / "docs" / "threads-translation.json").read_text())["runs"]
    seconds = {(r["one_core_busy"], r["setting"]): r["seconds"] for r in runs}
    for busy in (False, True):
        default, one = seconds[(busy, "default threads")], seconds[(busy, "OMP_NUM_THREADS=1")]
        # what the plugin picks on a 2-core machine: 2 threads idle, 1 with a core busy
        picked = threads_for(env={}, cores=2, current=2, busy=1.0 if busy else 0.0) or 2
        assert (default, one)[picked == 1] == min(default, one)


def test_the_docs_state_the_sample_and_the_log_line():
    from pathlib import Path

    page = " ".join((Path(__file__).resolve().parents[2] / "docs" / "fairseq.md").read_text().split())
    assert f"(over {cpu_threads.SAMPLE_SECONDS:g} s, from `/proc/stat`)" in page
    assert "`gradinit: PyTorch uses 1 CPU thread instead of 2: other programs kept 1.0 of the 2 cores busy as the run " \
           "started ...`" in page
