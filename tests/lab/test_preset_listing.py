"""--list-presets: a few lines per preset (what it answers, how long it takes, where it is documented),
the full description with a name, and arm notes that state the settings the plugin resolves."""
import re
from pathlib import Path

import pytest

from lab.study.presets import PRESETS, call_estimate, how_long, list_presets

REPO = Path(__file__).resolve().parents[2]


def test_the_listing_says_in_a_few_lines_what_each_preset_answers_and_how_long_it_takes():
    text = list_presets()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    starts = [i for i, line in enumerate(lines) if re.match(r"^[a-z]+: ", line)]
    assert [lines[i].split(":")[0] for i in starts] == list(PRESETS)
    for i, end in zip(starts, starts[1:] + [len(lines)]):
        block = "\n".join(lines[i:end])
        assert end - i <= 8 and "    takes: " in block and "    docs: " in block, block
    for p in PRESETS.values():
        assert p.answers and (REPO / p.docs).is_file(), p.name
        for c in p.calls:
            est = call_estimate(p, c)
            if est is not None:
                assert f"{c.name} ~{est.total_s:.0f} s" in how_long(p)
    flat = " ".join(text.split())
    assert "calls A ~425 s, B ~390 s, C ~330 s, E ~380 s on one H200 by the estimate (each within 480 s)" in flat
    assert "most of a day" in how_long(PRESETS["demo"]) and "12 minutes" in how_long(PRESETS["lm"])


def _main(argv):
    pytest.importorskip("fairseq")
    from fairseq_helpers import study_main

    return study_main(argv)


def test_list_presets_with_a_name_describes_that_preset_in_full():
    rc, out, _ = _main(["--list-presets"])
    assert rc == 0 and out.strip() == list_presets().strip()
    rc, out, _ = _main(["--list-presets", "shock"])
    assert rc == 0 and out.startswith("== shock:") and "   arm ctl@separate=" in out and "== hold" not in out
    assert "call D: trains the seed-2 twins" in out
    rc, _, err = _main(["--list-presets", "nosuch"])
    assert rc == 2 and "unknown preset 'nosuch'" in err


@pytest.fixture(scope="module")
def tiny_bin(tmp_path_factory):
    pytest.importorskip("fairseq")
    from fairseq_helpers import make_tiny_bin

    return make_tiny_bin(tmp_path_factory.mktemp("listdata"), {"train": 40, "valid": 8, "test": 8}, 100)


def _resolved(tiny_bin, base, args):
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_gradinit.fairseq_plugin.settings.option_values import gradinit_config_from_task
    from lab.study.arms import merge_args
    from lab.study.plan import _parse_fairseq_args

    ns = _parse_fairseq_args([str(tiny_bin), "--task", "translation_gradinit"] + merge_args(base, args), arm="x")
    return gradinit_config_from_task(convert_namespace_to_omegaconf(ns).task)


def test_the_demo_and_lm_notes_state_the_eta_and_gamma_the_plugin_resolves(tiny_bin):
    from lab.study.presets import D128_BASE, GI_LM, LM_BASE

    demo = next(a for a in PRESETS["demo"].arms if a.name == "gradinit-s1")
    cfg = _resolved(tiny_bin, PRESETS["demo"].base, demo.args)
    assert (cfg.optimizer, cfg.eta, cfg.gamma) == ("adam", pytest.approx(2e-3), pytest.approx(500))
    assert "eta = 2 x lr = 2e-3, gamma = 1/eta = 500" in demo.note
    # the lm arm resolves as a translation arm with the lm base's optimizer and lr would
    lm = next(a for a in PRESETS["lm"].arms if a.name == "gradinit")
    lr = LM_BASE[LM_BASE.index("--lr") + 1]
    cfg = _resolved(tiny_bin, D128_BASE, ("--lr", lr) + GI_LM)
    assert cfg.eta == pytest.approx(6e-3) and cfg.gamma == pytest.approx(1 / 6e-3)
    assert "eta = 2 x lr = 6e-3, gamma = 1/eta" in lm.note
    flat = lambda name: " ".join((REPO / "lab" / "record" / name).read_text(encoding="utf-8").split())  # noqa: E731
    assert "now, for Adam, η = 2 × lr = 2e-3 and γ = 1/η = 500" in flat("debian-demo.md")
    assert f"η = 2 × lr = 6e-3 and γ = 1/η ≈ {1 / 6e-3:.0f}" in flat("lm-nowarmup.md")
