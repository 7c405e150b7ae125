"""The presets' data files (lab/study/preset_data/) and their schema (lab/study/preset_schema.py): every file
loads, a broken file is a ValueError that names the file, the preset and the problem, values the library
declares stay derived from it, and the loaded presets are what independently spelled expectations say."""
from dataclasses import replace

import pytest

from lab.study import preset_schema
from lab.study.arms import option_value
from lab.study.preset_schema import DATA_DIR, load_presets
from lab.study.presets import GROUPS, PRESETS


def test_every_data_file_loads_and_is_a_listed_preset():
    library = load_presets()
    files = sorted(p.stem for p in DATA_DIR.glob("*.toml"))
    assert files == sorted([*PRESETS, "common"])
    assert list(library.presets) == list(PRESETS) == ["evidence", "screen", "demo", "ablate", "confirm", "wskip",
                                                      "hold", "shock", "testbed", "lm", "converge"]
    for name, preset in library.presets.items():
        assert preset.name == name and preset.arms and preset.base, name


def test_the_loaded_presets_are_what_independent_spellings_say():
    testbed = PRESETS["testbed"]
    arms = {a.name: a for a in testbed.arms}
    assert arms["warmup"].args == ("--warmup-updates", "200")
    assert arms["gi"].args == ("--gradinit-iters", "780", "--gradinit-gamma", "500.0", "--gradinit-lr", "2.5e-3",
                               "--gradinit-lookahead-steps", "1")
    assert arms["gi-ceiling-s2"].args == ("--gradinit-iters", "200", "--seed", "2", "--gradinit-source-contrast", "10",
                                          "--gradinit-loss-ceiling", "0.35")
    assert testbed.base[-3:] == ("--gradinit-monitor-interval", "100", "--gradinit-valid-dropout-loss")
    assert option_value(testbed.base, "--max-tokens") == "2048" and option_value(testbed.base, "--lr") == "1e-3"
    assert testbed.base.count("--max-tokens") == 1 and testbed.base.count("--seed") == 1

    g98shared = next(a for a in PRESETS["evidence"].arms if a.name == "g98shared")
    assert g98shared.args == ("--gradinit-iters", "780", "--gradinit-eta", "5e-4", "--gradinit-gamma", "1e3",
                              "--gradinit-lr", "2.5e-3", "--gradinit-max-tokens", "4096", "--gradinit-step-params",
                              "scaled", "--gradinit-lookahead-steps", "1", "--gradinit-adam-state", "shared")
    sgd = next(a for a in PRESETS["confirm"].arms if a.name == "gisgd-s1")
    assert sgd.drop == ("--share-all-embeddings", "--adam-betas") and sgd.data == "separate"

    converge = PRESETS["converge"]
    assert converge.max_update == converge.save_every == 4500 and "over 4500 updates" in converge.summary
    assert option_value(converge.base, "--total-num-update") == "4500"
    assert option_value(converge.base, "--lr-scheduler") == "polynomial_decay"
    names = [a.name for a in converge.arms]
    assert names[:4] == ["warmup", "warmup-s2", "warmup600", "warmup600-s2"]
    assert names[1::2] == [f"{name}-s2" for name in names[::2]]  # each arm followed by its seed-2 twin
    standard2 = next(a for a in converge.arms if a.name == "standard-s2")
    assert standard2.drop == ("--total-num-update", "--end-learning-rate", "--power")
    assert standard2.args[-2:] == ("--seed", "2") and standard2.note == "standard at seed 2"

    calls = {c.name: c for c in PRESETS["shock"].calls}
    assert (calls["A"].time_budget, calls["A"].bleu_budget, calls["A"].limit_s) == (7.5, 0.25, 480.0)
    assert (calls["B"].parallel, calls["B"].time_budget, calls["B"].finish_margin) == (4, 7.0, 20.0)
    assert calls["D"].repeat_seed == 2 and calls["D"].arms == ()
    assert PRESETS["shock"].recompute == {"authors": GROUPS["GI_AUTHORS"]}
    assert PRESETS["hold"].files == {"authors": "lab/record/evidence/nowarmup-d512-authors-2026-11-26/"
                                                "authors.gradinit.json"}


def test_values_the_library_declares_stay_derived_from_it(monkeypatch):
    authors = preset_schema.recipe("authors-iwslt14")
    changed = replace(authors, values={**authors.values, "eta": 7e-4})
    monkeypatch.setattr(preset_schema, "recipe", lambda name: changed if name == "authors-iwslt14" else None)
    library = load_presets()
    assert option_value(library.groups["GI_AUTHORS"], "--gradinit-eta") == "7e-4"
    assert option_value(PRESETS["ablate"].arms[1].args, "--gradinit-eta") == "1e-3"  # the module's, unpatched
    # gamma of the paper's defaults: the plugin's rule, whatever it says
    monkeypatch.setattr(preset_schema, "first_step", lambda *a, **k: type("S", (), {"gamma": 123.0})())
    gi = next(a for a in load_presets().presets["testbed"].arms if a.name == "gi")
    assert option_value(gi.args, "--gradinit-gamma") == "123.0"


COMMON = '''presets = ["tiny"]
[groups]
BASE = ["--arch", "transformer", "--lr", "1e-3"]
'''
TINY = '''summary = "a tiny preset"
max_update = 10
base = ["@BASE"]

[[arms]]
name = "a"
args = ["--seed", "2"]

[[arms]]
name = "b"
args = [{from = "@BASE", replace = ["--lr", "2e-3"]}]

[[calls]]
name = "A"
arms = ["a", "b"]
'''


def _load(tmp_path, tiny=TINY, common=COMMON):
    (tmp_path / "common.toml").write_text(common, encoding="utf-8")
    (tmp_path / "tiny.toml").write_text(tiny, encoding="utf-8")
    return load_presets(tmp_path)


def test_a_small_folder_loads_with_merges(tmp_path):
    preset = _load(tmp_path).presets["tiny"]
    assert [a.args for a in preset.arms] == [("--seed", "2"), ("--arch", "transformer", "--lr", "2e-3")]
    assert preset.calls[0].arms == ("a", "b") and preset.valid_every == 100


@pytest.mark.parametrize("tiny, common, expected", [
    (TINY.replace('args = ["--seed", "2"]', 'args = ["@NOPE"]'), COMMON,
     ["tiny.toml", "preset tiny", "arm a", "'@NOPE' names no group", "define it under [groups]"]),
    (TINY.replace('name = "b"', 'name = "a"'), COMMON,
     ["tiny.toml", "preset tiny", "arm a", "given twice", "rename one"]),
    (TINY.replace('args = ["--seed", "2"]', 'args = ["--seed", "2"]\nnotes = "x"'), COMMON,
     ["tiny.toml", "preset tiny", "arm a", "unknown key 'notes'", "did you mean 'note'?"]),
    (TINY.replace('max_update = 10', 'max_update = 10\nmax_updates = 20'), COMMON,
     ["tiny.toml", "preset tiny", "unknown key 'max_updates'", "did you mean 'max_update'?"]),
    (TINY.replace('arms = ["a", "b"]', 'arms = ["a", "c"]'), COMMON,
     ["tiny.toml", "preset tiny", "call A: arms", "no arm 'c'", "add the arm"]),
    (TINY.replace('["--seed", "2"]', '["@recipes(authors-iwslt14, eta)"]'), COMMON,
     ["tiny.toml", "preset tiny", "arm a", "no generator 'recipes'", "@recipe(RECIPE, FIELD"]),
    (TINY.replace('["--seed", "2"]', '["@recipe(authors-iwslt14, nosuch)"]'), COMMON,
     ["tiny.toml", "preset tiny", "arm a", "has no value 'nosuch'", "usage: @recipe"]),
    (TINY + '[groups]\nBASE = ["--lr", "1"]\n', COMMON, ["tiny.toml", "group BASE", "defined again", "common.toml"]),
    (TINY, COMMON + 'LOOP = ["@LOOP"]\n', ["common.toml", "group LOOP", "uses itself"]),
    (TINY, COMMON.replace('["tiny"]', '[]'), ["tiny.toml", "not listed in common.toml", "add its name"]),
    (TINY.replace('max_update = 10', 'max_update = "10"'), COMMON, ["tiny.toml", "max_update", "an integer"]),
    (TINY.replace("[[calls]]", "[[calls]"), COMMON, ["tiny.toml", "not valid TOML"]),
    (TINY.replace('max_update = 10', 'max_update = 10\nthroughput = "h300"'), COMMON,
     ["tiny.toml", "throughput", "no figures named 'h300'"]),
])
def test_a_broken_file_names_the_file_the_preset_and_the_problem(tmp_path, tiny, common, expected):
    with pytest.raises(ValueError) as e:
        _load(tmp_path, tiny, common)
    message = str(e.value)
    assert str(tmp_path) in message
    for part in expected:
        assert part in message, (part, message)
