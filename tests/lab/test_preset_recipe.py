"""The presets' authors' setting comes from the library's recipe: GI_AUTHORS is the recipe's flags less the
listed values the recorded runs left out, its command line stays what those runs passed, and the arms that add
the un-stepped output projection run the recipe's whole setting. The lab's derivation of gamma is the plugin's."""
import pytest

from fairseq_gradinit.core import GradInitConfig
from fairseq_gradinit.core.config import first_step
from fairseq_gradinit.core.options import options_of
from fairseq_gradinit.core.recipes import recipe

#: The command line the recorded authors runs passed (lab/record/evidence/nowarmup-d512-authors-2026-11-26).
RECORDED = ("--gradinit-iters", "780", "--gradinit-eta", "1e-3", "--gradinit-gamma", "1e3", "--gradinit-lr", "2.5e-3",
            "--gradinit-max-tokens", "6000", "--gradinit-adam-state", "per_branch", "--gradinit-step-params", "all",
            "--gradinit-scale-bounds", "[('bias', 0, None), ('norm', None, 100)]",
            "--gradinit-tied-embeddings", "shared", "--gradinit-lookahead-steps", "1")


def test_the_authors_flags_are_the_recipes_less_the_listed_values():
    from lab.study.presets import GI_AUTHORS, GI_AUTHORS_LEFT_OUT

    assert GI_AUTHORS == RECORDED
    authors = recipe("authors-iwslt14")
    given = dict(zip(GI_AUTHORS[::2], GI_AUTHORS[1::2]))
    flags = authors.flags()
    specs = {s.flag(): s for s in options_of(GradInitConfig, python_only=False)}
    for flag, text in zip(flags[::2], flags[1::2]):
        name = flag[len("--gradinit-"):].replace("-", "_")
        if name in GI_AUTHORS_LEFT_OUT:
            assert flag not in given and len(GI_AUTHORS_LEFT_OUT[name].split()) >= 4, flag
            continue
        parse = specs[flag].parse if flag in specs else int
        assert parse(given[flag]) == parse(text), flag
    assert set(GI_AUTHORS_LEFT_OUT) == {"optimizer", "betas", "min_scale", "overlap", "unstepped_uses"}
    # beyond the recipe: the plugin's own option at its default, and the recipe's single simulated step pinned
    assert set(given) - set(flags[::2]) == {"--gradinit-tied-embeddings", "--gradinit-lookahead-steps"}
    assert int(given["--gradinit-lookahead-steps"]) == authors.config().lookahead_steps == 1


def _resolved(argv):
    """The GradInit configuration and tokens per iteration that fairseq-train resolves from ``argv``."""
    pytest.importorskip("fairseq")
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import fairseq_gradinit.fairseq_plugin  # noqa: F401  (the --gradinit-* options)
    from fairseq_gradinit.fairseq_plugin.settings.option_values import gradinit_batch_tokens, gradinit_config_from_task

    ns = options.parse_args_and_arch(options.get_training_parser(),
                                     input_args=["data-bin-not-read", "--task", "translation", *argv])
    task = convert_namespace_to_omegaconf(ns).task
    return gradinit_config_from_task(task), gradinit_batch_tokens(task)


def test_the_authors_arms_run_the_recipe_as_listed():
    from lab.study.arms import merge_args
    from lab.study.presets import D512_BASE, GI_AUTHORS, SHOCK

    authors = recipe("authors-iwslt14")
    config, tokens = _resolved(list(D512_BASE) + list(GI_AUTHORS))
    # the recorded runs: the recipe with every use of the tied output projection stepped (and the plugin's
    # log interval, which does not change the scales)
    assert config == authors.config(unstepped_uses=None, log_interval=20)
    assert tokens == authors.settings["max_tokens"]
    arm = next(a for a in SHOCK.arms if a.name == "gi-unstepped")
    gradinit = [t for g in _groups(arm.args) if g[0].startswith("--gradinit-") for t in g]
    config, tokens = _resolved(merge_args(D512_BASE, gradinit))
    assert config == authors.config(log_interval=20) and tokens == authors.settings["max_tokens"]


def _groups(argv):
    from lab.study.arms import option_groups

    return option_groups(argv)


@pytest.mark.parametrize("train_lr", [5e-4, 1e-3, 3e-3])
def test_the_presets_paper_gamma_is_the_plugins_rule(train_lr):
    from lab.study.presets import paper_defaults

    args = dict(zip(paper_defaults(train_lr)[::2], paper_defaults(train_lr)[1::2]))
    assert float(args["--gradinit-gamma"]) == first_step("adam", train_lr, rule="fairseq").gamma
    assert float(args["--gradinit-gamma"]) == pytest.approx(1 / (2 * train_lr))
    assert float(args["--gradinit-lr"]) == recipe("authors-iwslt14").values["lr"] == 2.5e-3
