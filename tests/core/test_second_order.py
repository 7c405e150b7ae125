"""The constraint's second-order pass: <(H v)_i, W_i> from the adjoints of linear uses, against a plain
double backward, and the tensors it must leave to the full product."""
import argparse
import copy
import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_gradinit.core import BatchPair, GradInitConfig
from fairseq_gradinit.core.engine import GradInit, constraint_grad, grad_norm
from fairseq_gradinit.core.modes import gradinit_mode, math_attention
from fairseq_gradinit.core.runtime import gradients
from fairseq_gradinit.core.second_order import gradient_with_graph

MATMULS = {"mm", "addmm", "bmm", "baddbmm"}


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in MATMULS:
            self.n += 1
        return func(*args, **(kwargs or {}))


def fairseq_transformer(dtype=torch.float64):
    fairseq = pytest.importorskip("fairseq")
    from fairseq.data import Dictionary
    from fairseq.models.transformer import TransformerModel, transformer_iwslt_de_en

    d = Dictionary()
    for k in range(30):
        d.add_symbol(f"w{k}")
    ns = argparse.Namespace(encoder_layers=2, decoder_layers=2, encoder_embed_dim=16, decoder_embed_dim=16,
                            encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32, encoder_attention_heads=2,
                            decoder_attention_heads=2, share_all_embeddings=True, dropout=0.1,
                            max_source_positions=64, max_target_positions=64)
    transformer_iwslt_de_en(ns)
    torch.manual_seed(0)
    model = TransformerModel.build_model(ns, argparse.Namespace(source_dictionary=d, target_dictionary=d))
    del fairseq
    return model.to(dtype), d


def padded_batch(d, seed, n=5, max_len=7):
    """Sentences of different lengths, padded (left for the source, right for the target, as fairseq)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, max_len + 1, (n,), generator=g)
    src = torch.full((n, max_len), d.pad())
    tgt = torch.full((n, max_len), d.pad())
    prev = torch.full((n, max_len), d.pad())
    for k, n_tok in enumerate(lens.tolist()):
        words = torch.randint(d.nspecial, len(d), (n_tok,), generator=g)
        src[k, max_len - n_tok:] = words
        t = torch.randint(d.nspecial, len(d), (n_tok,), generator=g)
        tgt[k, :n_tok] = t
        prev[k, 0] = d.eos()
        prev[k, 1:n_tok] = t[:-1]
    return {"net_input": {"src_tokens": src, "src_lengths": lens, "prev_output_tokens": prev},
            "target": tgt, "ntokens": int(lens.sum())}


def seq2seq_loss(model, sample):
    out = model(**sample["net_input"])
    lprobs = model.get_normalized_probs(out, log_probs=True).view(-1, out[0].size(-1))
    return F.nll_loss(lprobs, sample["target"].view(-1), ignore_index=1, reduction="sum") / sample["ntokens"]


def reference(model, loss_fn, batch, engine, norm_p):
    """<(H v)_i, W_i> by a plain double backward, v = d||g||_p / dg."""
    params = engine.target.scaled.params
    with math_attention():
        g = torch.autograd.grad(loss_fn(model, batch), params, create_graph=True)
        if norm_p == 1:
            v = [x.detach().sign() for x in g]
        else:
            n = torch.sqrt(sum((x.detach() ** 2).sum() for x in g))
            v = [x.detach() / n for x in g]
        used = [(x, vi) for x, vi in zip(g, v) if x.requires_grad]
        hv = torch.autograd.grad([x for x, _ in used], params, grad_outputs=[vi for _, vi in used],
                                 allow_unused=True)
    return torch.stack([(h * w).sum() if h is not None else w.new_zeros(())
                        for h, w in zip(hv, engine.target.scaled.W)]) * engine.target.scaled.scaled


def engine_grad(model, loss_fn, batch, engine):
    params = engine.target.scaled.params
    engine.target.scaled.write(engine.state.alpha)
    grads = gradients(loss_fn(model, batch), params)
    return constraint_grad(engine.target, engine.state.alpha, batch, grads, grad_norm(grads, engine.cfg.norm_p),
                           engine.cfg)


def covered(model, loss_fn, batch, engine):
    scaled = engine.target.scaled
    names = scaled.names
    with math_attention():
        _, graph = gradient_with_graph(model, loss_fn, batch, scaled.params, scaled.learned_positive)
    return {names[i] for i in graph.covered}, graph


def _engine(model, loss_fn, optimizer="adam", **kw):
    cfg = GradInitConfig(optimizer=optimizer, eta=1e-3, gamma=1e-9, lr=1e-3, **kw)
    engine = GradInit(model, loss_fn, cfg)
    g = torch.Generator().manual_seed(5)
    alpha = engine.state.alpha
    alpha.copy_(torch.rand(alpha.shape, generator=g, dtype=alpha.dtype) * 0.8 + 0.6)
    return engine


def covered_and_checked(model, loss_fn, batch):
    """The names of the covered tensors, after checking the engine against the plain double backward
    (float64, every tensor scaled)."""
    with gradinit_mode(model):
        engine = _engine(model, loss_fn, param_filter=lambda n, p: True)
        names, _ = covered(model, loss_fn, batch, engine)
        got = engine_grad(model, loss_fn, batch, engine)
        want = reference(model, loss_fn, batch, engine, 1)
        engine.finalize()
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12 * float(want.abs().max()))
    return names


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_fairseq_transformer_matches_a_plain_double_backward(optimizer):
    model, d = fairseq_transformer()
    batch = padded_batch(d, 1)
    with gradinit_mode(model):
        engine = _engine(model, seq2seq_loss, optimizer)
        with torch.no_grad():  # a padding row that is not zero: its positions must drop out
            engine.target.scaled.W[engine.target.scaled.names.index("encoder.embed_tokens.weight")][d.pad()].normal_()
        got = engine_grad(model, seq2seq_loss, batch, engine)
        want = reference(model, seq2seq_loss, batch, engine, 1 if optimizer == "adam" else 2)
        names, _ = covered(model, seq2seq_loss, batch, engine)
        engine.finalize()
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12 * float(want.abs().max()))
    weights = {n for n in engine.target.scaled.names if n.endswith(".weight") and "layer_norm" not in n}
    # fairseq scales cross-attention queries in place after the projection: those keep the full product
    in_place = {n for n in weights if "encoder_attn.q_proj" in n}
    assert in_place and names == weights - in_place


def test_a_covered_linear_use_saves_two_matrix_products_of_the_double_backward():
    model, d = fairseq_transformer(torch.float32)
    batch = padded_batch(d, 2)
    counts = {}
    with gradinit_mode(model):
        engine = _engine(model, seq2seq_loss)
        _, graph = covered(model, seq2seq_loss, batch, engine)
        linear_uses = sum(1 for u in graph.uses if u.x_edge is not None)
        positive = engine.target.scaled.learned_positive
        for name, floors in (("recorded", positive), ("full", [False] * len(positive))):
            engine.target.scaled.learned_positive = floors
            engine.target.scaled.write(engine.state.alpha)
            grads = gradients(seq2seq_loss(model, batch), engine.target.scaled.params)
            gnorm = grad_norm(grads, engine.cfg.norm_p)
            with CountMatmuls() as c:
                out = constraint_grad(engine.target, engine.state.alpha, batch, grads, gnorm, engine.cfg)
            counts[name] = (c.n, out)
        engine.finalize()
    assert linear_uses > 20
    assert counts["full"][0] - counts["recorded"][0] == 2 * linear_uses
    torch.testing.assert_close(counts["recorded"][1], counts["full"][1], rtol=2e-4, atol=1e-6)


class Shapes(nn.Module):
    """Uses a scaled tensor can have besides one linear operator."""

    def __init__(self, case):
        super().__init__()
        self.case = case
        self.emb = nn.Embedding(9, 6, padding_idx=0)
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6, bias=False)
        self.c = nn.Linear(6, 3)

    def forward(self, tokens):
        x = self.emb(tokens).mean(1)
        if self.case == "concatenated":  # one product of a and b together
            h = torch.tanh(F.linear(x, torch.cat([self.a.weight, self.b.weight]))[:, :6] + self.a.bias)
        elif self.case == "in_place":
            h = self.a(x)
            h.mul_(0.7)
            h = torch.tanh(h)
        elif self.case == "regularized":
            h = torch.tanh(self.a(x)) + 0.1 * self.a.weight.pow(2).sum()
        elif self.case == "data_input":
            h = torch.tanh(self.a(torch.linspace(-1, 1, 6, dtype=x.dtype).expand_as(x)) + x)
        else:
            h = torch.tanh(self.a(x))
        return self.c(torch.tanh(self.b(h)))


def shapes_loss(model, batch):
    tokens, labels = batch
    return F.cross_entropy(model(tokens), labels)


@pytest.mark.parametrize("case,full", [
    ("plain", set()),
    ("concatenated", {"a.weight", "b.weight"}),
    ("in_place", {"a.weight"}),
    ("regularized", {"a.weight"}),
    ("data_input", set()),
])
def test_tensors_used_otherwise_keep_the_full_product_and_every_result_is_exact(case, full):
    torch.manual_seed(0)
    model = Shapes(case).double()
    with torch.no_grad():
        model.emb.weight[0].normal_()  # the padding row enters the forward pass, not the gradient
    g = torch.Generator().manual_seed(1)
    batch = (torch.randint(0, 9, (7, 4), generator=g), torch.randint(0, 3, (7,), generator=g))
    assert covered_and_checked(model, shapes_loss, batch) == {"emb.weight", "a.weight", "b.weight", "c.weight"} - full


class LinearTail(nn.Module):
    """loss = sum(b(tanh(a(x)))): the gradient at b's input does not depend on b's output, so its
    adjoint is reached only through b's weight."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 5)
        self.b = nn.Linear(5, 2)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def test_an_adjoint_out_of_reach_redoes_the_pass_with_full_products(monkeypatch):
    torch.manual_seed(0)
    model = LinearTail().double()
    x = torch.randn(4, 5, dtype=torch.float64).requires_grad_()

    def loss_fn(m, batch):
        return m(batch).sum()

    passes = []
    import fairseq_gradinit.core.engine as engine_mod

    orig = engine_mod.gradient_with_graph

    def spy(*args):
        passes.append(sum(args[-1]))
        return orig(*args)

    monkeypatch.setattr(engine_mod, "gradient_with_graph", spy)
    with gradinit_mode(model):
        engine = _engine(model, loss_fn)
        got = engine_grad(model, loss_fn, x, engine)
        want = reference(model, loss_fn, x, engine, 1)
        engine.finalize()
    assert passes[0] > 0 and passes[1:] == [0]
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12 * float(want.abs().max()))


def test_recording_is_undone_and_other_threads_are_not_recorded():
    torch.manual_seed(0)
    model = LinearTail()
    params = list(model.parameters())
    seen = []

    def loss_fn(m, batch):
        t = threading.Thread(target=lambda: seen.append(F.linear(batch, m.a.weight)))
        t.start()
        t.join()
        return m(batch).pow(2).sum()

    _, graph = gradient_with_graph(model, loss_fn, torch.randn(3, 5), params, [True] * len(params))
    assert len(graph.uses) == 2 and seen[0].grad_fn.name() != "ViewBackward0"

    def failing(m, batch):
        raise RuntimeError("loss failed")

    before = F.linear, F.embedding
    with pytest.raises(RuntimeError, match="loss failed"):
        gradient_with_graph(model, failing, torch.randn(3, 5), params, [True] * len(params))
    assert (F.linear, F.embedding) == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scales_after_constraint_iterations_match_the_full_products(dtype):
    """Twelve iterations of the phase on the fairseq transformer (most of them constraint
    iterations): the scales agree with the run whose second-order pass takes the full products."""
    base, d = fairseq_transformer(dtype)
    pairs = [BatchPair(padded_batch(d, 10 + k), padded_batch(d, 40 + k)) for k in range(12)]
    runs = {}
    for full in (False, True):
        model = copy.deepcopy(base)
        with gradinit_mode(model):
            engine = GradInit(model, seq2seq_loss, GradInitConfig(optimizer="adam", eta=1e-3, gamma=None,
                                                                  gamma_init_factor=0.8, lr=5e-3))
            if full:
                engine.target.scaled.learned_positive = [False] * len(engine.target.scaled.params)
            for pair in pairs:
                engine.step(pair)
            engine.finalize()
        runs[full] = (engine.state.alpha.clone(), [r.branch for r in engine.history])
    assert runs[False][1] == runs[True][1] and runs[False][1].count("constraint") >= 6
    # A key bias shifts every attention logit of a query alike: its exact gradient is 0, so the sign
    # of its computed gradient, and with it its Adam steps, follow the rounding of whichever sums
    # computed it (in either dtype, and in a run against itself with other thread counts).
    keep = torch.tensor(["k_proj.bias" not in n for n in engine.target.scaled.names])
    # float64 checks the arithmetic; in float32 a few scales drift by up to ~2e-4 relative over the iterations,
    # since Adam's normalized steps carry the rounding of near-zero gradients in full
    torch.testing.assert_close(runs[False][0][keep], runs[True][0][keep], rtol=5e-4 if dtype == torch.float32
                               else 1e-7, atol=0)


class ConvNet(nn.Module):
    """Convolutions with and without a bias, batch-statistics BatchNorm, a 1-d convolution and a
    linear head."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.c2 = nn.Conv2d(4, 4, 3, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.c3 = nn.Conv1d(4, 5, 2, groups=1)
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        h = torch.tanh(self.c1(x))
        h = torch.tanh(self.bn(self.c2(h)))
        h = torch.tanh(self.c3(h.flatten(2)))
        return self.fc(h.mean(2))


def test_convolutions_match_a_plain_double_backward():
    torch.manual_seed(0)
    model = ConvNet().double()
    with torch.no_grad():
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.bias.normal_()
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(6, 3, 7, 7, generator=g, dtype=torch.float64), torch.randint(0, 3, (6,), generator=g))

    def loss_fn(m, b):
        return F.cross_entropy(m(b[0]), b[1])

    assert covered_and_checked(model, loss_fn, batch) == {"c1.weight", "c2.weight", "c3.weight", "fc.weight"}



def test_an_interrupt_mid_pass_leaves_torch_as_it_was():
    """SIGINT between two recorded uses: the KeyboardInterrupt propagates, ``torch.nn.functional`` keeps its
    functions, no torch function mode is left on the stack, and the next pass records as before."""
    import signal

    torch.manual_seed(0)
    model = LinearTail()
    params = list(model.parameters())
    functions = {name: getattr(F, name) for name in ("linear", "embedding", "conv1d", "conv2d", "conv3d")}
    modes = torch._C._len_torch_function_stack()

    def interrupted(m, batch):
        h = torch.tanh(m.a(batch))
        signal.raise_signal(signal.SIGINT)  # the default handler raises at the next bytecode
        return m.b(h).sum()

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            gradient_with_graph(model, interrupted, torch.randn(3, 5), params, [True] * len(params))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert {name: getattr(F, name) for name in functions} == functions
    assert torch._C._len_torch_function_stack() == modes
    _, graph = gradient_with_graph(model, lambda m, b: m(b).pow(2).sum(), torch.randn(3, 5), params,
                                   [True] * len(params))
    assert len(graph.uses) == 2


def test_uses_are_recorded_however_the_function_was_imported():
    """A module that imported ``linear`` by name, and ``F.multi_head_attention_forward``'s own projections."""
    from torch.nn.functional import linear

    torch.manual_seed(0)
    mha = nn.MultiheadAttention(4, 2).double()
    w = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
    params = [w, mha.in_proj_weight, mha.out_proj.weight]

    def loss_fn(m, x):
        h = linear(x, w)
        return m(h, h, h, need_weights=False)[0].pow(2).sum()

    _, graph = gradient_with_graph(mha, loss_fn, torch.randn(3, 2, 4, dtype=torch.float64), params,
                                   [True] * len(params))
    assert graph.covered == {0, 1, 2}
