"""An interrupted GradInit run resumed from its state ends exactly where an uninterrupted one does."""
import copy

import pytest
import torch
from torch import nn

from fairseq_gradinit.core import BatchPair, GradInitConfig, gradinit


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 7)
        self.norm = nn.LayerNorm(7)
        self.fc2 = nn.Linear(7, 3)

    def forward(self, x):
        return self.fc2(self.norm(torch.tanh(self.fc1(x))))


def loss_fn(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def pairs(n):
    g = torch.Generator().manual_seed(5)
    mk = lambda: (torch.randn(6, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g))  # noqa: E731
    return [BatchPair(mk(), mk()) for _ in range(n)]


# gamma between the norms seen: both branches occur, so per-branch moments and graph reuse are exercised
CFG = GradInitConfig(eta=0.05, gamma=3.0, lr=0.05, iters=12, adam_state="per_branch")


def test_interrupt_and_resume_gives_the_uninterrupted_result():
    torch.manual_seed(0)
    base = Net().double()
    data = pairs(12)
    whole = gradinit(copy.deepcopy(base), data, loss_fn, CFG)
    assert whole.num_objective and whole.num_constraint

    model = copy.deepcopy(base)
    saved = []

    def stop_at_7(rec):
        if rec.iteration == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gradinit(model, data, loss_fn, CFG, callback=stop_at_7, checkpoint=saved.append, checkpoint_interval=5)
    assert [len(s["history"]) for s in saved] == [5]
    for p, q in zip(model.parameters(), base.parameters()):  # the interrupted run left W
        assert torch.equal(p, q)
    resumed = gradinit(model, data[5:], loss_fn, CFG, state=saved[0])
    assert resumed.scales == whole.scales
    assert [r.branch for r in resumed.history] == [r.branch for r in whole.history]
    assert len(resumed.history) == 12


def test_a_state_is_refused_for_other_weights_settings_or_tensors():
    torch.manual_seed(0)
    base = Net().double()
    saved = []
    gradinit(copy.deepcopy(base), pairs(4), loss_fn, CFG, iters=4, checkpoint=saved.append, checkpoint_interval=2)
    state = saved[0]
    other = Net().double()
    with pytest.raises(ValueError, match="other initial weights"):
        gradinit(other, pairs(4), loss_fn, CFG, state=state)
    with pytest.raises(ValueError, match="other settings: eta"):
        gradinit(copy.deepcopy(base), pairs(4), loss_fn, CFG, eta=0.01, state=state)
    with pytest.raises(ValueError, match="other tensors"):
        gradinit(copy.deepcopy(base), pairs(4), loss_fn, CFG, state=dict(state, names=state["names"][::-1]))
    # more iterations than the interrupted run planned continue it
    longer = gradinit(copy.deepcopy(base), pairs(4)[2:], loss_fn, CFG, iters=6, state=state)
    assert len(longer.history) == 6
    with pytest.raises(ValueError, match="go together"):
        gradinit(copy.deepcopy(base), pairs(4), loss_fn, CFG, checkpoint_interval=2)


class DropoutNet(Net):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return self.fc2(self.drop(self.norm(torch.tanh(self.fc1(x)))))


def test_a_resumed_run_with_dropout_draws_the_masks_of_the_uninterrupted_one(caplog):
    cfg = GradInitConfig(eta=0.05, gamma=3.0, lr=0.05, iters=12, adam_state="per_branch", dropout=True)
    torch.manual_seed(0)
    base = DropoutNet().double()
    data = pairs(12)

    def run(**kwargs):  # each run as a fresh process with the same seed
        torch.manual_seed(1)
        return gradinit(copy.deepcopy(base), kwargs.pop("batches", data), loss_fn, cfg, **kwargs)

    whole = run()
    saved = []

    def stop_at_7(rec):
        if rec.iteration == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(callback=stop_at_7, checkpoint=saved.append, checkpoint_interval=5)
    assert [len(s["history"]) for s in saved] == [5] and saved[0]["rng"]["cpu"][0].dtype == torch.uint8
    resumed = run(batches=data[5:], state=saved[0])
    assert resumed.scales == whole.scales
    assert [r.branch for r in resumed.history] == [r.branch for r in whole.history]
    # the masks matter: a state without its random state resumes with other masks, and says so
    old = {k: v for k, v in saved[0].items() if k != "rng"}
    caplog.set_level("WARNING", logger="fairseq_gradinit.core.engine")
    other = run(batches=data[5:], state=old)
    assert other.scales != whole.scales
    assert "holds no random state" in caplog.text and "dropout masks" in caplog.text


def test_a_damaged_random_state_is_refused():
    torch.manual_seed(0)
    base = DropoutNet().double()
    saved = []
    gradinit(copy.deepcopy(base), pairs(4), loss_fn, CFG, iters=4, dropout=True, checkpoint=saved.append,
             checkpoint_interval=2)
    with pytest.raises(ValueError, match="random state"):
        gradinit(copy.deepcopy(base), pairs(4), loss_fn, CFG, dropout=True, state=dict(saved[0], rng={"cpu": 3}))

