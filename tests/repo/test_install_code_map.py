"""``docs/install.md``'s "Where the code lives" is current: every file or folder it names exists, and it
names every package of the library and the lab (the plugin's rooms by their names)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGIN = "fairseq_gradinit/fairseq_plugin"


def _section() -> str:
    page = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    return page.split("## Where the code lives", 1)[1].split("\n## ", 1)[0]


def _paths(section: str):
    """The repository path of each backquoted file or folder (``core/engine.py`` is under fairseq_gradinit/)."""
    for token in re.findall(r"`([\w./-]+)`", section):
        if "/" not in token and not token.endswith(".py"):
            continue
        top = token.split("/", 1)[0]
        yield token, (REPO / token) if (REPO / top).is_dir() else (REPO / "fairseq_gradinit" / token)


def test_every_path_the_code_map_names_exists():
    found = list(_paths(_section()))
    assert len(found) >= 8, found
    missing = [token for token, path in found if not path.exists()]
    assert missing == []
    assert all(path.is_dir() == token.endswith("/") for token, path in found), found


def test_the_code_map_names_every_package():
    section = _section()
    named = {path.resolve() for _, path in _paths(section)}
    words = set(re.findall(r"`(\w+)`", section))
    packages = sorted(p.parent for root in ("fairseq_gradinit", "lab") for p in (REPO / root).rglob("__init__.py"))
    unnamed = [p.relative_to(REPO).as_posix() for p in packages
               if p.resolve() not in named and p != REPO / "fairseq_gradinit"
               and not (p.parent == REPO / PLUGIN and p.name in words)]
    assert len(packages) >= 15 and unnamed == []
