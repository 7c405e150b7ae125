"""The import graph of the library (``fairseq_gradinit``) and the research lab (``lab``), read from the source,
nothing imported: no cycle between our modules, no private (``_name``) name imported from one of our modules
into another, and no arrow from the library to the lab. Imports inside functions count too: a lazy import does
not make a cycle acceptable."""
import ast
import re
import sys
from pathlib import Path

PACKAGE = "fairseq_gradinit"
LAB = "lab"
REPO = Path(__file__).resolve().parents[2]
ROOTS = (REPO / PACKAGE, REPO / LAB)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: Path, name: str) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def our_modules():
    return {module_name(p): p for root in ROOTS for p in sorted(root.rglob("*.py"))}


def imports_of(path: Path, name: str, modules):
    """(imported module, names imported from it) for each import of one of our modules."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in modules:
                    yield a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_of(path, name).split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source not in modules:
                continue
            names = [a.name for a in node.names]
            # "from pkg import submodule" imports the submodule, not a name of pkg
            subs = [f"{source}.{n}" for n in names if f"{source}.{n}" in modules]
            yield source, [n for n in names if f"{source}.{n}" not in modules]
            for s in subs:
                yield s, []


def import_graph():
    modules = our_modules()
    edges, private = {}, []
    for name, path in modules.items():
        edges[name] = set()
        for target, names in imports_of(path, name, modules):
            if target != name:
                edges[name].add(target)
            private += [f"{name} imports {n} from {target}" for n in names
                        if n.startswith("_") and not n.startswith("__")]
    return edges, private


def find_cycle(edges):
    state, stack = {}, []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for m in sorted(edges[n]):
            if state.get(m) == "open":
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = "done"
        return None

    for n in sorted(edges):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_graph_sees_the_lab_and_its_imports_of_the_library():
    edges, _ = import_graph()
    assert "lab.study.plan" in edges["lab.study.runner"]
    assert "fairseq_gradinit.fairseq_plugin.phase.provenance" in edges["lab.study.plan"]  # lazy import
    assert "fairseq_gradinit.tools.curves" in edges["lab.study.results"]


def test_the_library_never_imports_the_lab():
    """The installed package holds what a GradInit user needs; the lab depends on it, never the reverse (and the
    lab is not installed, so such an import would fail outside a checkout)."""
    edges, _ = import_graph()
    back = sorted(f"{a} -> {b}" for a, targets in edges.items() if a.startswith(PACKAGE)
                  for b in targets if b.split(".")[0] == LAB)
    assert not back, back
    for path in (REPO / PACKAGE).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            assert not [n for n in names if n.split(".")[0] == LAB], path


def test_the_checks_catch_a_cycle_and_a_private_import(tmp_path, monkeypatch):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub.b import public\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import _hidden\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "ROOTS", (pkg,))
    edges, private = import_graph()
    assert find_cycle(edges) == [f"{PACKAGE}.a", f"{PACKAGE}.sub.b", f"{PACKAGE}.a"]
    assert private == [f"{PACKAGE}.sub.b imports _hidden from {PACKAGE}.a"]


def test_package_import_graph_has_no_cycle_and_no_private_imports():
    edges, private = import_graph()
    assert not private, private
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_study_arms_and_presets_import_neither_the_planner_nor_fairseq_or_torch():
    for mod in ("arms", "presets", "preset_schema", "tables"):
        tree = ast.parse((REPO / LAB / "study" / f"{mod}.py").read_text(encoding="utf-8"))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add("." * node.level + (node.module or ""))
        assert not imported & {"fairseq", "torch", ".plan", ".runner", ".cli", ".scheduler", ".results"}, \
            (mod, imported)


#: Attribute names of fairseq's models (its Transformer's stacks, attention, FFN, embeddings and norms): the engine's
#: code holds none of them, so that no check of the engine assumes a fairseq model; a caller passes its model's
#: structure as data (``core.health.ModelStructure``: the plugin's ``FAIRSEQ_STRUCTURE``).
FAIRSEQ_MODULE_NAMES = frozenset({
    "encoder", "decoder", "self_attn", "encoder_attn", "q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2",
    "embed_tokens", "embed_positions", "output_projection", "self_attn_layer_norm", "encoder_attn_layer_norm",
    "final_layer_norm", "layernorm_embedding"})
#: Strings of the engine allowed to name a fairseq module, with why: (file, value) -> reason.
NAMED_IN_CORE = {
    ("recipe_values.py", r"decoder\.output_projection\."): "the authors' published IWSLT setting (a recipe the "
                                                           "user picks by name) leaves their fairseq model's tied "
                                                           "output projection un-stepped",
}


def impurities(source: str, filename: str) -> list:
    """What keeps a module of ``fairseq_gradinit.core`` from being pure PyTorch: an import of argparse, of fairseq
    or of our modules outside core (absolute, or relative beyond the package), and a string constant that names a
    fairseq module. Only strings without whitespace count (a name, a dotted path or a pattern the code uses);
    prose (help texts, messages) and docstrings may mention fairseq's modules as examples."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, node.col_offset, f"{filename}:{node.lineno} imports {a.name}") for a in node.names
                      if a.name.split(".")[0] == "argparse" or a.name.startswith("fairseq")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level > 1 or (not node.level and (module.split(".")[0] == "argparse"
                                                       or module.startswith("fairseq"))):
                found.append((node.lineno, node.col_offset,
                              f"{filename}:{node.lineno} imports from {'.' * node.level}{module}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = set(re.findall(r"[A-Za-z_]\w*", node.value)) & FAIRSEQ_MODULE_NAMES
            if names and not re.search(r"\s", node.value) and (filename, node.value) not in NAMED_IN_CORE:
                found.append((node.lineno, node.col_offset,
                              f"{filename}:{node.lineno} names fairseq's {', '.join(sorted(names))}: {node.value!r}"))
    return [message for *_, message in sorted(found)]


def test_the_engine_imports_neither_argparse_nor_fairseq_and_names_no_fairseq_module():
    core = REPO / PACKAGE / "core"
    found = [f for path in sorted(core.glob("*.py")) for f in impurities(path.read_text(encoding="utf-8"), path.name)]
    assert not found, found


def test_the_purity_check_catches_each_kind():
    bad = ('"""Mentions encoder.layers in a docstring: allowed."""\n'
           "import argparse\nimport fairseq.models\nfrom fairseq_gradinit.tools import x\nfrom .. import plugin\n"
           "from .config import GradInitConfig\n"
           "PAIRS = (('q_proj', 'k_proj'),)\nBLOCK = 'encoder.layers'\n"
           "HELP = 'e.g. decoder\\\\.output_projection\\\\. leaves it un-stepped'\n")
    assert impurities(bad, "x.py") == [
        "x.py:2 imports argparse", "x.py:3 imports fairseq.models", "x.py:4 imports from fairseq_gradinit.tools",
        "x.py:5 imports from ..", "x.py:7 names fairseq's q_proj: 'q_proj'", "x.py:7 names fairseq's k_proj: 'k_proj'",
        "x.py:8 names fairseq's encoder: 'encoder.layers'"]
