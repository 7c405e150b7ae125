"""Every module a docstring names (``:mod:``, ``:func:``, ``:class:``, ... roles, relative as a relative import
or absolute under ``fairseq_gradinit`` or ``lab``) exists, and so does the first name after it: a module that
moves takes its references along."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fairseq_gradinit", "lab")
ROLE = re.compile(r":(?:mod|func|class|meth|data|attr|exc|obj):`~?([^`<>\s]+)`")


def _module_parts(path: Path) -> list:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _module_file(parts) -> Path:
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"


def _docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield doc
        # attribute docstrings (a string right after an assignment) too
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.value.value


def target_parts(source: Path, target: str):
    """The dotted parts a role's target names, resolved like an import from ``source``; None for a name
    outside our packages (torch, fairseq, a bare name)."""
    if target.startswith("."):
        dots = len(target) - len(target.lstrip("."))
        here = _module_parts(source)
        package = here if source.name == "__init__.py" else here[:-1]
        package = package[:len(package) - (dots - 1)]
        return package + [p for p in target.lstrip(".").split(".") if p]
    parts = target.split(".")
    return parts if parts[0] in PACKAGES else None


def broken_reference(parts) -> bool:
    """No module is named, the name after the module is not in it, or more than two names follow it."""
    known = [k for k in range(1, len(parts) + 1) if _module_file(parts[:k]).is_file()]
    if not known:
        return True
    k = max(known)
    if len(parts) - k > 2:
        return True
    if len(parts) == k:
        return False
    text = _module_file(parts[:k]).read_text(encoding="utf-8")
    return re.search(rf"\b{re.escape(parts[k])}\b", text) is None


def broken_references():
    out = []
    for package in PACKAGES:
        for source in sorted((ROOT / package).rglob("*.py")):
            seen = set()
            for doc in _docstrings(ast.parse(source.read_text(encoding="utf-8"))):
                for target in ROLE.findall(doc):
                    parts = target_parts(source, target)
                    if parts is None or target in seen:
                        continue
                    seen.add(target)
                    if broken_reference(parts):
                        out.append(f"{source.relative_to(ROOT)}: {target}")
    return out


def test_every_module_a_docstring_names_exists():
    assert broken_references() == []


def test_the_check_finds_a_moved_module():
    hook = ROOT / "fairseq_gradinit" / "fairseq_plugin" / "registration" / "hook.py"
    assert broken_reference(target_parts(hook, "..settings.plan.RunPlan")) is False
    assert broken_reference(target_parts(hook, ".plan.RunPlan")) is True  # plan is not beside hook
    assert broken_reference(target_parts(hook, "..settings.plan.NoSuchName")) is True
    assert target_parts(hook, "torch.nn.Module") is None
