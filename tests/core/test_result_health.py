"""The engine's gradinit() returns a health verdict, as the vision API does: judged from the learned scales and
the phase alone (no pass over the model), and written with the result."""
import json

import torch
import torch.nn.functional as F
from torch import nn

from fairseq_gradinit.core import GradInitConfig, gradinit


def _run(gamma):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(6)]
    cfg = GradInitConfig(optimizer="adam", eta=1e-3, lr=1e-2, gamma=gamma, iters=5)
    return gradinit(model, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1]), cfg)


def test_the_result_carries_a_verdict_on_its_scales_and_phase():
    result = _run(1e9)  # gamma far above ||g||: every iteration optimizes the loss
    health = result.health
    assert health.verdict == "ok" and health.reasons == []
    assert health.phase.objective == 5 and health.norms is None  # no batch measured: the gains are not
    assert json.loads(json.dumps(result.to_dict()))["health"]["verdict"] == "ok"


def test_a_phase_without_an_objective_iteration_is_degenerate():
    health = _run(1e-9).health  # every iteration a constraint iteration
    assert health.verdict == "degenerate"
    assert any(r.startswith("no objective iteration ran") for r in health.reasons)
