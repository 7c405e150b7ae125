"""``--optimizer radam``: same steps as torch's RAdam, resumable from its state_dict."""
import copy
import sys

import pytest
import torch
from omegaconf import OmegaConf


from fairseq_gradinit.command_line.argtypes import parse_betas
from fairseq_gradinit.fairseq_plugin.optim.radam import FairseqRAdam, FairseqRAdamConfig


def _cfg(**kw):
    c = OmegaConf.structured(FairseqRAdamConfig(adam_betas="(0.9, 0.98)", weight_decay=1e-4, **kw))
    OmegaConf.update(c, "lr", [3e-2], force_add=True)
    return c


def _problem(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(5, 3, generator=g))
    x, y = torch.randn(16, 5, generator=g), torch.randn(16, 3, generator=g)
    return w, x, y


def _steps(opt, w, x, y, n):
    for _ in range(n):
        opt.zero_grad()
        ((x @ w - y) ** 2).mean().backward()
        opt.step()


@pytest.mark.parametrize("decoupled", [False, True])
def test_radam_matches_torch(decoupled):
    w1, x, y = _problem()
    w2 = copy.deepcopy(w1)
    _steps(FairseqRAdam(_cfg(decoupled_weight_decay=decoupled), [w1]), w1, x, y, 12)
    ref = torch.optim.RAdam([w2], lr=3e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=1e-4,
                            decoupled_weight_decay=decoupled)
    _steps(ref, w2, x, y, 12)
    assert torch.equal(w1, w2)
    assert not torch.equal(w1, _problem()[0])


def test_radam_state_dict_resume():
    w1, x, y = _problem()
    opt = FairseqRAdam(_cfg(), [w1])
    _steps(opt, w1, x, y, 4)
    w2 = copy.deepcopy(w1)
    opt2 = FairseqRAdam(_cfg(), [w2])
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    _steps(opt, w1, x, y, 5)
    _steps(opt2, w2, x, y, 5)
    assert torch.equal(w1, w2)


def test_parse_betas_errors():
    assert parse_betas("(0.9, 0.98)") == (0.9, 0.98)
    with pytest.raises(ValueError, match="expected"):
        parse_betas("(0.9,)")
    with pytest.raises(ValueError, match="expected"):
        parse_betas("nonsense(")


def test_fairseq_train_radam_and_resume(tiny_data, tmp_path):
    """fairseq-train --optimizer radam runs 2 updates, then resumes from checkpoint_last to 4."""
    import subprocess

    from fairseq_train import REPO, TINY_MODEL, env_with_repo

    save = tmp_path / "ck"

    def train(n):
        cmd = [sys.executable, "-m", "fairseq_cli.train", str(tiny_data), "--user-dir", str(REPO / "fairseq_gradinit"),
               "--task", "translation_gradinit", *TINY_MODEL, "--optimizer", "radam", "--adam-betas", "(0.9, 0.98)",
               "--weight-decay", "1e-4", "--lr", "1e-3", "--max-tokens", "500", "--max-update", str(n),
               "--save-dir", str(save), "--cpu", "--num-workers", "0", "--no-epoch-checkpoints", "--seed", "1"]
        return subprocess.run(cmd, cwd=tmp_path, env=env_with_repo(), capture_output=True, text=True, timeout=300)

    r = train(2)
    assert r.returncode == 0, r.stderr[-2000:]
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["last_optimizer_state"]["state"]
    assert state["optimizer_history"][-1]["optimizer_name"] == "FairseqRAdam"
    r = train(4)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "loaded checkpoint" in (r.stdout + r.stderr).lower()
    assert torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)["optimizer_history"][-1]["num_updates"] == 4
