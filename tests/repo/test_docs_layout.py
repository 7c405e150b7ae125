"""docs/ holds what a user reads and the research record lives in lab/record/: docs/ has no dated path, no
log, archive or per-run record, no file that no page shows or links, no command that writes into it; and every
relative link of the README, the docs and the lab resolves."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
#: A date in a path marks a dated evidence folder or file: those belong to lab/record/evidence/.
DATE = re.compile(r"(19|20)\d\d-\d\d-\d\d")
#: Logs, archives, monitor records and curve tables are what runs leave behind: the record keeps them.
RECORD_SUFFIXES = (".log", ".tar", ".tgz", ".gz", ".xz", ".bz2", ".zip", ".jsonl", ".csv", ".arms")
#: Flags with which the commands of the docs name a file or folder that they write.
WRITE_FLAGS = ("--out", "--output-dir", "--output-json", "--md", "--json", "--save-dir", "--out-dir")
MARKDOWN = [REPO / "README.md", *sorted(DOCS.glob("*.md")), *sorted((REPO / "lab").rglob("*.md"))]


def _docs_files():
    return sorted(p for p in DOCS.rglob("*") if p.is_file())


def test_docs_hold_no_dated_path_and_no_log_or_archive():
    offenders = []
    for path in _docs_files():
        rel = path.relative_to(DOCS).as_posix()
        if DATE.search(rel) or any(suffix in RECORD_SUFFIXES for suffix in path.suffixes):
            offenders.append(rel)
    assert offenders == [], f"move these to lab/record/: {offenders}"


def test_every_file_in_docs_is_a_page_or_shown_or_linked_by_one():
    pages = [REPO / "README.md", *DOCS.glob("*.md")]
    targets = set()
    for page in pages:
        for target in re.findall(r"\]\(([^)\s#]+)", page.read_text(encoding="utf-8")):
            if not re.match(r"[a-z]+:", target):
                targets.add((page.parent / target).resolve())
    orphans = [p.relative_to(DOCS).as_posix() for p in _docs_files() if p.suffix != ".md" and p not in targets]
    assert orphans == [], f"no page of docs/ or the README shows or links {orphans}: move them to lab/record/"


def test_the_commands_of_the_readme_and_the_docs_write_nothing_into_docs():
    offenders = []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL):
            for flag, value in re.findall(r"(--[\w-]+)[ =]+(\S+)", block):
                if flag in WRITE_FLAGS and value.lstrip("./").startswith("docs/"):
                    offenders.append(f"{page.relative_to(REPO)}: {flag} {value}")
    assert offenders == [], offenders


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", [p.relative_to(REPO).as_posix() for p in MARKDOWN])
def test_relative_links_resolve(page):
    path = REPO / page
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        rel, _, anchor = target.partition("#")
        dest = (path.parent / rel) if rel else path
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), flags=re.MULTILINE)
            if anchor not in {_anchor(h) for h in headings}:
                broken.append(target)
    assert broken == [], broken


def test_prose_paths_into_docs_and_the_lab_exist():
    """A file path named outside a command block (`docs/x.md`, `lab/record/…/y.json`) is there: a moved file
    leaves no stale path behind in the text."""
    stale = []
    for path in MARKDOWN:
        if "evidence" in path.relative_to(REPO).parts:
            continue  # an evidence folder's README records the paths as they were when it ran
        prose = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
        for name in re.findall(r"(?<![\w/.])((?:docs|lab)/[\w./-]+\.(?:md|json|png|csv|log|py|gz|jsonl))\b", prose):
            if not (REPO / name).exists():
                stale.append(f"{path.relative_to(REPO)}: {name}")
    assert stale == [], stale


#: A path into the research record, where dated folders live (`lab/record/evidence/<study>-<date>/`).
RECORD_PATH = re.compile(r"(?:\.\./)*lab/record/[^\s)\]`'\"]*")


def test_user_pages_name_no_date_outside_a_path_into_the_record():
    """A page of docs/ states what holds and links the record for the run behind it: a calendar date there
    marks a dated run narrative, which belongs to lab/record/."""
    dated = []
    for page in sorted(DOCS.glob("*.md")):
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for match in DATE.finditer(RECORD_PATH.sub("", line)):
                dated.append(f"docs/{page.name}:{number}: {match.group(0)}")
    assert dated == [], f"move these dated passages to lab/record/ (or link the record): {dated}"


#: The longest a Markdown table cell may be: a longer text reads as a list item or a paragraph.
MAX_CELL = 200
#: Pages whose tables still hold longer cells: the thresholds of health.md and the remedies of remedies.md,
#: whose rows change with the health check's next reason. Remove a page from here once its cells are split.
LONG_CELLS_LEFT = {"health.md", "remedies.md"}


def table_cells(text: str):
    """(line number, cell) of every Markdown table row outside fenced blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("|"):
            for cell in re.split(r"(?<!\\)\|", line.strip().strip("|")):
                yield number, cell.strip()


@pytest.mark.parametrize("page", ["README.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))])
def test_no_table_cell_is_over_200_characters(page):
    if Path(page).name in LONG_CELLS_LEFT:
        pytest.skip(f"{page}: its long cells are still to be split")
    long = [f"{page}:{n}: {len(cell)} characters" for n, cell in table_cells((REPO / page).read_text(encoding="utf-8"))
            if len(cell) > MAX_CELL]
    assert long == []


def test_the_pages_left_with_long_cells_still_have_them():
    """A page whose cells were split leaves LONG_CELLS_LEFT, so that the test above checks it again."""
    for name in LONG_CELLS_LEFT:
        assert any(len(cell) > MAX_CELL for _, cell in table_cells((DOCS / name).read_text(encoding="utf-8"))), name
