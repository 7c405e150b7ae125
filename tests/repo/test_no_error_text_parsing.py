"""No code of the library rewords an error by taking its text apart (``str(e).split(': ')``,
``msg.startswith("--")``, ``message.partition(" ")``, ``e.code.replace(...)``, ``str(e)[:200]``): our errors
carry their parts as attributes (:class:`~fairseq_gradinit.core.errors.ConfigError`,
:class:`~fairseq_gradinit.core.errors.OptionValueError`, ``GradInitStop.message``), and a message built from
pieces of another message breaks silently when that message is reworded. Read from the source (AST)."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "fairseq_gradinit"

#: Methods and operations that cut a text into pieces or test its wording.
CUTTING = {"split", "rsplit", "partition", "rpartition", "splitlines", "startswith", "endswith", "replace",
           "removeprefix", "removesuffix", "find", "rfind", "index", "rindex", "lstrip", "rstrip", "strip"}

#: Regular expressions applied to a text (``re.match(pattern, str(e))``, ``PATTERN.search(message)``).
MATCHING = {"match", "fullmatch", "search", "findall", "finditer", "sub", "subn", "split"}

#: Sites that summarize an error of torch, which carries nothing but its text (file, function).
FOREIGN_TEXT = {
    ("fairseq_gradinit/core/sdpa_guard.py", "probe_kernel"),               # an SDPA kernel's RuntimeError, recorded
    ("fairseq_gradinit/tools/train_vision/cli.py", "resume_run"),          # load_state_dict's RuntimeError
    ("fairseq_gradinit/tools/valid_loss_modes.py", "main"),                # load_state_dict's size mismatch
    ("fairseq_gradinit/fairseq_plugin/settings/validation.py", "resume_error"),  # torch.load's error and its C++ frames
    ("fairseq_gradinit/tools/bleu_score.py", "scoring_problem"),           # sacreBLEU's tokenizer errors, on one line
    ("fairseq_gradinit/tools/inprocess_generate.py", "__init__"),          # a fairseq scorer's build error, on one line
}


def _is_exception_annotation(node) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
        node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
    return name.endswith(("Error", "Exception", "Exit", "Stop"))


class _Finder(ast.NodeVisitor):
    """Cuts of an exception's text inside each function: ``str(e)``, ``f"{e}"``, ``e.args[i]``, ``e.code`` or
    ``e.msg`` of a name bound by ``except ... as e`` or a parameter annotated with an error class, and of the
    names assigned from them."""

    def __init__(self):
        self.found = []  # (function, line, source)
        self.function = "<module>"
        self.errors, self.texts = set(), set()

    def visit_FunctionDef(self, node):
        saved = self.function, self.errors, self.texts
        self.function, self.errors, self.texts = node.name, set(), set()
        for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
            if arg.annotation is not None and _is_exception_annotation(arg.annotation):
                self.errors.add(arg.arg)
        self.generic_visit(node)
        self.function, self.errors, self.texts = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ExceptHandler(self, node):
        if node.name:
            self.errors.add(node.name)
        self.generic_visit(node)

    def is_text(self, node) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.texts
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("str", "repr") \
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in self.errors:
            return True
        if isinstance(node, ast.Attribute) and node.attr in ("code", "msg", "args") \
                and isinstance(node.value, ast.Name) and node.value.id in self.errors:
            return True
        if isinstance(node, ast.Subscript):
            return self.is_text(node.value)
        if isinstance(node, ast.JoinedStr):
            return any(isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name)
                       and v.value.id in self.errors for v in node.values) and len(node.values) == 1
        if isinstance(node, ast.BoolOp):  # (str(e) or "")
            return any(self.is_text(v) for v in node.values)
        return False

    def visit_Assign(self, node):
        self.generic_visit(node)
        if self.is_text(node.value):
            self.texts.update(t.id for t in node.targets if isinstance(t, ast.Name))

    def visit_Call(self, node):
        if isinstance(node.func, ast.Attribute) and (
                (node.func.attr in CUTTING and self.is_text(node.func.value))
                or (node.func.attr in MATCHING and any(self.is_text(a) for a in node.args))):
            self.found.append((self.function, node.lineno, ast.unparse(node)))
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if isinstance(node.slice, ast.Slice) and self.is_text(node.value):
            self.found.append((self.function, node.lineno, ast.unparse(node)))
        self.generic_visit(node)


def cuts_in(source: str):
    finder = _Finder()
    finder.visit(ast.parse(source))
    return finder.found


@pytest.mark.parametrize("source", [
    "try:\n    f()\nexcept ValueError as e:\n    msg = str(e)\n    g(msg if msg.startswith('--') else msg)\n",
    "def f(error: ValueError):\n    message = str(error)\n    flag, _, rest = message.partition(' ')\n",
    "try:\n    f()\nexcept ValueError as e:\n    g(str(e).split(': ', 1)[-1])\n",
    "try:\n    f()\nexcept SystemExit as e:\n    g(e.code.replace('gradinit: error: ', '', 1))\n",
    "try:\n    f()\nexcept Exception as e:\n    g((str(e).strip().splitlines() or [''])[0][:200])\n",
    "try:\n    f()\nexcept ValueError as e:\n    g(str(e)[:80])\n",
    "try:\n    f()\nexcept ValueError as e:\n    m = re.match(r'(\\w+)=(.*) is invalid', str(e))\n",
    "def f(error: ConfigError):\n    text = str(error)\n    return PATTERN.search(text).group(1)\n",
])
def test_the_finder_sees_each_form_of_cut(source):
    assert cuts_in(source), source


def test_the_finder_passes_an_error_shown_whole_or_by_its_attributes():
    source = ("def f(error: ValueError):\n    if isinstance(error, OptionValueError):\n"
              "        return f'argument {error.flag}: {error.detail}'\n    text = str(error)\n"
              "    return text if '\\n' not in text and len(text) <= 200 else type(error).__name__\n")
    assert cuts_in(source) == []


def test_no_error_text_is_cut_into_a_new_message():
    found = []
    for path in sorted(LIBRARY.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for function, line, code in cuts_in(path.read_text(encoding="utf-8")):
            if (rel, function) not in FOREIGN_TEXT:
                found.append(f"{rel}:{line} ({function}): {code}")
    assert found == [], ("word these errors from their attributes (ConfigError, OptionValueError, "
                         "GradInitStop.message), not by cutting their text:\n" + "\n".join(found))


def test_each_foreign_text_site_still_exists():
    """The list above names only sites that exist (a stale entry would hide a new one)."""
    for rel, function in FOREIGN_TEXT:
        found = [f for f, _, _ in cuts_in((REPO / rel).read_text(encoding="utf-8"))]
        assert function in found, (rel, function)
