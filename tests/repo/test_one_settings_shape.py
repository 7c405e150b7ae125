"""Settings are read from one shape: the run's plan. Besides the plan's own builder (which reads every field
once), only the modules that translate fairseq's config into the plan's values, check it when it is parsed, mirror fairseq's own checkpoint logic from it, or fingerprint
fairseq's own model and task config read a config themselves (``cfg_value``, tolerant of a Namespace, a
DictConfig or a dataclass); every other module of the package reads the plan. Read from the source."""
import ast
from pathlib import Path

import fairseq_gradinit

PACKAGE = Path(fairseq_gradinit.__file__).parent
#: The modules that may call cfg_value, relative to the package, and why.
READS_FAIRSEQ_CONFIG = {
    "fairseq_plugin/data/cfg.py": "defines it",
    "fairseq_plugin/settings/option_values.py": "translates the config into the plan's values",
    "fairseq_plugin/settings/validation.py": "checks a parsed namespace and the settings as they come",
    "fairseq_plugin/settings/restore.py": "mirrors fairseq's checkpoint logic",
    "fairseq_plugin/phase/provenance.py": "fingerprints fairseq's own model and task config",
}


def calls_to(name, tree):
    """Line numbers of the calls of ``name`` (as a bare name or an attribute) in ``tree``."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]


def test_only_the_modules_that_read_fairseq_s_config_call_cfg_value():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = calls_to("cfg_value", ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            found[path.relative_to(PACKAGE).as_posix()] = lines
    outside = {k: v for k, v in found.items() if k not in READS_FAIRSEQ_CONFIG}
    assert not outside, f"read the run's plan instead of the config (module: lines): {outside}"
    assert set(found) <= set(READS_FAIRSEQ_CONFIG)
    # Each allowed module still reads a config: an entry nothing needs is removed from the list.
    assert set(READS_FAIRSEQ_CONFIG) - {"fairseq_plugin/data/cfg.py"} <= set(found), set(found)


def test_the_check_finds_a_call_by_name_and_as_an_attribute():
    tree = ast.parse("from x import cfg_value\nimport y\n\ncfg_value(c, 'a')\ny.cfg_value(c, 'b')\nother(c)\n")
    assert calls_to("cfg_value", tree) == [4, 5]
