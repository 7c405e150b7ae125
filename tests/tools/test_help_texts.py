"""Every console command's ``--help`` reads well from the command that printed it: the usage under the
command's own name, a description that ends its sentence, nothing logged before the usage; gradinit-report's
says what goes after ``--``; gradinit-user-dir imports neither fairseq nor the plugin."""
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def console_scripts():
    return re.findall(r'"([\w-]+)=([\w.]+):(\w+)"', (ROOT / "setup.py").read_text(encoding="utf-8"))


def help_text(name, module, attr, monkeypatch, capsys) -> str:
    if module.startswith("fairseq_gradinit.fairseq_plugin"):
        pytest.importorskip("fairseq")
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exc:
        getattr(importlib.import_module(module), attr)()
    out, err = capsys.readouterr()
    assert exc.value.code == 0 and err == "", err
    return out


@pytest.mark.parametrize("name, module, attr", console_scripts())
def test_help_names_the_command_and_its_description_ends_its_sentence(name, module, attr, monkeypatch, capsys):
    paragraphs = help_text(name, module, attr, monkeypatch, capsys).split("\n\n")
    assert paragraphs[0].startswith(f"usage: {name} ")
    description = paragraphs[1].strip()
    assert not description.startswith(("options:", "positional arguments:")), f"{name} has no description"
    assert description.endswith((".", ".)")), f"{name}'s description stops mid-sentence: ...{description[-60:]!r}"


def test_report_help_says_that_the_fairseq_train_arguments_go_after_dashes(monkeypatch, capsys):
    text = help_text("gradinit-report", "fairseq_gradinit.tools.gradinit_report", "run", monkeypatch, capsys)
    usage = text.split("\n\n")[0]
    assert " -- " in usage and "fairseq-train" in usage
    epilog = text.split("\n\n")[-1]
    assert epilog.startswith("after --:") and "fairseq-train" in epilog


def test_user_dir_prints_its_usage_or_its_folder_and_nothing_else():
    code = ("import sys; from fairseq_gradinit.tools.user_dir import run; rc = run(); "
            "assert 'fairseq' not in sys.modules and 'fairseq_gradinit.fairseq_plugin' not in sys.modules; "
            "sys.exit(rc)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    helped = subprocess.run([sys.executable, "-c", code, "--help"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert helped.returncode == 0 and helped.stderr == "", helped.stderr
    assert helped.stdout.startswith("usage: gradinit-user-dir")
    plain = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr
    assert plain.stdout.splitlines() == [str(ROOT / "fairseq_gradinit")]
