"""The licence and the citation file agree with the package's own metadata."""
import ast
from pathlib import Path

import yaml

from fairseq_gradinit.version import __version__

ROOT = Path(__file__).resolve().parent.parent


def _setup_keyword(name):
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup":
            for kw in node.keywords:
                if kw.arg == name:
                    return ast.literal_eval(kw.value)
    raise AssertionError(f"setup() has no {name}=")


def test_licence_is_mit_and_declared_in_setup():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License")
    assert "WITHOUT WARRANTY OF ANY KIND" in text
    assert _setup_keyword("license") == "MIT"


def test_citation_file_names_the_paper_and_this_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0"
    assert cff["version"] == __version__ == _setup_keyword("version")
    assert cff["license"] == "MIT"
    paper = cff["preferred-citation"]
    assert paper["title"].startswith("GradInit: Learning to Initialize Neural Networks")
    assert paper["year"] == 2021
    assert [a["family-names"] for a in paper["authors"]] == ["Zhu", "Ni", "Xu", "Kong", "Huang", "Goldstein"]


def test_readme_bibtex_is_the_citation_file():
    import re

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))["preferred-citation"]
    bib = re.search(r"```bibtex\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S).group(1)
    fields = dict(re.findall(r"^\s*(\w+)\s*=\s*\{(.*)\},?$", bib, flags=re.M))
    assert fields["title"] == cff["title"]
    assert fields["year"] == str(cff["year"]) and fields["volume"] == str(cff["volume"])
    assert [a.split(",")[0].strip() for a in fields["author"].split(" and ")] == \
        [a["family-names"] for a in cff["authors"]]
