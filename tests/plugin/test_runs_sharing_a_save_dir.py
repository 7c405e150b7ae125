"""Two runs into one --save-dir: a run with GradInit holds a lock on the folder, a second run stops
with one line naming the first, and a lock left by a killed run is taken over."""
import json
import socket
import subprocess
import sys
import threading

import pytest

pytest.importorskip("fairseq")

from fairseq_helpers import REPO  # noqa: E402
from fairseq_train import TINY_MODEL, env_with_repo, train_inprocess  # noqa: E402


def _argv(data, save, *extra):
    return [str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "1",
            "--save-dir", str(save), *extra]


def _start_until(cmd, marker):
    """Start ``cmd`` (killed after 400 s at the latest) and read its output until a line holds ``marker``:
    (process, watchdog, lines read)."""
    first = subprocess.Popen(cmd, cwd=REPO, env=env_with_repo(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    watchdog = threading.Timer(400, first.kill)
    watchdog.start()
    lines = []
    for line in first.stdout:
        lines.append(line)
        if marker in line:
            break
    return first, watchdog, lines


def test_second_run_during_a_gradinit_phase_is_refused_and_a_dead_runs_lock_taken_over(tiny_data, tmp_path, caplog):
    save = tmp_path / "ck"
    cmd = [sys.executable, "-m", "fairseq_cli.train", *_argv(tiny_data, save, "--gradinit-iters", "100000",
                                                             "--gradinit-log-interval", "1"),
           "--user-dir", "fairseq_gradinit"]
    first, watchdog, lines = _start_until(cmd, "gradinit iter 1/100000")  # the first run is inside its phase
    try:
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


def test_a_second_run_after_the_first_runs_phase_stops_before_any_work(tiny_data, tmp_path, caplog):
    """The lock holds for the whole run: a second run (with another --lr) started while the first trains
    after its GradInit phase stops before it resumes the first run's checkpoint."""
    save = tmp_path / "ck"
    cmd = [sys.executable, "-m", "fairseq_cli.train", *_argv(tiny_data, save, "--gradinit-iters", "2"),
           "--max-update", "100000", "--save-interval-updates", "2", "--no-epoch-checkpoints",
           "--user-dir", "fairseq_gradinit"]
    first, watchdog, lines = _start_until(cmd, "Saved checkpoint")  # the first run trains, has saved a checkpoint
    try:
        assert first.poll() is None and (save / "checkpoint_last.pt").exists(), "".join(lines)[-3000:]
        caplog.set_level("INFO")
        with pytest.raises(SystemExit) as exc:
            train_inprocess(_argv(tiny_data, save, "--gradinit-iters", "2", "--lr", "5e-4"))
        message = str(exc.value.code)
        assert message == (f"gradinit: error: another run (pid {first.pid} on host {socket.gethostname()}) is "
                           f"training in {save} (it holds {save / '.gradinit.lock'}); two runs into one --save-dir "
                           "would overwrite each other's gradinit.json and checkpoints. Wait until it has finished, or "
                           "use another --save-dir")
        assert "a checkpoint will be restored" not in caplog.text and "loaded checkpoint" not in caplog.text
    finally:
        first.kill()
        first.wait(timeout=60)
        watchdog.cancel()


def test_the_lock_is_kept_until_the_process_ends_and_then_removed(tmp_path):
    from fairseq_gradinit.fairseq_plugin.phase import lock

    code = ("import os, sys\n"
            "from fairseq_gradinit.fairseq_plugin.phase.lock import hold_save_dir\n"
            "hold_save_dir(sys.argv[1]); hold_save_dir(sys.argv[1])  # again: a no-op\n"
            "print(open(os.path.join(sys.argv[1], '.gradinit.lock')).read().split()[0] == str(os.getpid()))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a")], cwd=REPO, env=env_with_repo(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]
    assert not (tmp_path / "a" / lock.LOCK_NAME).exists()  # removed when the process ended
    # one process runs one fairseq-train at a time: taking another folder gives back the previous one
    lock.hold_save_dir(str(tmp_path / "b"))
    assert (tmp_path / "b" / lock.LOCK_NAME).exists()
    lock.hold_save_dir(str(tmp_path / "c"))
    assert not (tmp_path / "b" / lock.LOCK_NAME).exists() and (tmp_path / "c" / lock.LOCK_NAME).exists()
    lock.release_save_dirs()
    assert not (tmp_path / "c" / lock.LOCK_NAME).exists()
