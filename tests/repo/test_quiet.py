"""Only the known third-party deprecation noise is hidden in this package's entry points, and it can be
shown again."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# the messages as hydra and torch print them during a fairseq-train run
EMIT = r'''
import warnings
from fairseq_gradinit.command_line.quiet import hide_known_noise
hide_known_noise()
warnings.warn("hydra.experimental.initialize() is no longer experimental. Use hydra.initialize()", UserWarning)
warnings.warn("\nThe version_base parameter is not specified.\nHydra will assume defaults for version 1.1.")
warnings.warn("In 'config': Usage of deprecated keyword in package header '# @package _group_'.", UserWarning)
warnings.warn("\n'config' is validated against ConfigStore schema with the same name.", UserWarning)
warnings.warn("Support for mismatched key_padding_mask and attn_mask is deprecated. Use same type for both instead.")
warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then device pinned memory won't be used.")
warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cuda', args...)` instead.", FutureWarning)
warnings.warn("`torch.jit.script` is deprecated. Please switch to `torch.compile` or `torch.export`.", FutureWarning)
warnings.warn("__array__ implementation doesn't accept a copy keyword, so passing copy=False failed.", DeprecationWarning)
warnings.warn("a warning of our own about pin_memory", UserWarning)
warnings.warn("torch.cuda.amp.autocast is used wrongly", UserWarning)
'''


def run(extra_env=None, flags=()):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "FAIRSEQ_GRADINIT_WARNINGS")}
    env.update(PYTHONPATH=str(REPO), **(extra_env or {}))
    proc = subprocess.run([sys.executable, *flags, "-c", EMIT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def test_known_noise_hidden_and_other_warnings_kept():
    err = run()
    assert "a warning of our own about pin_memory" in err and "torch.cuda.amp.autocast is used wrongly" in err
    for noise in ("hydra.experimental", "version_base", "package header", "ConfigStore", "key_padding_mask",
                  "device pinned memory", "torch.amp.autocast", "torch.jit.script"):
        assert noise not in err, noise


def test_fairseqs_own_worker_filter_in_the_environment_does_not_show_the_noise():
    """fairseq's data iterators leave PYTHONWARNINGS=ignore:semaphore_tracker:UserWarning in the environment of
    the processes a training run starts: that is not a user asking to see warnings."""
    err = run({"PYTHONWARNINGS": "ignore:semaphore_tracker:UserWarning"})
    assert "torch.jit.script" not in err and "a warning of our own about pin_memory" in err


def test_noise_shown_with_the_variable_or_the_users_own_filters():
    for err in (run({"FAIRSEQ_GRADINIT_WARNINGS": "all"}), run(flags=("-W", "default")),
                run({"PYTHONWARNINGS": "default"})):
        for noise in ("hydra.experimental", "version_base", "package header", "ConfigStore", "key_padding_mask",
                      "device pinned memory", "torch.amp.autocast", "torch.jit.script"):
            assert noise in err, noise


def test_the_pytest_config_hides_the_same_noise():
    """pyproject.toml's pytest filters and KNOWN_NOISE hide the same messages (the EMIT samples), nothing of ours."""
    import ast
    import re
    import tomllib  # Python >= 3.11, the supported versions

    from fairseq_gradinit.command_line.quiet import KNOWN_NOISE

    with open(REPO / "pyproject.toml", "rb") as f:
        filters = tomllib.load(f)["tool"]["pytest"]["ini_options"]["filterwarnings"]
    patterns = [f.split(":", 1)[1] for f in filters if f.startswith("ignore:")]
    assert len(patterns) == len(filters) == len(KNOWN_NOISE)
    samples = [node.args[0].value for node in ast.walk(ast.parse(EMIT))
               if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "warn"]
    ours = [s for s in samples if s.startswith(("a warning of our own", "torch.cuda.amp.autocast is used"))]
    assert len(samples) == 11 and len(ours) == 2
    for sample in samples:
        by_pytest = any(re.match(p, sample) for p in patterns)
        by_commands = any(re.match(p, sample) for p in KNOWN_NOISE)
        assert by_pytest == by_commands == (sample not in ours), sample
