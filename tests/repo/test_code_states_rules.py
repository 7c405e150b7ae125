"""The library's comments, docstrings and strings state rules and their reasons, not results.

A rule ("fp32 stays the default until ...", "a threshold of 4 because ...") keeps its meaning in
every release; a result ("~150 s on one <GPU>", "measured on <date>") is true of one run and goes
stale in the code. Results live in docs/ pages that a comment may link. So the installed package
(and the thin ``scripts/`` that call it) may not carry, in its comments, docstrings or string
literals, a calendar date or a GPU model name, nor, in its comments and docstrings, a number
attached to a unit of time or throughput. Format examples use placeholders (``YYYY-MM-DD``).
"""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = (ROOT / "fairseq_gradinit", ROOT / "scripts")

#: A calendar date (2026-11-26), as a dated result or folder name carries it.
DATE = re.compile(r"(?<![\d-])(19|20)\d\d-[01]\d-[0-3]\d(?![\d-])")
#: A GPU model, as a result "on one <GPU>" names it (the hardware a rule is about is named by its
#: architecture or compute capability instead).
GPU = re.compile(r"\b([ABHLV]100|H200|B200|GH200|A10G|RTX ?\d{4}|T4)\b")
#: A number attached to a unit of time or throughput: a timing or a rate from one run.
MEASURED = re.compile(
    r"(?<![\w.])~?\d+(\.\d+)?\s?"
    r"(ms|µs|us|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?|[A-Za-z]+/s)(?![\w/])"
    r"|(?<![\w.])\d+(\.\d+)?\s?(%|x|×|times)\s(fewer|more|less|faster|slower)\b")

#: (path relative to the repository, exact phrase, why it must stay). Keep it tiny.
ALLOWED: Tuple[Tuple[str, str, str], ...] = ()


def _texts(path: Path) -> Iterator[Tuple[int, str, str]]:
    """(line, kind, text) of every comment ("comment"), docstring ("docstring") and other string
    literal ("string") of ``path``; a docstring is a string that starts a statement."""
    source = path.read_text(encoding="utf-8")
    fstring_middle = getattr(tokenize, "FSTRING_MIDDLE", None)  # Python 3.12+ splits f-strings
    statement_start = True
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], "comment", tok.string
            continue
        if tok.type == tokenize.STRING:
            yield tok.start[0], "docstring" if statement_start else "string", tok.string
        elif fstring_middle is not None and tok.type == fstring_middle:
            yield tok.start[0], "string", tok.string
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            statement_start = tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)


def _allowed(rel: str, line: str) -> bool:
    return any(rel == path and phrase in line for path, phrase, _why in ALLOWED)


def _hits_in(path: Path, rel: str) -> List[str]:
    hits = []
    for start, kind, text in _texts(path):
        for offset, line in enumerate(text.splitlines()):
            checks = [("a date", DATE), ("a GPU model", GPU)]
            if kind != "string":
                checks.append(("a measured number", MEASURED))
            for what, pattern in checks:
                match = pattern.search(line)
                if match and not _allowed(rel, line):
                    hits.append(f"{rel}:{start + offset}: {what} ({match.group(0)!r}) in a {kind}: "
                                f"{line.strip()[:160]}")
    return hits


def library_hits(roots=SCANNED) -> List[str]:
    """Every date, GPU model and measured number in the scanned files, one line each."""
    hits = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            hits += _hits_in(path, path.relative_to(ROOT).as_posix())
    return hits


def test_the_library_states_rules_not_results():
    hits = library_hits()
    assert not hits, ("comments, docstrings and strings state the rule and its reason (link a docs/ page for "
                      "the evidence), not dates, GPU models or measured timings:\n" + "\n".join(hits))


@pytest.mark.parametrize("snippet, what", [
    ('# the 2026-11-26 data-bins\n', "a date"),
    ('"""Reproduces the run of 2024-01-01."""\n', "a date"),
    ('x = "fastest on an H200"\n', "a GPU model"),
    ('# about 150 s per phase\n', "a measured number"),
    ('"""Decodes ~12.5 sentences/s."""\n', "a measured number"),
    ('# 22% fewer launches\n', "a measured number"),
    ('def f():\n    """Took 3 minutes."""\n', "a measured number"),
])
def test_the_scan_finds_results(tmp_path, snippet, what):
    path = tmp_path / "module.py"
    path.write_text(snippet)
    hits = _hits_in(path, "module.py")
    assert len(hits) == 1 and what in hits[0], hits


@pytest.mark.parametrize("snippet", [
    '# fairseq logs "YYYY-MM-DD hh:mm:ss | INFO | ..."\n',
    'help = "log every N seconds (0: off)"\n',
    'line = f"{rate:.3g} updates/s"\n',           # a format string: the number comes from the run
    'print("%.1f s" % wall)\n',
    '# torch 2.11 to 2.13 with cuDNN before 9.26 on compute capability 9.x: affected\n',
    '"""ResNet-110 (18 blocks per stage), 1.73M parameters."""\n',
    'since = "0.5.0"\n',
])
def test_the_scan_leaves_rules_and_code_alone(tmp_path, snippet):
    path = tmp_path / "module.py"
    path.write_text(snippet)
    assert _hits_in(path, "module.py") == []
