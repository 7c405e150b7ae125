"""gamma measured at the init (gamma_init_factor), the authors' S/S~ of one batch (pairs="authors"),
and GradInit runs that train with a warmup and their own dropout settings."""
import copy
import json
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_gradinit.core import GradInit, GradInitConfig, gradinit
from fairseq_gradinit.core.batching import authors_pairs, authors_rows


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def small_model():
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def batches(n=3, rows=9):
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(rows, 6, generator=g), torch.randint(0, 3, (rows,), generator=g)) for _ in range(n)]


def norm_at_init(model, batch, p):
    """||dL/dtheta||_p of ``batch`` on ``model`` as it is: plain autograd, every tensor."""
    model = copy.deepcopy(model).eval()
    grads = torch.autograd.grad(loss_fn(model, batch), list(model.parameters()))
    flat = torch.cat([g.reshape(-1).double() for g in grads])
    return float(flat.abs().sum()) if p == 1 else float(flat.pow(2).sum().sqrt())


@pytest.mark.parametrize("optimizer,pairs", [("adam", "overlap"), ("adam", "authors"), ("sgd", "overlap")])
def test_gamma_is_k_times_the_gradient_norm_at_the_init(optimizer, pairs):
    torch.manual_seed(0)
    model, data = small_model(), batches()
    first_s = data[0] if pairs == "overlap" else (data[0][0][:6], data[0][1][:6])  # 9 rows: S = rows 0..5
    want = norm_at_init(model, first_s, 1 if optimizer == "adam" else 2)
    k = 3.0
    result = gradinit(model, data, loss_fn, GradInitConfig(optimizer=optimizer, eta=0.01, iters=5, lr=0.01,
                                                           gamma_init_factor=k, pairs=pairs))
    assert result.history[0].grad_norm == pytest.approx(want, rel=1e-5)
    assert result.gamma == pytest.approx(k * want, rel=1e-5)
    d = result.to_dict()
    assert d["gamma"] == result.gamma and d["config"]["resolved_gamma"] == result.gamma
    assert d["config"]["gamma_init_factor"] == k and d["config"]["gamma"] is None
    # K > 1: the first iterations stay below the bound
    assert result.history[0].branch == "objective" and result.num_constraint == 0


def test_gamma_init_factor_below_one_makes_the_first_iteration_a_constraint_step_and_resumes():
    torch.manual_seed(0)
    model, data = small_model(), batches()
    cfg = GradInitConfig(eta=0.01, iters=2, lr=0.01, gamma_init_factor=0.5, pairs="overlap")
    engine = GradInit(model, loss_fn, cfg)
    assert engine.state.gamma is None
    rec = engine.step(next(iter(_pairs(data))))
    assert rec.branch == "constraint" and engine.state.gamma == pytest.approx(0.5 * rec.grad_norm)
    state = engine.state_dict()
    other = GradInit(copy.deepcopy(model), loss_fn, cfg)
    engine.finalize()
    other.target.scaled.write(torch.ones_like(other.state.alpha))
    other.load_state_dict(state)
    assert other.state.gamma == engine.state.gamma  # a resumed run keeps the bound measured at the init


def _pairs(data):
    from fairseq_gradinit.core.batching import overlapping_pairs

    return overlapping_pairs(data, 0.5)


def test_gamma_and_gamma_init_factor_exclude_each_other():
    with pytest.raises(ValueError, match="gamma_init_factor=2.0 is invalid: expected None when gamma is set"):
        GradInitConfig(gamma=10.0, gamma_init_factor=2.0)
    with pytest.raises(ValueError, match="gamma_init_factor"):
        GradInitConfig(gamma_init_factor=0.0)
    assert GradInitConfig(gamma_init_factor=2.0).resolved_gamma is None
    with pytest.raises(ValueError, match="pairs='authors'"):
        GradInitConfig(pairs="authors", overlap=0.25)
    with pytest.raises(ValueError, match="pairs"):
        GradInitConfig(pairs="thirds")


def test_authors_rows_are_the_first_and_the_last_two_thirds():
    assert authors_rows(9) == ((0, 6), (3, 9))
    assert authors_rows(10) == ((0, 6), (3, 10))  # k = 3: S~ keeps the row left over
    assert authors_rows(11) == ((0, 6), (3, 11))
    assert authors_rows(3) == ((0, 2), (1, 3))
    assert authors_rows(2) == ((0, 2), (0, 2)) and authors_rows(1) == ((0, 1), (0, 1))
    x = torch.arange(10.0).reshape(10, 1)
    (pair,) = list(authors_pairs([{"x": x, "name": "b"}]))
    assert torch.equal(pair.s["x"], x[:6]) and torch.equal(pair.s_tilde["x"], x[3:])
    assert pair.s["name"] == "b"


def test_the_engine_and_the_vision_api_evaluate_exactly_those_slices():
    from fairseq_gradinit.vision import gradinit as vision_gradinit

    seen = []

    def recording_loss(model, batch):
        seen.append(batch[1].tolist())
        return loss_fn(model, batch)

    data = [(torch.randn(10, 6), torch.arange(10) % 3 + 10 * i) for i in range(2)]
    data = [(x, y % 3) for x, y in data]
    labels = [y.tolist() for _, y in data]
    torch.manual_seed(0)
    gradinit(small_model(), data, recording_loss, GradInitConfig(eta=1e-3, gamma=1e6, iters=2, lr=0.01,
                                                                 pairs="authors"))
    # objective iterations: S, then S~ (after the step), per batch
    assert seen == [labels[0][:6], labels[0][3:], labels[1][:6], labels[1][3:]]
    seen.clear()
    model = small_model()
    result = vision_gradinit(model, data, loss_fn=recording_loss, pairs="authors", progress=False,
                             optimizer="adam", eta=1e-3, gamma=1e6)
    assert len(result.history) == 2  # one pair per batch: one pass is len(loader) iterations
    assert seen[:4] == [labels[0][:6], labels[0][3:], labels[1][:6], labels[1][3:]]


# -- the fairseq plugin -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    pytest.importorskip("fairseq")
    from fairseq_helpers import make_tiny_bin

    return make_tiny_bin(tmp_path_factory.mktemp("pairs"), {"train": 300, "valid": 40, "test": 40}, nwords=300)


def test_plugin_authors_pairs_are_slices_of_one_collated_batch(tiny_data):
    import fairseq_gradinit.fairseq_plugin  # noqa: F401  (registers the tasks)
    from fairseq_gradinit.fairseq_plugin.data.training import (
        build_training_model, collate, training_batch_indices, training_dataset,
    )
    from fairseq_train import TINY_MODEL

    fm = build_training_model([str(tiny_data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
                               "--gradinit-pairs", "authors"])
    dataset = training_dataset(fm.task)
    pad = fm.task.target_dictionary.pad()
    batches = {tuple(sorted(b.tolist())) for b in training_batch_indices(fm.task, fm.model, dataset, max_tokens=600,
                                                                 seed=fm.cfg.common.seed)}
    with fm.task.gradinit_pairs(fm.model, 600, 0.5, fm.device) as pairs:
        drawn = [next(pairs) for _ in range(3)]
    for pair in drawn:
        s, st = pair
        n_s = s["nsentences"]
        k = n_s // 2
        # S then the rows of S~ past S: one whole batch of the training iterator, in the collater's order
        cat = {key: torch.cat([s["net_input"][key], st["net_input"][key][n_s - k:]])
               for key in ("src_tokens", "src_lengths", "prev_output_tokens")}
        ids = torch.cat([s["id"], st["id"][n_s - k:]])
        n = len(ids)
        assert tuple(sorted(ids.tolist())) in batches and n >= 3
        assert (n_s, st["nsentences"]) == (2 * (n // 3), n - n // 3)
        assert torch.all(cat["src_lengths"][:-1] >= cat["src_lengths"][1:])  # longest source first
        whole = collate(dataset, ids.tolist(), "cpu")  # the whole batch, collated once: same padded width
        row = {int(i): r for r, i in enumerate(whole["id"])}
        order = torch.tensor([row[int(i)] for i in ids])
        for key in cat:
            assert torch.equal(cat[key], whole["net_input"][key][order]), key
        target = torch.cat([s["target"], st["target"][n_s - k:]])
        assert torch.equal(target, whole["target"][order])
        for key in ("src_tokens", "prev_output_tokens"):  # S~ shares the rows k..2k of S, padding included
            assert torch.equal(st["net_input"][key][:k], s["net_input"][key][k:]), key
        assert s["ntokens"] == int((s["target"] != pad).sum()) and st["ntokens"] == int((st["target"] != pad).sum())


def test_gradinit_runs_take_a_warmup_dropout_flags_and_the_new_options(tiny_data, tmp_path, caplog):
    """fairseq-train: GradInit (gamma measured at the init, the authors' pairs), then inverse_sqrt with 5
    warmup updates and per-run dropout settings: the lr ramps up linearly, then decays."""
    from fairseq_train import TINY_MODEL, train_inprocess

    save = tmp_path / "ck"
    model = [a for a in TINY_MODEL]
    i = model.index("--dropout")
    model[i + 1] = "0.0"
    caplog.set_level("INFO")
    cfg = train_inprocess([str(tiny_data), "--task", "translation_gradinit", *model, "--attention-dropout", "0.0",
                           "--activation-dropout", "0.2", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
                           "--warmup-updates", "5", "--warmup-init-lr", "1e-7", "--max-update", "7",
                           "--save-dir", str(save), "--gradinit-iters", "3",
                           "--gradinit-gamma-init-factor", "2", "--gradinit-pairs", "authors"])
    assert (cfg.model.dropout, cfg.model.attention_dropout, cfg.model.activation_dropout) == (0.0, 0.0, 0.2)
    info = json.loads((save / "gradinit.json").read_text())
    assert info["config"]["pairs"] == "authors" and info["config"]["gamma_init_factor"] == 2.0
    assert info["gamma"] == pytest.approx(2.0 * info["history"][0]["grad_norm"], rel=1e-6)
    assert info["config"]["resolved_gamma"] == info["gamma"] and info["history"][0]["branch"] == "objective"
    # the health block judges this phase and measures every block on GradInit's last batch
    phase = info["health"]["phase"]
    assert phase["gamma"] == info["gamma"] and phase["iterations"] == 3 and phase["initial_norm_ratio"] == 0.5
    blocks = {b["name"] for b in info["health"]["blocks"]}
    assert {"encoder.layers.0", "decoder.layers.1", "encoder.embed_tokens"} <= blocks
    assert all(b["rms_before"] > 0 and b["rms_after"] > 0 for b in info["health"]["blocks"])
    lrs = [float(m) for m in re.findall(r"num_updates=\d+, lr=([0-9.e-]+),", caplog.text)]  # one line per update
    assert len(lrs) == 7, caplog.text[-2000:]
    # inverse_sqrt: lr = 1e-7 + u * (1e-3 - 1e-7) / 5 during the warmup, then 1e-3 * sqrt(5 / u)
    want = [1e-7 + u * (1e-3 - 1e-7) / 5 for u in range(1, 6)] + [1e-3 * (5 / u) ** 0.5 for u in (6, 7)]
    assert lrs == pytest.approx(want, rel=2e-3)
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 7


def test_the_doc_quotes_the_constraint_bound_phase_and_its_commands_parse():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "phase-options.md").read_text(encoding="utf-8")
    record = repo / "lab" / "record" / "evidence" / "nowarmup-d512-authors-2026-11-26"
    info = json.loads((record / "authors.gradinit.json").read_text())
    branches = [r["branch"] for r in info["history"]]
    first_objective = branches.index("objective")
    text = " ".join(doc.split())
    assert f"‖g‖₁ = {info['history'][0]['grad_norm']:,.0f} against γ = {info['config']['resolved_gamma']:.0f}" in text
    assert f"Iterations 1–{first_objective} were all constraint steps" in text
    assert f"{branches.count('constraint')} of its {len(branches)} iterations" in text
    assert "--gradinit-gamma-init-factor K" in doc and "--gradinit-pairs authors" in doc
    pytest.importorskip("fairseq")
    from fairseq import options

    import fairseq_gradinit.fairseq_plugin  # noqa: F401

    blocks = re.findall(r"```bash\n(.*?)```", doc, flags=re.S)
    assert len(blocks) == 2
    for block in blocks:
        argv = re.sub(r"\\\n\s*", " ", block).split()[1:]
        argv = ["/nonexistent-data" if a == "DATA" else a for a in argv if a != "..."]
        argv = argv[:1] + ["--task", "translation_gradinit", "--arch", "transformer", "--max-tokens", "4096",
                           "--lr", "5e-4"] + argv[3:]
        ns = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
        assert ns.gradinit_iters == 780


def test_the_plugin_refuses_a_gamma_and_a_factor_when_parsing(capsys):
    pytest.importorskip("fairseq")
    from fairseq import options

    import fairseq_gradinit.fairseq_plugin  # noqa: F401

    argv = ["/nonexistent-data", "--task", "translation_gradinit", "--arch", "transformer", "--max-tokens", "100",
            "--lr", "1e-3", "--gradinit-iters", "5", "--gradinit-gamma", "10", "--gradinit-gamma-init-factor", "2"]
    with pytest.raises(SystemExit) as e:
        options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    assert e.value.code == 2
    assert "argument --gradinit-gamma-init-factor: invalid value 2.0: expected None when gamma is set" in \
        capsys.readouterr().err
    ns = options.parse_args_and_arch(options.get_training_parser(), input_args=argv[:-4] + argv[-2:])
    assert ns.gradinit_gamma is None and ns.gradinit_gamma_init_factor == 2.0  # not derived from eta
