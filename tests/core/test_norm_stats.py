"""Normalization-layer input statistics against values computed by hand."""
import math

import torch
from torch import nn

from fairseq_gradinit.core.norm_stats import norm_input_stats, recording_norm_inputs


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.ln = nn.LayerNorm(8)
        self.bn = nn.BatchNorm1d(8)

    def forward(self, x):
        return self.bn(self.ln(self.lin(x)))


def test_layer_norm_input_std_and_gain_match_a_hand_computation():
    torch.manual_seed(0)
    m = Block().eval()
    with torch.no_grad():
        m.ln.weight.fill_(0.5)
        m.lin.weight.mul_(0.1)
    x = torch.randn(16, 8)
    stats = norm_input_stats(m, lambda mod: mod(x))
    h = m.lin(x).detach()
    want = h.std(dim=1, unbiased=False).mean().item()
    assert math.isclose(stats["ln"].input_std, want, rel_tol=1e-5)
    assert math.isclose(stats["ln"].gain, 0.5 / want, rel_tol=1e-5)
    assert stats["ln"].count == 16
    # BatchNorm: per channel over the batch, averaged over channels.
    ln_out = m.ln(h)
    assert math.isclose(stats["bn"].input_std, ln_out.std(dim=0, unbiased=False).mean().item(), rel_tol=1e-5)


def test_constant_positions_such_as_padding_are_left_out_and_hooks_are_removed():
    ln = nn.LayerNorm(4)
    x = torch.randn(3, 5, 4)
    x[:, 3:] = 0.0  # padded positions
    stats = norm_input_stats(ln, lambda mod: mod(x))
    assert stats[""].count == 9
    assert math.isclose(stats[""].input_std, x[:, :3].std(dim=-1, unbiased=False).mean().item(), rel_tol=1e-5)
    with recording_norm_inputs(ln) as seen:
        pass
    assert not ln._forward_pre_hooks and seen == {}
