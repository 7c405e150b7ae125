"""One declaration of the GradInit options (GradInitConfig's fields) and what the front ends derive from
it: fairseq fields and their defaults, the vision API's keywords, train_vision's flags, the fingerprint's
option set and the generated tables."""
import argparse
import dataclasses
import inspect
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fairseq_gradinit.core import GradInitConfig
from fairseq_gradinit.core.config import option
from fairseq_gradinit.core.options import Default, options_of, result_options, values_from
from fairseq_gradinit.command_line.option_forms import add_arguments

REPO = Path(__file__).resolve().parents[2]
DECLARED = [s for s in options_of(GradInitConfig) if not s.python_only]


def test_declaration_reads_every_field():
    names = [f.name for f in dataclasses.fields(GradInitConfig)]
    assert [s.name for s in options_of(GradInitConfig)] == names
    kinds = {s.name: s.kind for s in options_of(GradInitConfig)}
    assert kinds["optimizer"] == "choice" and kinds["betas"] == "pair" and kinds["scale_bounds"] == "bounds"
    assert kinds["reuse_graph"] == "bool" and kinds["iters"] == "int" and kinds["param_filter"] == "python"
    # what does not change the scales is left out of fingerprints
    assert {"log_interval", "reuse_graph", "max_consecutive_skips"}.isdisjoint(result_options())
    assert {"eta", "gamma", "lr", "scale_bounds", "adam_state"} <= set(result_options())
    with pytest.raises(ValueError, match="unknown options"):
        options_of(GradInitConfig, defaults={"etta": Default(1.0)})


def test_vision_keywords_and_train_vision_flags_follow_the_declaration():
    from fairseq_gradinit.vision import gradinit
    from fairseq_gradinit.vision.api import GRADINIT_OPTIONS

    params = inspect.signature(gradinit).parameters
    own = ["model", "loader", "config", "loss_fn", "device", "progress", "process_group", "callback"]
    # the static signature: exactly the config's fields as keyword-only options, with the vision defaults
    assert [n for n in params if n not in own] == [s.name for s in options_of(GradInitConfig)] == list(GRADINIT_OPTIONS)
    options_doc = " ".join(gradinit.__doc__.split("Options (")[1].split("Returns:")[0].split())
    for spec in options_of(GradInitConfig):
        assert params[spec.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[spec.name].default == GRADINIT_OPTIONS[spec.name].default, spec.name
        assert f" {spec.name}," in options_doc or f" {spec.name}:" in options_doc, spec.name
    with pytest.raises(TypeError, match="etta"):
        gradinit(None, [], etta=1.0)
    help_text = subprocess.run([sys.executable, str(REPO / "scripts" / "train_vision.py"), "--help"],
                               capture_output=True, text=True).stdout
    for spec in DECLARED:
        assert spec.flag() in help_text, spec.flag()


def test_an_added_option_reaches_every_front_end():
    """The docs' worked example: a field declared with option() is a flag, parses and is compared."""
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    from fairseq_gradinit.fairseq_plugin.settings.options import FAIRSEQ_DEFAULTS, options_dataclass

    @dataclass
    class WithWarmup(GradInitConfig):
        scale_warmup: int = option(0, help="iterations at the start whose scale updates are skipped")

    specs = options_of(WithWarmup, defaults=FAIRSEQ_DEFAULTS, python_only=False)
    fields = options_dataclass(specs, name="WithWarmupOptions")
    parser = argparse.ArgumentParser()
    gen_parser_from_dataclass(parser, fields())
    ns, _ = parser.parse_known_args(["--gradinit-scale-warmup", "5", "--gradinit-adam-state", "shared"])
    values = values_from(ns, specs, prefix="gradinit_")
    assert values["scale_warmup"] == 5 and values["adam_state"] == "shared"
    assert "scale_warmup" in result_options(WithWarmup)
    cli = argparse.ArgumentParser()
    add_arguments(cli, options_of(WithWarmup, python_only=False))
    assert cli.parse_args(["--gradinit-scale-warmup", "3"]).gradinit_scale_warmup == 3
    with pytest.raises(SystemExit):
        cli.parse_args(["--gradinit-scale-warmup", "x"])


def test_command_line_parsing_of_each_kind():
    specs = {s.name: s for s in options_of(GradInitConfig)}
    assert specs["betas"].parse("(0.9, 0.999)") == (0.9, 0.999)
    assert specs["reuse_graph"].parse("false") is False
    assert specs["gamma"].parse("None") is None and specs["gamma"].parse("1e3") == 1000.0
    assert [b.to_list() for b in specs["scale_bounds"].parse("[('bias', 0, None)]")] == [["bias", 0, None]]
    for name, bad in [("betas", "0.9"), ("optimizer", "adamw"), ("reuse_graph", "maybe"), ("scale_bounds", "x")]:
        with pytest.raises(ValueError, match="--gradinit-" + name.replace("_", "-")):
            values_from(argparse.Namespace(**{"gradinit_" + name: bad}), [specs[name]], prefix="gradinit_")


def test_generated_tables_are_current():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "options_table.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_python_api_page_states_each_front_ends_default_gamma():
    """docs/python-api.md's numbers are the engine's and the plugin's gamma rules."""
    from pathlib import Path

    from fairseq_gradinit.core.config import LOSS_CHANGE_BOUNDS, GradInitConfig, default_gamma

    page = (Path(__file__).resolve().parents[2] / "docs" / "python-api.md").read_text(encoding="utf-8")
    page = page.replace("\n", " ")
    assert GradInitConfig(optimizer="adam", eta=1e-3).resolved_gamma == pytest.approx(100)
    assert GradInitConfig(optimizer="sgd", eta=0.1).resolved_gamma == pytest.approx(1)
    assert default_gamma("adam", 1e-3, LOSS_CHANGE_BOUNDS["fairseq"]["adam"]) == pytest.approx(1e3)
    assert default_gamma("sgd", 0.15, LOSS_CHANGE_BOUNDS["fairseq"]["sgd"]) == pytest.approx(1)
    assert "γ = 100 at η = 1e-3 with Adam, γ = 1 at η = 0.1 with SGD" in page
    assert "γ = 1/η for Adam (1e3 at η = 1e-3), and the paper's γ = 1 at η = 0.15 for SGD" in page


def test_research_settings_are_listed_apart_in_the_tables():
    """The settings that test an explanation or a remedy are marked once, where they are declared, and
    every generated table lists them after the others; their defaults run GradInit as the paper does."""
    from fairseq_gradinit.command_line.option_forms import EXPERIMENTAL_NOTE, markdown_table

    specs = options_of(GradInitConfig)
    research = {s.name for s in specs if s.experimental}
    assert research == {"gamma_init_factor", "pairs", "max_step_ratio", "lookahead_steps", "lookahead_betas",
                        "loss_ceiling", "dropout"}
    config = GradInitConfig()
    assert (config.gamma_init_factor, config.pairs, config.max_step_ratio, config.dropout) == (
        None, "overlap", None, False)
    table = markdown_table(specs, keyword=True)
    stable, note, rest = table.partition(EXPERIMENTAL_NOTE)
    assert note
    for spec in specs:
        assert (f"- `{spec.name}` (default: " in rest) == (spec.name in research)
        assert (f"- `{spec.name}` (default: " in stable) == (spec.name not in research)
    assert EXPERIMENTAL_NOTE not in markdown_table([s for s in specs if not s.experimental])


def test_plugin_research_settings_are_marked_where_declared():
    pytest.importorskip("fairseq")
    from fairseq_gradinit.command_line.option_forms import EXPERIMENTAL_NOTE
    from fairseq_gradinit.fairseq_plugin.settings.options import PLUGIN_OPTIONS, option_table

    assert {s.name for s in PLUGIN_OPTIONS if s.experimental} == {"init_clamp", "source_contrast", "source_margin"}
    before, _, after = option_table().partition(EXPERIMENTAL_NOTE)
    assert "`--gradinit-init-clamp`" in after and "`--gradinit-pairs {" in after
    # the engine's research settings that the plugin turns on by default are among its main options
    for flag in ("`--gradinit-gamma-init-factor`", "`--gradinit-lookahead-steps`"):
        assert flag in before and flag not in after, flag
    assert "`--gradinit-eta`" not in after
