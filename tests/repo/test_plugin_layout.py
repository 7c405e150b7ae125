"""The fairseq plugin's layout, read from the source: the GradInit adapter (the modules directly in
``fairseq_plugin/``) uses none of the models and optimizers the plugin registers with fairseq
(``fairseq_plugin/models/``, ``fairseq_plugin/optim/``); those use of the adapter only the public
registration of argument checks and two fairseq helpers it shares (fairseq-train's batching, an atomic
write). The analysis (``fairseq_plugin/analysis/``) has two levels: its name grouping and health check
lie below the adapter (they import nothing of it, and the adapter uses them), its per-layer report above
(it may use the adapter's public pieces; the adapter never imports it), so no arrow points back up.
Importing the plugin still registers every model, architecture and optimizer."""
import pytest

from test_import_graph import PACKAGE, imports_of, our_modules

PLUGIN = f"{PACKAGE}.fairseq_plugin"
REGISTERED = (f"{PLUGIN}.models", f"{PLUGIN}.optim")
ANALYSIS = f"{PLUGIN}.analysis"
#: What the registered models and optimizers may take from the adapter: module -> names.
ADAPTER_USES = {
    f"{PLUGIN}.validation": {"check_every_parse"},
    f"{PLUGIN}.training": {"training_dataset", "training_iterator"},
    f"{PLUGIN}.files": {"atomic_write_json"},
}


def inside(name, package):
    return name == package or name.startswith(package + ".")


def is_adapter(name, modules):
    """A module directly in ``fairseq_plugin/`` (not one of its subpackages)."""
    return name.rpartition(".")[0] == PLUGIN and modules[name].name != "__init__.py"


def adapter_modules(modules):
    return [m for m in modules if is_adapter(m, modules)]


def imports(modules, name):
    return list(imports_of(modules[name], name, modules))


def test_the_layout_has_the_three_rooms():
    modules = our_modules()
    for name in ("models.wskip", "models.postln_lm", "optim.radam", "analysis.report", "analysis.groups",
                 "analysis.health_report", "hook", "plan", "option_values"):
        assert f"{PLUGIN}.{name}" in modules, name
    assert not any(m in modules for m in (f"{PLUGIN}.wskip", f"{PLUGIN}.radam", f"{PLUGIN}.report"))


def test_the_adapter_imports_no_model_or_optimizer():
    modules = our_modules()
    adapter = adapter_modules(modules)
    assert f"{PLUGIN}.hook" in adapter and f"{PLUGIN}.phase" in adapter
    found = [f"{m} imports {t}" for m in adapter for t, _ in imports(modules, m)
             if any(inside(t, p) for p in REGISTERED)]
    assert not found, found


def test_models_and_optimizers_use_only_the_public_check_registration_of_the_adapter():
    modules = our_modules()
    found = []
    registered = [m for m in modules if any(inside(m, p) for p in REGISTERED)]
    assert len(registered) == 5, registered  # the two packages, wskip, postln_lm, radam
    for m in registered:
        for target, names in imports(modules, m):
            if inside(target, ANALYSIS):
                found.append(f"{m} imports {target}")
            elif target == PLUGIN:
                found.append(f"{m} imports the plugin package")
            elif is_adapter(target, modules) and not set(names) <= ADAPTER_USES.get(target, set()):
                found.append(f"{m} imports {sorted(names)} from {target}")
    assert not found, found
    wskip = {t: set(n) for t, n in imports(modules, f"{PLUGIN}.models.wskip")}
    assert wskip[f"{PLUGIN}.validation"] == {"check_every_parse"}


def test_the_adapter_uses_the_analysis_only_for_groups_and_the_health_check():
    modules = our_modules()
    used = {t for m in adapter_modules(modules) for t, _ in imports(modules, m) if inside(t, ANALYSIS)}
    assert used == {f"{ANALYSIS}.groups", f"{ANALYSIS}.health_report"}


def test_the_analysis_below_the_adapter_imports_none_of_it_and_the_report_above_it_uses_public_names():
    modules = our_modules()
    below = (f"{ANALYSIS}.groups", f"{ANALYSIS}.health_report")
    up = [f"{m} imports {t}" for m in below for t, _ in imports(modules, m) if is_adapter(t, modules) or t == PLUGIN]
    assert not up, up
    report = imports(modules, f"{ANALYSIS}.report")
    used = {t for t, _ in report if is_adapter(t, modules)}
    assert used and not any(n.startswith("_") for t, names in report for n in names)
    assert not any(m == f"{ANALYSIS}.report" for a in adapter_modules(modules) for m, _ in imports(modules, a))


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
