"""The install check tells whether torch, torchvision and torchaudio belong together."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fairseq_gradinit.install_check import release, version_problems

REPO = Path(__file__).resolve().parents[2]


def test_release():
    assert release("2.14.1+cpu") == (2, 14) and release("0.29.1") == (0, 29) and release(None) is None


def test_matching_set_passes_and_missing_optional_packages_are_fine():
    assert version_problems({"torch": "2.14.1+cpu", "torchvision": "0.29.1", "torchaudio": "2.14.0"}) == ([], [])
    assert version_problems({"torch": "2.14.1", "torchvision": None, "torchaudio": None}) == ([], [])


def test_torchvision_of_another_release_is_an_error():
    errors, warnings = version_problems({"torch": "2.14.1", "torchvision": "0.28.0", "torchaudio": None})
    assert warnings == [] and len(errors) == 1
    assert "torchvision 0.28.0 does not belong to torch 2.14.1" in errors[0] and "torchvision==0.29.*" in errors[0]


def test_torchaudio_of_another_release_is_a_warning_that_says_what_it_affects():
    errors, warnings = version_problems({"torch": "2.14.1", "torchvision": "0.29.1", "torchaudio": "2.11.0+cu130"})
    assert errors == [] and len(warnings) == 1
    assert warnings[0].startswith("torchaudio 2.11.0+cu130 was released for torch 2.11, not 2.14.1")
    assert "text tasks" in warnings[0]


def test_no_torch_is_an_error():
    assert version_problems({"torch": None})[0][0].startswith("torch is not installed")


def test_command_prints_the_installed_versions():
    proc = subprocess.run([sys.executable, "-m", "fairseq_gradinit.install_check"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    import torch

    assert proc.returncode in (0, 1)
    assert proc.stdout.startswith(f"install check: torch {torch.__version__.split('+')[0]}")
    assert "torch build: " in proc.stdout
    assert ("install check: ok" in proc.stdout) == (proc.returncode == 0)
