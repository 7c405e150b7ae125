"""Two runs into one --save-dir: the GradInit phase holds a lock on the folder, a second run stops
with one line naming the first, and a lock left by a killed run is taken over."""
import json
import subprocess
import sys
import threading

import pytest

pytest.importorskip("fairseq")

from fairseq_helpers import REPO  # noqa: E402
from test_fairseq_plugin import TINY_MODEL, env_with_repo, tiny_data, train_inprocess  # noqa: E402,F401


def _argv(data, save, *extra):
    return [str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "1",
            "--save-dir", str(save), *extra]


def test_second_run_during_a_gradinit_phase_is_refused_and_a_dead_runs_lock_taken_over(tiny_data, tmp_path, caplog):
    save = tmp_path / "ck"
    cmd = [sys.executable, "-m", "fairseq_cli.train", *_argv(tiny_data, save, "--gradinit-iters", "100000",
                                                             "--gradinit-log-interval", "1"),
           "--user-dir", "fairseq_gradinit"]
    first = subprocess.Popen(cmd, cwd=REPO, env=env_with_repo(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    watchdog = threading.Timer(400, first.kill)
    watchdog.start()
    lines = []
    try:
        for line in first.stdout:  # wait until the first run is inside its GradInit phase
            lines.append(line)
            if "gradinit iter 1/100000" in line:
                break
        assert first.poll() is None, "".join(lines)[-3000:]

        with pytest.raises(SystemExit) as exc:
            train_inprocess(_argv(tiny_data, save, "--gradinit-iters", "2"))
        message = str(exc.value.code)
        assert message.startswith("gradinit: error: another run (pid %d on host " % first.pid), message
        assert "\n" not in message and "use another --save-dir" in message
        assert not (save / "gradinit.json").exists() and not (save / "checkpoint_last.pt").exists()
    finally:
        first.kill()  # SIGKILL: no chance to remove its lock file
        first.wait(timeout=60)
        watchdog.cancel()
    assert (save / ".gradinit.lock").read_text().split()[0] == str(first.pid)

    caplog.set_level("INFO")
    train_inprocess(_argv(tiny_data, save, "--gradinit-iters", "2"))
    assert f"left by pid {first.pid}" in caplog.text
    assert json.loads((save / "gradinit.json").read_text())["iterations"] == 2
    assert (save / "checkpoint_last.pt").exists() and not (save / ".gradinit.lock").exists()
