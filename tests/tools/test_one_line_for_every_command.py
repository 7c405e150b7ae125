"""Every console command ends a Ctrl-C or an OSError it does not handle itself with one line and exit
status 130 or 1, never a traceback: each entry point of setup.py is wrapped by the one top-level handler
(fairseq_gradinit.command_line.quiet.quiet_command). docs/reliability.md ("Tracebacks")."""
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def console_scripts():
    text = (ROOT / "setup.py").read_text(encoding="utf-8")
    return re.findall(r'"([\w-]+)=([\w.]+):(\w+)"', text)


@pytest.mark.parametrize("name, module, attr", console_scripts())
def test_every_console_script_has_the_top_level_handler(name, module, attr):
    if module.startswith("fairseq_gradinit.fairseq_plugin"):
        pytest.importorskip("fairseq")
    fn = getattr(importlib.import_module(module), attr)
    assert getattr(fn, "command", None) == name


def test_the_handler_turns_ctrl_c_and_os_errors_into_one_line(capsys):
    from fairseq_gradinit.command_line.quiet import quiet_command

    def full_disk():
        raise OSError(28, "No space left on device", "out/result.json")

    assert quiet_command(full_disk, "gradinit-x")() == 1
    assert capsys.readouterr().err == "gradinit-x: error: No space left on device: out/result.json\n"

    def ctrl_c():
        raise KeyboardInterrupt

    assert quiet_command(ctrl_c, "gradinit-x")() == 130
    assert capsys.readouterr().err.startswith("gradinit-x: interrupted (Ctrl-C)")


def test_a_real_sigint_in_a_command_is_one_line_and_exit_130():
    code = ("import os, signal, sys\nfrom fairseq_gradinit.command_line.quiet import quiet_command\n"
            "sys.exit(quiet_command(lambda: os.kill(os.getpid(), signal.SIGINT), 'gradinit-report')())")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["gradinit-report: interrupted (Ctrl-C); what it had not written yet "
                                                "was not written"]
