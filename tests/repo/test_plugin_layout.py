"""The fairseq plugin's layout, read from the source: the adapter lives in rooms by concern, and every import
between them runs down the order analysis > registration > models, optim > phase > settings > features >
data > errors (never back up, never between the two registered packages). The registered models and
optimizers take from the adapter only the public check registration and two fairseq helpers; the per-layer
report uses only public names and nothing imports it. Importing the plugin still registers every model,
architecture and optimizer. ``pyproject.toml``'s import contracts state the same order for import-linter;
this test reads it from the source on its own."""
import pytest

from test_import_graph import PACKAGE, imports_of, our_modules

PLUGIN = f"{PACKAGE}.fairseq_plugin"
#: Top to bottom; rooms on one level may not import each other.
ORDER = [("analysis",), ("registration",), ("models", "optim"), ("phase",), ("settings",), ("features",),
         ("data",), ("errors",)]
LEVEL = {room: i for i, rooms in enumerate(ORDER) for room in rooms}
#: What the registered models and optimizers may take from the adapter: module -> names.
ADAPTER_USES = {
    f"{PLUGIN}.settings.validation": {"check_every_parse"},
    f"{PLUGIN}.data.training": {"training_dataset", "training_iterator"},
    f"{PLUGIN}.data.files": {"atomic_write_json"},
}


def room(name):
    """The room of a plugin module (None for the plugin package itself)."""
    rest = name[len(PLUGIN) + 1:] if name.startswith(PLUGIN + ".") else ""
    return rest.split(".")[0] or None


def plugin_imports(modules):
    """(module, imported module, names) for each import between two of the plugin's modules."""
    for name, path in modules.items():
        if name.startswith(PLUGIN + "."):
            for target, names in imports_of(path, name, modules):
                if target.startswith(PLUGIN) and target != name:
                    yield name, target, names


def test_every_module_of_the_plugin_is_in_a_room():
    modules = our_modules()
    loose = [m for m in modules if m.startswith(PLUGIN + ".") and room(m) not in LEVEL]
    assert not loose, loose
    for name in ("registration.task", "registration.hook", "settings.plan", "settings.validation", "phase.compute",
                 "phase.run", "features.tied", "features.monitor", "data.training", "analysis.per_layer",
                 "models.wskip", "optim.radam", "errors"):
        assert f"{PLUGIN}.{name}" in modules, name


def imports_back_up(edges):
    """The imports of ``edges`` ((module, imported module, names)) that do not run down the order."""
    return [f"{m} imports {t}" for m, t, _ in edges
            if room(t) is None or (room(m) != room(t) and LEVEL[room(m)] >= LEVEL[room(t)])]


def test_imports_between_rooms_run_down_only():
    up = imports_back_up(plugin_imports(our_modules()))
    assert not up, up


def test_the_rule_catches_imports_back_up_and_across_a_level():
    edges = [(f"{PLUGIN}.settings.plan", f"{PLUGIN}.phase.run", []),  # up
             (f"{PLUGIN}.models.wskip", f"{PLUGIN}.optim.radam", []),  # across one level
             (f"{PLUGIN}.data.cfg", PLUGIN, []),  # the package itself
             (f"{PLUGIN}.phase.run", f"{PLUGIN}.settings.plan", []),  # down: fine
             (f"{PLUGIN}.phase.run", f"{PLUGIN}.phase.state", [])]  # within a room: fine
    assert len(imports_back_up(edges)) == 3


def test_models_and_optimizers_use_only_the_public_check_registration_and_two_helpers():
    modules = our_modules()
    found = [f"{m} imports {sorted(names)} from {t}" for m, t, names in plugin_imports(modules)
             if room(m) in ("models", "optim") and room(t) not in ("models", "optim")
             and not set(names) <= ADAPTER_USES.get(t, set())]
    assert not found, found
    wskip = {t: set(n) for t, n in imports_of(modules[f"{PLUGIN}.models.wskip"], f"{PLUGIN}.models.wskip", modules)}
    assert wskip[f"{PLUGIN}.settings.validation"] == {"check_every_parse"}


def test_the_report_uses_public_names_and_nothing_imports_it():
    modules = our_modules()
    report = f"{PLUGIN}.analysis.per_layer"
    used = [(t, names) for m, t, names in plugin_imports(modules) if m == report]
    assert used and not any(n.startswith("_") for _, names in used for n in names)
    assert not [m for m, t, _ in plugin_imports(modules) if t == report]


def test_importing_the_plugin_registers_its_models_architectures_and_optimizer():
    pytest.importorskip("fairseq")
    import fairseq_gradinit.fairseq_plugin  # noqa: F401
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.optim import OPTIMIZER_REGISTRY
    from fairseq.tasks import TASK_REGISTRY

    assert "transformer_wskip" in MODEL_REGISTRY
    for arch in ("transformer_wskip", "transformer_wskip_iwslt_de_en", "transformer_wskip_wmt_en_de",
                 "transformer_wskip_wmt_en_de_big", "transformer_lm_postln"):
        assert arch in ARCH_MODEL_REGISTRY, arch
    assert ARCH_MODEL_REGISTRY["transformer_lm_postln"] is MODEL_REGISTRY["transformer_lm"]
    assert OPTIMIZER_REGISTRY["radam"].__name__ == "FairseqRAdam"
    assert "translation_gradinit" in TASK_REGISTRY


def test_the_install_page_names_the_rooms_in_their_order_and_the_test_areas():
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    page = (repo / "docs" / "install.md").read_text(encoding="utf-8")
    section = " ".join(page.split("## Where the code lives", 1)[1].split())
    rooms = section.split("rooms that import only the rooms below them:", 1)[1].split("- `fairseq_gradinit/vision/`")[0]
    named = [tuple(re.findall(r"`(\w+)`", level.split("(")[0])) for level in rooms.split(" > ")]
    assert named == ORDER
    areas = section.split("`tests/`: by area,", 1)[1]
    folders = {p.name for p in (repo / "tests").iterdir() if p.is_dir() and p.name not in ("data", "__pycache__")}
    assert set(re.findall(r"`(\w+)`", areas)) == folders
