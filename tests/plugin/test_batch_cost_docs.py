"""docs/options.md's sentence on what the default GradInit batch costs is the plugin's rule: the draw's size
(``gradinit_batch_tokens``) and its split into S and S~ (``split_draw``, ``authors_rows``)."""
from fractions import Fraction
from pathlib import Path

import pytest

pytest.importorskip("fairseq")

import fairseq_gradinit.fairseq_plugin  # noqa: E402,F401  (serves fairseq's tasks)
from fairseq_gradinit.core.batching import authors_rows, split_draw  # noqa: E402
from fairseq_gradinit.fairseq_plugin.settings.plan import build_plan  # noqa: E402
from fairseq_train import TINY_ONE_LAYER, parse  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
B = 3072  # --max-tokens (a multiple of 3 sentences of LENGTH tokens, so that thirds are whole sentences)
LENGTH = 16  # tokens of every sentence of the draw


def paragraph() -> str:
    text = (REPO / "docs" / "options.md").read_text(encoding="utf-8")
    start = text.index("**What the default GradInit batch costs**")
    return " ".join(text[start:text.index("\n\n", start)].split())


def plan_for(*extra):
    argv = [a for a in TINY_ONE_LAYER]
    argv[argv.index("--max-tokens") + 1] = str(B)
    return build_plan(parse(["data-bin-not-read", "--task", "translation", *argv, "--gradinit-iters", "1", *extra]))


def tokens(rows) -> int:
    (a, b), (c, d) = rows
    return (b - a) * LENGTH, (d - c) * LENGTH, max(0, min(b, d) - max(a, c)) * LENGTH


def times(x: Fraction) -> str:
    return f"{x.numerator}/{x.denominator}" if x.denominator > 1 else str(x.numerator)


def test_the_sentence_states_the_default_draw_and_what_each_iteration_processes():
    text = paragraph()
    plan = plan_for()
    draw = Fraction(plan.max_tokens, B)
    assert draw == Fraction(3, 2) and f"draws {float(draw):g} × `--max-tokens` tokens" in text
    s, s_tilde, shared = tokens(split_draw(plan.max_tokens // LENGTH, plan.config.overlap))
    assert s == B and s_tilde == s and shared == s // 2  # one training batch, another sharing half of it
    assert "S is one training batch and S̃ another of the same size that shares half of S" in text
    assert f"An objective iteration passes over S and S̃, {times(Fraction(s + s_tilde, B))} × `--max-tokens` tokens" \
        in text
    assert f"a constraint iteration passes over S, {times(Fraction(s, B))} × `--max-tokens` tokens" in text


def test_the_cheaper_split_and_the_authors_split_are_the_code_s():
    text = paragraph()
    plan = plan_for("--gradinit-max-tokens", str(B))
    s, s_tilde, _ = tokens(split_draw(plan.max_tokens // LENGTH, plan.config.overlap))
    assert Fraction(s, B) == Fraction(s_tilde, B) == Fraction(2, 3)
    assert f"processes {times(Fraction(s + s_tilde, B))} × `--max-tokens` per objective iteration" in text
    assert "pass `--gradinit-max-tokens` equal to `--max-tokens` for it" in text
    assert "`--gradinit-max-tokens` / (2 - overlap) tokens" in text
    # --gradinit-pairs authors: the same draw, S and S~ two thirds of it each (what the default processes)
    authors = plan_for("--gradinit-pairs", "authors")
    assert authors.max_tokens == plan_for().max_tokens
    n = authors.max_tokens // LENGTH
    s, s_tilde, _ = tokens(authors_rows(n))
    assert Fraction(s, n * LENGTH) == Fraction(s_tilde, n * LENGTH) == Fraction(2, 3) and s + s_tilde == 2 * B
    assert "`--gradinit-pairs authors` cuts the same draw into S and S̃ of two thirds each, so it costs what the " \
           "default costs" in text
