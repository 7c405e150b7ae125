"""The presets' schema: :class:`Preset`, :class:`StudyCall` and the loader of their data files
(``lab/study/preset_data/``; :mod:`.presets` loads them). Pure Python: no fairseq, no torch.

``common.toml``
    ``presets``: the preset names in the order ``--list-presets`` shows them, each one file ``NAME.toml``;
    ``[groups]``: named argument groups; ``[left_out.GROUP]``: for a group taken from a recipe, the recipe's
    values it leaves out and why (``field = "reason"``).
``NAME.toml``, one preset named by its file
    the :class:`Preset` fields ``summary``, ``answers``, ``docs``, ``takes``, ``duration``, ``doc``, ``max_update``,
    ``valid_every``, ``save_every``, ``parallel``, ``throughput``, ``base`` (arguments), ``files`` (``KEY = PATH``)
    and ``recompute`` (``KEY = arguments``); ``twins = [SEED, ...]`` follows every arm by its :func:`seed_twin`
    at each seed; ``[groups]``; ``[[arms]]`` (``name``, ``args``, ``drop``, ``data``, ``note``) with
    ``[arm_defaults]`` (``drop``, ``data``) for the arms that give none; ``[[calls]]`` (the :class:`StudyCall`
    fields) with ``[call_defaults]`` (``parallel``, ``time_budget``, ``bleu_budget``, ``finish_margin``,
    ``limit_s``) likewise.

Arguments (``base``, ``args``, ``drop``, ``recompute``, a group) are a list of items:

- ``"TOKEN"``: one command-line token;
- ``"@NAME"``: the tokens of group ``NAME`` (the groups of every file share one namespace);
- ``"@GENERATOR(A, B, ...)"``: tokens computed from the library (:data:`GENERATORS`), so that a value the
  library declares is never copied into the data;
- ``{from = [...], replace = [...], remove = [...]}``: the tokens of ``from`` less the options that ``replace``
  gives again or ``remove`` names, then ``replace`` (:func:`~.arms.merge_args`).

A ``files`` value may be ``"@NAME"`` of a one-token group. In a preset file's own strings ``${max_update}``
is its ``max_update``, and ``save_every``/``valid_every`` may be that string.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from fairseq_gradinit.core.config import first_step
from fairseq_gradinit.core.recipes import Recipe, recipe

from .arms import Arm, merge_args, option_groups

try:
    import tomllib
except ModuleNotFoundError:  # the library runs on 3.9+; the lab reads its presets with 3.11's TOML reader
    raise ImportError("the lab's study runner reads its presets (lab/study/preset_data/*.toml) with tomllib: it "
                      "needs Python 3.11 or later, the tested set; the library itself runs on Python 3.9+") from None

#: The presets' data files.
DATA_DIR = Path(__file__).resolve().parent / "preset_data"
COMMON = "common.toml"
MAX_UPDATE = "${max_update}"
_NAME_RE = re.compile(r"[A-Za-z_]\w*")
_CALL_RE = re.compile(r"([A-Za-z_]\w*)\((.*)\)")


@dataclass(frozen=True)
class StudyCall:
    """One GPU call of a preset: the arms it trains and the arms whose GradInit scales it computes
    into the cache for a later call. ``parallel``, ``time_budget``/``bleu_budget`` (minutes) and
    ``finish_margin`` (seconds) are the defaults of ``--call NAME``; ``limit_s`` is the call's wall-time
    limit, which its estimate must fit (``--dry-run`` checks it)."""

    name: str
    arms: Tuple[str, ...]
    prepare: Tuple[str, ...] = ()
    note: str = ""
    parallel: Optional[int] = None
    time_budget: Optional[float] = None
    bleu_budget: Optional[float] = None
    finish_margin: Optional[float] = None
    limit_s: Optional[float] = None
    #: A call that repeats arms at another seed: ``--arms``/``--prepare-arms`` name the preset's arms
    #: and the call trains/prepares their twins at this seed (:func:`seed_twin`) instead of ``arms``.
    repeat_seed: Optional[int] = None


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    base: Tuple[str, ...]
    arms: Tuple[Arm, ...]
    max_update: int
    valid_every: int = 100
    save_every: int = 500
    files: Mapping[str, str] = field(default_factory=dict)  # {KEY} defaults, relative to the repo root
    calls: Tuple[StudyCall, ...] = ()
    doc: str = ""
    throughput: Optional[str] = None  # the GPU whose measured figures estimate its calls (study.estimate)
    #: How long the preset took where it was measured, for presets without throughput figures
    #: (printed by --list-presets and --dry-run).
    duration: str = ""
    #: {file key: the GradInit arguments that computed that file}: a seed twin of an arm that applies
    #: the file computes its own scales with them instead (:func:`seed_twin`).
    recompute: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    #: What the preset answers, in a sentence, and where it is documented (``--list-presets``).
    answers: str = ""
    docs: str = ""
    #: How long it takes, for presets whose calls have no estimate of their own (``--list-presets``).
    takes: str = ""
    #: Processes at once when neither ``--parallel`` nor a ``--call`` says (a CPU preset's default).
    parallel: Optional[int] = None

    def call(self, name: str) -> StudyCall:
        for c in self.calls:
            if c.name == name:
                return c
        known = ", ".join(c.name for c in self.calls) or "none"
        raise ValueError(f"preset {self.name} has no call {name!r} (calls: {known})")

    def resolved_files(self, repo_root: Path) -> Dict[str, str]:
        return {k: str((repo_root / v).resolve()) if not Path(v).is_absolute() else v for k, v in self.files.items()}


def seed_twin(preset: Preset, arm: Arm, seed: int) -> Arm:
    """``arm`` at another seed, named ``NAME-sSEED``. An arm that applies one of the preset's
    ``recompute`` files computes its own scales at that seed with the settings that made the file,
    as the file's scales fit only the initial weights of their own seed."""
    return _twin(arm, seed, preset.recompute)


def _twin(arm: Arm, seed: int, recompute: Mapping[str, Tuple[str, ...]]) -> Arm:
    args, extra = [], []
    for g in option_groups(arm.args):
        key = g[1].strip("{}") if g[0] == "--gradinit-init-file" and len(g) == 2 else None
        if key is not None and key in recompute:
            extra += list(recompute[key])
        else:
            args += g
    twin = merge_args(extra + args, ["--seed", str(seed)])
    return Arm(f"{arm.name}-s{seed}", tuple(twin), drop=arm.drop, data=arm.data,
               note=f"{arm.name} at seed {seed}" + (" (its own GradInit scales)" if extra else ""))


# -- generators: values the library declares, named by the data ------------------------------------------
def number_text(value) -> str:
    """A number as the presets' command lines spell it: ``1e-3``, ``2.5e-3``, ``1e3``, ``780``."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    mantissa, exponent = f"{value:e}".split("e")
    text = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    return text if float(text) == value else repr(value)


def recipe_args(source: Recipe, names: Sequence[str]) -> Tuple[str, ...]:
    """The values ``names`` (config fields or settings) of a recipe as ``--gradinit-*`` flags, in that
    order: :meth:`~fairseq_gradinit.core.recipes.Recipe.flags`, numbers spelled by :func:`number_text`."""
    flags = source.flags()
    text = dict(zip(flags[::2], flags[1::2]))
    out: Tuple[str, ...] = ()
    for name in names:
        flag = "--gradinit-" + name.replace("_", "-")
        if flag not in text:
            raise ValueError(f"recipe {source.name!r} has no value {name!r}")
        value = source.values[name] if name in source.values else source.settings[name]
        out += (flag, number_text(value) if isinstance(value, (int, float)) else text[flag])
    return out


def paper_defaults(train_lr: float, paper_step: Sequence[str]) -> Tuple[str, ...]:
    """What the plugin's Adam defaults were before its no-warmup setting, for the presets that record runs made
    with them: gamma by the plugin's rule (1/eta, eta = 2 x ``train_lr``), the authors' tau 2.5e-3, then
    ``paper_step`` (the single simulated step)."""
    gamma = first_step("adam", train_lr, rule="fairseq").gamma
    return ("--gradinit-gamma", repr(gamma)) + recipe_args(recipe("authors-iwslt14"), ("lr",)) + tuple(paper_step)


def _gen_recipe(groups: "_Groups", name: str, *fields: str) -> Tuple[str, ...]:
    if not fields:
        raise ValueError("name at least one of the recipe's values, e.g. @recipe(authors-iwslt14, eta)")
    return recipe_args(recipe(name), fields)


def _gen_paper_defaults(groups: "_Groups", train_lr: str) -> Tuple[str, ...]:
    return paper_defaults(float(train_lr), groups.get("PAPER_STEP"))


#: ``name -> (what it gives, function(groups, *arguments))``; arguments are the text between the commas.
GENERATORS: Dict[str, Tuple[str, Callable[..., Tuple[str, ...]]]] = {
    "recipe": ("@recipe(RECIPE, FIELD, ...): the recipe's values FIELD, ... as --gradinit-* flags, in that order "
               "(fairseq_gradinit.core.recipes)", _gen_recipe),
    "paper_defaults": ("@paper_defaults(LR): the plugin's Adam gamma for training lr LR by its rule (1/eta, "
                       "eta = 2 x LR), the authors' tau, then the group PAPER_STEP", _gen_paper_defaults),
}


# -- the loader ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PresetLibrary:
    """What the data files declare: the presets (in listing order), every named group, resolved, and the
    ``left_out`` notes of common.toml."""

    presets: Mapping[str, Preset]
    groups: Mapping[str, Tuple[str, ...]]
    left_out: Mapping[str, Mapping[str, str]]


def _fail(where: str, problem: str, fix: str):
    raise ValueError(f"{where}: {problem}; {fix}")


def _check_keys(table: Any, known: Sequence[str], where: str, required: Sequence[str] = ()) -> Dict[str, Any]:
    if not isinstance(table, dict):
        _fail(where, f"expected a table, got {type(table).__name__}", "see lab/study/preset_schema.py")
    for key in table:
        if key not in known:
            near = difflib.get_close_matches(key, known, 1)
            _fail(where, f"unknown key {key!r}", (f"did you mean {near[0]!r}? " if near else "")
                  + f"known keys: {', '.join(known)}")
    for key in required:
        if key not in table:
            _fail(where, f"key {key!r} is missing", f"add {key} = ... (see lab/study/preset_schema.py)")
    return table


def _typed(value: Any, types: tuple, where: str, what: str):
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        _fail(where, f"expected {what}, got {value!r}", f"give {what}")
    return value


class _Groups:
    """The named groups of every file, expanded on first use (a group that uses itself is an error)."""

    def __init__(self):
        self.raw: Dict[str, Tuple[Any, str]] = {}
        self.done: Dict[str, Tuple[str, ...]] = {}
        self.active: List[str] = []

    def define(self, table: Any, where: str):
        for name, items in _check_keys(table, list(table) if isinstance(table, dict) else [], where).items():
            if not _NAME_RE.fullmatch(name):
                _fail(where, f"group name {name!r}", "use letters, digits and '_', not starting with a digit")
            if name in self.raw:
                _fail(f"{where}: group {name}", f"defined again (first in {self.raw[name][1]})",
                      "keep one definition and reference it as '@" + name + "'")
            self.raw[name] = (items, where)

    def get(self, name: str, where: str = "") -> Tuple[str, ...]:
        if name in self.done:
            return self.done[name]
        if name not in self.raw:
            near = difflib.get_close_matches(name, list(self.raw), 1)
            _fail(where, f"'@{name}' names no group", (f"did you mean '@{near[0]}'? " if near else "")
                  + "define it under [groups] in common.toml or a preset's file, or fix the name")
        if name in self.active:
            _fail(where, f"group {name} uses itself ({' -> '.join(self.active + [name])})", "break the cycle")
        self.active.append(name)
        items, defined = self.raw[name]
        self.done[name] = self.expand(items, f"{defined}: group {name}")
        self.active.pop()
        return self.done[name]

    def expand(self, items: Any, where: str) -> Tuple[str, ...]:
        """The tokens of an argument list (the module's docstring says what its items may be)."""
        if isinstance(items, str):
            items = [items]
        _typed(items, (list,), where, "a list of arguments")
        out: List[str] = []
        for item in items:
            if isinstance(item, dict):
                table = _check_keys(item, ("from", "replace", "remove"), where, required=("from",))
                out += merge_args(self.expand(table["from"], where), self.expand(table.get("replace", []), where),
                                  self.expand(table.get("remove", []), where))
            elif not isinstance(item, str):
                _fail(where, f"argument {item!r} is neither a string nor a table",
                      "give 'TOKEN', '@GROUP', '@GENERATOR(...)' or {from = [...], replace = [...]}")
            elif item.startswith("@"):
                out += self.reference(item, where)
            else:
                out.append(item)
        return tuple(out)

    def reference(self, item: str, where: str) -> Tuple[str, ...]:
        ref = item[1:]
        if _NAME_RE.fullmatch(ref):
            return self.get(ref, where)
        m = _CALL_RE.fullmatch(ref)
        if m is None:
            _fail(where, f"{item!r} is not a reference", "write '@GROUP' or '@GENERATOR(A, B)'")
        name, args = m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()]
        if name not in GENERATORS:
            _fail(where, f"{item!r}: no generator {name!r}", "generators: " + "; ".join(
                doc for doc, _ in GENERATORS.values()))
        doc, fn = GENERATORS[name]
        try:
            return tuple(fn(self, *args))
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"{where}: {item!r}: {e}; usage: {doc}") from None


def _read(path: Path) -> Dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e}); fix the file") from None


def _substitute(value: Any, max_update: int) -> Any:
    if isinstance(value, str):
        return value.replace(MAX_UPDATE, str(max_update))
    if isinstance(value, list):
        return [_substitute(v, max_update) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, max_update) for k, v in value.items()}
    return value


_TEXT = ("summary", "answers", "docs", "takes", "duration", "doc")
_PRESET_KEYS = _TEXT + ("max_update", "valid_every", "save_every", "parallel", "throughput", "base", "files",
                        "recompute", "twins", "groups", "arm_defaults", "call_defaults", "arms", "calls")
_ARM_DEFAULTS = ("drop", "data")
_CALL_DEFAULTS = ("parallel", "time_budget", "bleu_budget", "finish_margin", "limit_s")
_CALL_KEYS = ("name", "arms", "prepare", "note", "repeat_seed") + _CALL_DEFAULTS


def _arms(raw: Dict[str, Any], groups: _Groups, where: str, recompute) -> Tuple[Arm, ...]:
    defaults = _check_keys(raw.get("arm_defaults", {}), _ARM_DEFAULTS, f"{where}: [arm_defaults]")
    twins = [_typed(s, (int,), f"{where}: twins", "a list of seeds") for s in _typed(
        raw.get("twins", []), (list,), f"{where}: twins", "a list of seeds")]
    out: List[Arm] = []
    for i, table in enumerate(_typed(raw["arms"], (list,), f"{where}: arms", "[[arms]] tables")):
        at = f"{where}: arm {table.get('name', f'#{i + 1}') if isinstance(table, dict) else i + 1}"
        table = {**defaults, **_check_keys(table, ("name",) + _ARM_DEFAULTS + ("args", "note"), at, ("name",))}
        try:
            arm = Arm(_typed(table["name"], (str,), at, "a name"), groups.expand(table.get("args", []), f"{at}: args"),
                      drop=groups.expand(table.get("drop", []), f"{at}: drop"),
                      data=_typed(table.get("data", "main"), (str,), f"{at}: data", "a data-bin key"),
                      note=_typed(table.get("note", ""), (str,), f"{at}: note", "a string"))
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith(str(where)) else f"{at}: {e}") from None
        out += [arm] + [_twin(arm, seed, recompute) for seed in twins]
    seen = set()
    for arm in out:
        if arm.name in seen:
            _fail(f"{where}: arm {arm.name}", "the name is given twice", "rename one of the arms")
        seen.add(arm.name)
    return tuple(out)


def _calls(raw: Dict[str, Any], arms: Sequence[Arm], where: str) -> Tuple[StudyCall, ...]:
    defaults = _check_keys(raw.get("call_defaults", {}), _CALL_DEFAULTS, f"{where}: [call_defaults]")
    names = [a.name for a in arms]
    out: List[StudyCall] = []
    for i, table in enumerate(_typed(raw.get("calls", []), (list,), f"{where}: calls", "[[calls]] tables")):
        at = f"{where}: call {table.get('name', f'#{i + 1}') if isinstance(table, dict) else i + 1}"
        table = {**defaults, **_check_keys(table, _CALL_KEYS, at, ("name",))}
        for key in ("arms", "prepare"):
            for name in _typed(table.get(key, []), (list,), f"{at}: {key}", "a list of arm names"):
                if name not in names:
                    near = difflib.get_close_matches(str(name), names, 1)
                    _fail(f"{at}: {key}", f"no arm {name!r} in this preset", (f"did you mean {near[0]!r}? "
                          if near else "") + "name one of its [[arms]] or add the arm")
        numbers = {k: float(_typed(table[k], (int, float), f"{at}: {k}", "a number")) for k in _CALL_DEFAULTS[1:]
                   if k in table}
        ints = {k: _typed(table[k], (int,), f"{at}: {k}", "an integer") for k in ("parallel", "repeat_seed")
                if k in table}
        call = StudyCall(_typed(table["name"], (str,), at, "a name"), tuple(table.get("arms", [])),
                         tuple(table.get("prepare", [])), note=_typed(table.get("note", ""), (str,), at, "a string"),
                         **numbers, **ints)
        if not (call.arms or call.prepare or call.repeat_seed is not None):
            _fail(at, "the call trains and prepares nothing", "give arms, prepare or repeat_seed")
        if call.name in {c.name for c in out}:
            _fail(at, "the name is given twice", "rename one of the calls")
        out.append(call)
    return tuple(out)


def _preset(name: str, path: Path, raw: Dict[str, Any], groups: _Groups) -> Preset:
    where = f"{path}: preset {name}"
    _check_keys(raw, _PRESET_KEYS, where, ("summary", "base", "arms", "max_update"))
    max_update = _typed(raw["max_update"], (int,), f"{where}: max_update", "an integer")
    raw = {k: max_update if k in ("valid_every", "save_every") and v == MAX_UPDATE else v for k, v in raw.items()}
    raw = _substitute({k: v for k, v in raw.items() if k != "groups"}, max_update)
    ints = {k: _typed(raw[k], (int,), f"{where}: {k}", "an integer") for k in ("valid_every", "save_every",
                                                                           "parallel") if k in raw}
    texts = {k: _typed(raw[k], (str,), f"{where}: {k}", "a string") for k in _TEXT if k in raw}
    files = {}
    for key, value in _check_keys(raw.get("files", {}), list(raw.get("files", {})), f"{where}: files").items():
        tokens = groups.expand(value, f"{where}: files: {key}")
        if len(tokens) != 1:
            _fail(f"{where}: files: {key}", f"expected one path, got {tokens!r}", "give a path or '@GROUP' of one")
        files[key] = tokens[0]
    recompute = {}
    for key, value in _check_keys(raw.get("recompute", {}), list(files), f"{where}: recompute").items():
        recompute[key] = groups.expand(value, f"{where}: recompute: {key}")
    if "throughput" in raw:
        from .estimate import THROUGHPUT

        if raw["throughput"] not in THROUGHPUT:
            _fail(f"{where}: throughput", f"no figures named {raw['throughput']!r}",
                  f"name one of {', '.join(THROUGHPUT)} (lab/study/estimate.py)")
    arms = _arms(raw, groups, where, recompute)
    return Preset(name=name, base=groups.expand(raw["base"], f"{where}: base"), arms=arms, max_update=max_update,
                  files=files, recompute=recompute, calls=_calls(raw, arms, where),
                  throughput=raw.get("throughput"), **ints, **texts)


def load_presets(folder: Path = DATA_DIR) -> PresetLibrary:
    """Read and check ``folder``'s ``common.toml`` and preset files; a problem is a ValueError that names the
    file, the preset and the key, and says what to do."""
    folder = Path(folder)
    common_path = folder / COMMON
    common = _check_keys(_read(common_path), ("presets", "groups", "left_out"), str(common_path), ("presets",))
    order = _typed(common["presets"], (list,), f"{common_path}: presets", "a list of preset names")
    files = {p.stem: p for p in sorted(folder.glob("*.toml")) if p.name != COMMON}
    for name in order:
        if name not in files:
            _fail(f"{common_path}: presets", f"preset {name!r} has no file {name}.toml", "add the file or the name")
    for name, path in files.items():
        if name not in order:
            _fail(str(path), f"preset {name} is not listed in {COMMON}'s presets",
                  "add its name where --list-presets should show it")
    groups = _Groups()
    groups.define(common.get("groups", {}), f"{common_path}")
    raws = {name: _read(files[name]) for name in order}
    for name, raw in raws.items():
        groups.define(raw.get("groups", {}), f"{files[name]}")
    for name in list(groups.raw):
        groups.get(name)
    left_out = {}
    for name, notes in _check_keys(common.get("left_out", {}), list(groups.raw), f"{common_path}: left_out").items():
        left_out[name] = {k: _typed(v, (str,), f"{common_path}: left_out.{name}.{k}", "a reason")
                          for k, v in _check_keys(notes, list(notes), f"{common_path}: left_out.{name}").items()}
    presets = {name: _preset(name, files[name], raw, groups) for name, raw in raws.items()}
    return PresetLibrary(presets=presets, groups=dict(groups.done), left_out=left_out)
