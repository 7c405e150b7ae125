"""Reliability of the fairseq plugin under real use: bad input, resume paths, provenance,
unsupported setups, import side effects and interruption. docs/reliability.md maps each case here."""
import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("fairseq")

from fairseq import options  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402

from fairseq_gradinit.fairseq_plugin.phase import provenance  # noqa: E402
from fairseq_helpers import REPO, free_port, run_ranks  # noqa: E402
from fairseq_train import TINY_MODEL, env_with_repo, train_inprocess  # noqa: E402


def _argv(data, save, *extra):
    return [str(data), "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--max-update", "1",
            "--save-dir", str(save), *extra]


def test_fingerprint_from_args_matches_the_config_fairseq_train_uses(tiny_data, tmp_path):
    """The study runner's fingerprint (argument list, no model) equals the one of the config that
    fairseq-train actually runs with; it is portable across a copied data-bin and sensitive to what
    determines GradInit."""
    argv = _argv(tiny_data, tmp_path / "a", "--gradinit-iters", "2")
    from_args = provenance.fingerprint_from_args(argv)
    train_inprocess(argv)
    assert json.loads((tmp_path / "a" / "gradinit.json").read_text())["fingerprint"] == from_args
    assert from_args["seed"] == 3 and from_args["world_size"] == 1
    assert from_args["model"]["arch"] == "transformer_iwslt_de_en" and from_args["model"]["encoder_layers"] == 2
    assert "lr" not in from_args["model"] and "save_dir" not in from_args["model"]
    assert from_args["gradinit"]["resolved"]["eta"] == 2e-3  # Adam: eta = 2 x --lr (1e-3)
    files = from_args["data"]["dirs"][0]
    assert {"dict.de.txt", "dict.en.txt", "train.de-en.de.idx", "train.de-en.en.idx"} <= set(files)
    assert "sha256" in files["dict.de.txt"] and "sha256" not in files["train.de-en.de.bin"]
    json.dumps(from_args)  # JSON-ready

    # A copy of the data-bin elsewhere (new path, new mtimes) matches; a changed dictionary does not.
    copy = tmp_path / "copied-bin"
    shutil.copytree(tiny_data, copy)
    moved = provenance.fingerprint_from_args([str(copy), *argv[1:]])
    assert provenance.fingerprint_diff(from_args, moved) == []
    with open(copy / "dict.de.txt", "a") as f:
        f.write("extra 1\n")
    changed = provenance.fingerprint_from_args([str(copy), *argv[1:]])
    assert any(d.startswith("data.dirs.0.dict.de.txt") for d in provenance.fingerprint_diff(from_args, changed))
    for extra, key in ((["--seed", "4"], "seed"), (["--dropout", "0.2"], "model.dropout"),
                       (["--gradinit-gamma", "3"], "gradinit."), (["--label-smoothing", "0.2"], "criterion."),
                       (["--distributed-world-size", "2"], "world_size")):
        other = provenance.fingerprint_from_args(argv + extra)
        diff = provenance.fingerprint_diff(from_args, other)
        assert diff and all(d.startswith(key) for d in diff), (extra, diff)
    # What does not change GradInit's result does not change the fingerprint.
    same = provenance.fingerprint_from_args(argv + ["--max-update", "7", "--gradinit-log-interval", "3",
                                                    "--save-dir", str(tmp_path / "elsewhere")])
    assert provenance.fingerprint_diff(from_args, same) == []


# -- 1. bad values are refused when the command line is parsed ----------------------------------
def _parse(argv):
    return options.parse_args_and_arch(options.get_training_parser(), input_args=argv)


@pytest.mark.parametrize("extra, expected", [
    (["--gradinit-iters", "-5"], "argument --gradinit-iters: invalid value -5: expected an integer >= 0"),
    (["--gradinit-eta", "nan"], "argument --gradinit-eta: invalid value nan: expected a finite number > 0"),
    (["--gradinit-eta", "-0.001"], "argument --gradinit-eta: invalid value -0.001"),
    (["--gradinit-gamma", "inf"], "argument --gradinit-gamma: invalid value inf"),
    (["--gradinit-lr", "0"], "argument --gradinit-lr: invalid value 0.0: expected a finite number > 0"),
    (["--gradinit-overlap", "1.5"], "argument --gradinit-overlap: invalid value 1.5: expected a number in [0, 1]"),
    (["--gradinit-min-scale", "0"], "argument --gradinit-min-scale: invalid value 0.0"),
    (["--gradinit-min-scale", "2"], "argument --gradinit-min-scale: invalid value 2.0: expected a number in (0, 1]"),
    (["--gradinit-max-scale", "0.005"], "argument --gradinit-max-scale: invalid value 0.005: expected None or a "
                                        "finite number >= min_scale (0.01)"),
    (["--gradinit-fd-eps", "2"], "argument --gradinit-fd-eps: invalid value 2.0: expected a number in (0, 1)"),
    (["--gradinit-scale-grad-clip", "-1"], "argument --gradinit-scale-grad-clip: invalid value -1.0"),
    (["--gradinit-betas", "0.9"], "argument --gradinit-betas: '0.9' is invalid"),
    (["--gradinit-max-tokens", "0"], "argument --gradinit-max-tokens: invalid value 0: expected an integer >= 1"),
    (["--gradinit-log-interval", "0"], "argument --gradinit-log-interval: invalid value 0"),
    (["--gradinit-scale-bounds", "[('biasx', 0, 1)]"], "argument --gradinit-scale-bounds: \"[('biasx', 0, 1)]\" "
                                                       "is invalid: scale bound select='biasx' is invalid"),
    (["--gradinit-scale-bounds", "bias"], "argument --gradinit-scale-bounds: 'bias' is invalid: expected a list"),
    (["--gradinit-scale-bounds", "[('norm', None, 0.005)]"], "argument --gradinit-scale-bounds: invalid value "
                                                             "(ScaleBound(select='norm', min_scale=None, max_scale=0.005),)"
                                                             ": expected bounds with min <= max, but 'norm' gets "
                                                             "[0.01, 0.005]"),
    (["--lr", "0"], "argument --lr (the default of --gradinit-eta): invalid value 0.0"),
    (["--ddp-backend", "fully_sharded"], "--ddp-backend fully_sharded is not supported with --gradinit-*"),
    (["--model-parallel-size", "2"], "--model-parallel-size 2 is not supported with --gradinit-*"),
    (["--pipeline-model-parallel"], "--pipeline-model-parallel is not supported with --gradinit-*"),
])
def test_bad_values_refused_at_parsing(extra, expected, capsys):
    argv = ["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", "--gradinit-iters", "5"]
    with pytest.raises(SystemExit) as exc:
        _parse(argv + extra)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {expected}" in err, err[-600:]
    assert err.count("error:") == 1 and "Traceback" not in err


def test_values_gradinit_does_not_use_are_not_refused():
    """GradInit off, or an init file instead of computing: --lr 0 is no bad eta, and the setups
    GradInit cannot run in stay fairseq's business."""
    base = ["data-not-read", "--task", "translation_gradinit", *TINY_MODEL]
    _parse(base + ["--lr", "0"])
    _parse(base + ["--lr", "1e-3", "--ddp-backend", "fully_sharded", "--model-parallel-size", "2"])
    ns = _parse(["data-not-read", *TINY_MODEL, "--lr", "1e-3", "--gradinit-iters", "3"])  # no --task: translation
    assert ns.gradinit_iters == 3


@pytest.fixture
def init_files(tmp_path):
    files = {"missing": tmp_path / "nope.json", "not JSON": tmp_path / "bad.json",
             "no scales": tmp_path / "noscales.json", "non-finite": tmp_path / "nan.json"}
    files["not JSON"].write_text("{'scales':")
    files["no scales"].write_text(json.dumps({"config": {}}))
    files["non-finite"].write_text('{"scales": {"encoder.embed_tokens.weight": NaN}}')
    return files


@pytest.mark.parametrize("case, expected", [
    ("missing", "no such file"), ("not JSON", "not a JSON file"), ("no scales", "has no 'scales'"),
    ("non-finite", "scales that are not finite numbers: ['encoder.embed_tokens.weight']"),
])
def test_bad_init_file_refused_at_parsing(init_files, case, expected, capsys):
    path = init_files[case]
    with pytest.raises(SystemExit) as exc:
        _parse(["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "0",
                "--gradinit-init-file", str(path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"error: argument --gradinit-init-file: {path}: {expected}" in err, err[-600:]


@pytest.mark.parametrize("extra, named", [
    (["--gradinit-iters", "780"], "--gradinit-iters 780"),
    (["--gradinit-eta", "1e-3", "--gradinit-adam-state", "shared"],
     "--gradinit-eta 0.001, --gradinit-adam-state shared"),
    (["--gradinit-scale-bounds", "[('bias', 0, None)]"], "--gradinit-scale-bounds [('bias', 0, None)]"),
])
def test_init_file_with_compute_settings_is_refused(tmp_path, extra, named, capsys):
    """An init file replaces the computation, so settings of the computation are
    refused with it instead of being ignored."""
    path = tmp_path / "gradinit.json"
    path.write_text(json.dumps({"scales": {"encoder.embed_tokens.weight": 0.5}}))
    base = ["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
            "--gradinit-init-file", str(path)]
    with pytest.raises(SystemExit) as exc:
        _parse(base + extra)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert f"error: argument --gradinit-init-file: not allowed with {named}: " in err, err[-600:]
    assert "drop --gradinit-init-file to compute new scales" in err
    # Settings that do not change the computation, or defaults given again, are accepted.
    _parse(base + ["--gradinit-iters", "0", "--gradinit-log-interval", "5", "--gradinit-min-scale", "0.01"])


@pytest.mark.parametrize("scales, expected", [
    ({"encoder.layers.0.fc1.weight": -0.5, "decoder.layers.0.fc2.weight": 1.0},
     "1 negative scales, e.g. ['encoder.layers.0.fc1.weight']"),
    ({"encoder.layers.0.fc1.weight": 0.0, "encoder.layers.0.fc1.bias": 0.0},
     "1 scales of 0 on tensors that are not biases, e.g. ['encoder.layers.0.fc1.weight']"),
])
def test_init_file_with_nonpositive_scales_is_refused(tmp_path, scales, expected, capsys):
    path = tmp_path / "gradinit.json"
    path.write_text(json.dumps({"scales": scales}))
    base = ["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3",
            "--gradinit-init-file", str(path)]
    with pytest.raises(SystemExit) as exc:
        _parse(base)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"error: argument --gradinit-init-file: {path}: {expected}" in err, err[-600:]
    # Biases at 0 are what the authors' bounds ('bias', 0, None) can produce: accepted.
    path.write_text(json.dumps({"scales": {"encoder.layers.0.fc1.weight": 0.3, "encoder.layers.0.fc1.bias": 0.0}}))
    _parse(base)


def test_cli_refusal_is_one_line_without_traceback(tiny_data, tmp_path):
    """The real fairseq-train command: exit status 2 and argparse's one-line error."""
    cmd = [sys.executable, "-m", "fairseq_cli.train", str(tiny_data), "--user-dir", "fairseq_gradinit", *TINY_MODEL,
           "--lr", "1e-3", "--save-dir", str(tmp_path / "ck"), "--gradinit-iters", "4", "--gradinit-eta", "nan"]
    proc = subprocess.run(cmd, cwd=REPO, env=env_with_repo(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "train.py: error: argument --gradinit-eta: invalid value nan: expected a finite number > 0 "
        "(the training learning rate)")
    assert "Traceback" not in proc.stderr and not (tmp_path / "ck").exists()
    # The plugin said once, at load, what it changes in fairseq (fairseq-train logs to stdout).
    assert proc.stdout.count("gradinit: plugin loaded; changes to fairseq:") == 1, proc.stdout[-2000:]
    assert "task 'translation' is served by TranslationGradInitTask" in proc.stdout
    assert "torch.load(weights_only=False)" in proc.stdout


def _train_cfg(argv, **overrides):
    """The config fairseq-train builds from ``argv``, with ``section.key`` overrides."""
    cfg = convert_namespace_to_omegaconf(_parse(argv))
    for key, value in overrides.items():
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, value)
    return cfg


@pytest.mark.parametrize("override, expected", [
    ({"task.gradinit_iters": -5}, "argument --gradinit-iters: invalid value -5"),
    ({"task.gradinit_overlap": 2.0}, "argument --gradinit-overlap: invalid value 2.0"),
    ({"task.gradinit_eta": float("nan")}, "argument --gradinit-eta: invalid value nan"),
])
def test_configs_not_from_the_command_line_are_checked_before_any_work(tiny_data, tmp_path, override, expected):
    """fairseq-hydra-train and Python callers skip the parser: the task stops them before GradInit
    or training, with the same words and no traceback (SystemExit with a message)."""
    from fairseq.distributed import utils as distributed_utils
    from fairseq_cli import train

    save = tmp_path / "ck"
    cfg = _train_cfg(_argv(tiny_data, save, "--gradinit-iters", "3"), **override)
    with pytest.raises(SystemExit) as exc:
        distributed_utils.call_main(cfg, train.main)
    assert str(exc.value.code).startswith("gradinit: error: ") and expected in str(exc.value.code)
    assert not (save / "gradinit.json").exists() and not (save / "checkpoint_last.pt").exists()


# -- 2. resume detection follows fairseq's own rules ----------------------------------------------
class _RecordingTrainer:
    """What fairseq's checkpoint_utils.load_checkpoint asks the Trainer to load; Trainer.load_checkpoint
    loads model weights iff that path is a file."""

    def __init__(self, cfg):
        self.checkpoint_suffix = cfg.checkpoint.checkpoint_suffix or ""
        self.loaded = None

    def load_checkpoint(self, filename, *args, **kwargs):
        self.loaded = filename if os.path.isfile(filename) else None

    def get_train_iterator(self, epoch, **kwargs):
        return type("Itr", (), {"epoch": epoch})()

    def lr_step(self, epoch):
        pass


RESUME_CASES = {
    "fresh": ([], []),
    "checkpoint_last in --save-dir": (["save/checkpoint_last.pt"], []),
    "--restore-file": ([], ["--restore-file", "{o}/ck.pt"]),
    "--restore-file missing": ([], ["--restore-file", "{o}/missing.pt"]),
    "--restore-file with --checkpoint-suffix": (["other-x"], ["--restore-file", "{o}/ck.pt", "--checkpoint-suffix=-x"]),
    "--checkpoint-suffix, only the unsuffixed last": (["save/checkpoint_last.pt"], ["--checkpoint-suffix=-x"]),
    "--checkpoint-suffix": (["save/checkpoint_last-x.pt"], ["--checkpoint-suffix=-x"]),
    "--continue-once": ([], ["--continue-once", "{o}/ck.pt"]),
    "--continue-once, last exists": (["save/checkpoint_last.pt"], ["--continue-once", "{o}/ck.pt"]),
    "--continue-once missing": ([], ["--continue-once", "{o}/missing.pt"]),
    "--finetune-from-model": ([], ["--finetune-from-model", "{o}/ck.pt"]),
    "--finetune-from-model, last exists": (["save/checkpoint_last.pt"], ["--finetune-from-model", "{o}/ck.pt"]),
    "--finetune-from-model missing": ([], ["--finetune-from-model", "{o}/missing.pt"]),
    "--finetune-from-model with --reset-optimizer": ([], ["--finetune-from-model", "{o}/ck.pt", "--reset-optimizer"]),
    "--finetune-from-model with --restore-file": ([], ["--finetune-from-model", "{o}/ck.pt",
                                                       "--restore-file", "{o}/ck.pt"]),
    "all --reset-* flags, last exists": (["save/checkpoint_last.pt"], ["--reset-optimizer", "--reset-lr-scheduler",
                                                                       "--reset-meters", "--reset-dataloader"]),
    "checkpoint_last.pt is a directory": (["save/checkpoint_last.pt/"], []),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_restore_source_is_what_fairseq_loads(tmp_path, case):
    from fairseq import checkpoint_utils

    from fairseq_gradinit.fairseq_plugin.registration.task import restore_source

    files, extra = RESUME_CASES[case]
    other = tmp_path / "other"
    other.mkdir()
    (other / "ck.pt").write_bytes(b"x")
    for f in files:
        if f == "other-x":
            (other / "ck-x.pt").write_bytes(b"x")
        elif f.endswith("/"):
            (tmp_path / f).mkdir(parents=True)
        else:
            (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / f).write_bytes(b"x")
    # with --gradinit-iters, a checkpoint_last.pt that is a folder is refused when parsed
    # (test_checked_before_the_phase.py); fairseq's own reading of it is compared without
    iters = [] if case == "checkpoint_last.pt is a directory" else ["--gradinit-iters", "2"]
    argv = ["data-not-read", "--task", "translation_gradinit", *TINY_MODEL, "--lr", "1e-3", *iters,
            "--save-dir", str(tmp_path / "save"), *[a.format(o=other) for a in extra]]
    cfg = convert_namespace_to_omegaconf(_parse(argv))
    trainer = _RecordingTrainer(cfg)
    try:
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    except ValueError as fairseq_error:
        with pytest.raises(ValueError) as ours:
            restore_source(cfg.task)
        assert str(ours.value) in str(fairseq_error)  # fairseq appends its whole config to one of them
        return
    assert restore_source(cfg.task) == trainer.loaded
    if case in ("fresh", "--restore-file missing", "--continue-once missing", "checkpoint_last.pt is a directory",
                "--checkpoint-suffix, only the unsuffixed last"):
        assert trainer.loaded is None  # the table above is not vacuous: these start fresh
    else:
        assert trainer.loaded is not None


@pytest.fixture(scope="module")
def base_run(tiny_data, tmp_path_factory):
    """One GradInit run (2 iterations, 1 update) whose checkpoint and gradinit.json later tests reuse."""
    save = tmp_path_factory.mktemp("base") / "ck"
    argv = _argv(tiny_data, save, "--gradinit-iters", "2", "--gradinit-log-interval", "1")
    train_inprocess(argv)
    return argv, save


def test_continue_once_loads_the_checkpoint_and_skips_gradinit(base_run, tiny_data, tmp_path, caplog):
    """The reported bug: --continue-once into a new --save-dir ran GradInit for nothing."""
    import torch

    _, base = base_run
    save = tmp_path / "cont"
    caplog.set_level("INFO")
    train_inprocess(_argv(tiny_data, save, "--gradinit-iters", "2", "--continue-once", str(base / "checkpoint_last.pt"),
                          "--max-update", "2"))
    assert "a checkpoint will be restored; not running GradInit" in caplog.text
    assert "gradinit iter" not in caplog.text and not (save / "gradinit.json").exists()
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 2  # continued from update 1 of the base run


# -- 3. an existing gradinit.json is reused by the same run, never overwritten by another ---------
def test_second_run_into_the_same_save_dir_reuses_or_stops(base_run, tmp_path, caplog):
    argv, base = base_run
    save = tmp_path / "ck"
    save.mkdir()
    saved = (base / "gradinit.json").read_text()
    (save / "gradinit.json").write_text(saved)  # as if the first run stopped before its first checkpoint
    argv = [a if a != str(base) else str(save) for a in argv]
    caplog.set_level("INFO")
    train_inprocess(argv)
    assert "its fingerprint matches this run" in caplog.text and "gradinit iter" not in caplog.text
    assert (save / "gradinit.json").read_text() == saved
    import torch

    same = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    first = torch.load(base / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    assert all(torch.equal(same[k], first[k]) for k in first)  # same start, same update

    (save / "checkpoint_last.pt").unlink()
    for extra, says in ((["--seed", "4"], "seed: 3 -> 4"), (["--gradinit-lr", "0.05"], "gradinit.")):
        with pytest.raises(SystemExit) as exc:
            train_inprocess(argv + extra)
        message = str(exc.value.code)
        assert message.startswith("gradinit: error: ") and "written by a different run" in message and says in message
        assert "--gradinit-init-file" in message  # says what to do
        assert (save / "gradinit.json").read_text() == saved and not (save / "checkpoint_last.pt").exists()
    old = json.loads(saved)
    del old["fingerprint"]  # written before fingerprints existed
    (save / "gradinit.json").write_text(json.dumps(old))
    with pytest.raises(SystemExit, match=r"fingerprint \(none recorded\)"):
        train_inprocess(argv)


def test_init_file_for_another_model_is_refused_and_other_seed_warned(base_run, tiny_data, tmp_path, caplog):
    _, base = base_run
    info = json.loads((base / "gradinit.json").read_text())
    wrong = tmp_path / "other-arch.json"
    wrong.write_text(json.dumps({"scales": {"encoder.layers.9.fc1.weight": 0.5, "decoder.foo.weight": 2.0,
                                            **info["scales"]}}))
    with pytest.raises(SystemExit) as exc:
        train_inprocess(_argv(tiny_data, tmp_path / "a", "--gradinit-init-file", str(wrong)))
    message = str(exc.value.code)
    assert "2 of its" in message and "'encoder.layers.9.fc1.weight', 'decoder.foo.weight'" in message
    assert not (tmp_path / "a" / "checkpoint_last.pt").exists()

    caplog.set_level("INFO")
    train_inprocess(_argv(tiny_data, tmp_path / "b", "--gradinit-init-file", str(base / "gradinit.json"),
                          "--seed", "4"))
    assert "WARNING" in caplog.text and "different model, seed or data" in caplog.text and "seed: 3 -> 4" in caplog.text
    assert "applied" in caplog.text and (tmp_path / "b" / "checkpoint_last.pt").exists()


# -- 5. import without surprises ----------------------------------------------------------------------
BLOCK_FAIRSEQ = '''
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "fairseq" or name.startswith(("fairseq.", "fairseq_cli")):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
'''


@pytest.mark.parametrize("how", ["absent", "sys.modules None"])
def test_core_and_vision_import_without_fairseq(how):
    setup = BLOCK_FAIRSEQ if how == "absent" else 'import sys; sys.modules["fairseq"] = None\n'
    code = setup + (
        "import fairseq_gradinit.core, fairseq_gradinit.vision\n"
        "assert 'fairseq_gradinit.fairseq_plugin' not in sys.modules\n"
        "assert sys.modules.get('fairseq') is None\n"
        "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env_with_repo(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


# -- 6. interrupting GradInit ------------------------------------------------------------------------
def test_interrupted_gradinit_stops_cleanly_and_a_rerun_starts_over(tiny_data, tmp_path, caplog):
    """Ctrl-C (SIGINT) and a scheduler's SIGTERM during GradInit: a clear message, exit status
    128+signal, no gradinit.json, no temporary file, no checkpoint; then the same command runs."""
    import signal
    import threading

    procs = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        save = tmp_path / sig.name
        cmd = [sys.executable, "-m", "fairseq_cli.train", str(tiny_data), "--user-dir", "fairseq_gradinit",
               *TINY_MODEL, "--lr", "1e-3", "--max-update", "1", "--save-dir", str(save),
               "--gradinit-iters", "100000", "--gradinit-log-interval", "1", "--gradinit-checkpoint-interval", "0"]
        # SIGINT at its default: a shell without job control starts background jobs with it ignored, and the
        # child would inherit that (a user's Ctrl-C reaches a foreground fairseq-train with the default)
        procs[sig] = (save, subprocess.Popen(cmd, cwd=REPO, env=env_with_repo(), stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True,
                                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)))
    outputs = {}

    def watch(sig, proc):
        lines = []
        for line in proc.stdout:  # send the signal once GradInit has done an iteration
            lines.append(line)
            if "gradinit iter 1/100000" in line:
                proc.send_signal(sig)
        outputs[sig] = "".join(lines)

    threads = [threading.Thread(target=watch, args=(sig, p)) for sig, (_, p) in procs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=400)
    for sig, (save, proc) in procs.items():
        if proc.poll() is None:
            proc.kill()
        out = outputs.get(sig, "")
        assert proc.wait(timeout=60) == 128 + sig, out[-3000:]
        assert f"gradinit: stopped by {sig.name} during iteration" in out and "Run the same command again" in out
        assert "Traceback" not in out
        assert not save.exists() or sorted(p.name for p in save.iterdir()) == []  # nothing, not even a temp file

    # A rerun into the same --save-dir starts cleanly (and clears a temp file a SIGKILL would leave).
    save = procs[signal.SIGTERM][0]
    save.mkdir(exist_ok=True)
    (save / ".gradinit.killed.json").write_text("{")
    caplog.set_level("INFO")
    train_inprocess(_argv(tiny_data, save, "--gradinit-iters", "2"))
    assert json.loads((save / "gradinit.json").read_text())["iterations"] == 2
    assert not (save / ".gradinit.killed.json").exists() and "left by an interrupted run" in caplog.text


# -- ranks: rank 0 decides for all about an existing gradinit.json -----------------------------------
def _two_ranks(tiny_data, save, port):
    cmds = [[sys.executable, "-m", "fairseq_cli.train", *_argv(tiny_data, save, "--gradinit-iters", "2"),
             "--user-dir", str(REPO / "fairseq_gradinit"), "--distributed-world-size", "2",
             "--distributed-rank", str(rank), "--distributed-backend", "gloo",
             "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn",
             "--ddp-backend", "legacy_ddp"] for rank in range(2)]
    return run_ranks(cmds, cwd=save.parent, env=env_with_repo(), timeout=600)


def test_two_ranks_reuse_a_matching_gradinit_json(tiny_data, tmp_path):
    import torch

    save = tmp_path / "ck"
    _two_ranks(tiny_data, save, free_port())
    saved = (save / "gradinit.json").read_text()
    assert json.loads(saved)["fingerprint"]["world_size"] == 2
    first = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    (save / "checkpoint_last.pt").unlink()
    outs = _two_ranks(tiny_data, save, free_port())
    assert "its fingerprint matches this run" in outs[0] and "gradinit iter" not in "".join(outs)
    assert (save / "gradinit.json").read_text() == saved
    again = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    assert all(torch.equal(again[k], first[k]) for k in first)
    # One process into the same --save-dir: another world size, another result.
    (save / "checkpoint_last.pt").unlink()
    with pytest.raises(SystemExit, match="world_size: 2 -> 1"):
        train_inprocess(_argv(tiny_data, save, "--gradinit-iters", "2"))


# -- saved scales are checked wherever they come from; clamp records are not GradInit results -------
@pytest.mark.parametrize("bad, words", [(-1.0, "1 negative scales"), (0.0, "1 scales of 0 on tensors that are not "
                                                                             "biases")])
def test_a_reused_gradinit_json_with_a_scale_no_init_file_may_carry_is_refused(base_run, tmp_path, bad, words):
    argv, base = base_run
    save = tmp_path / "ck"
    save.mkdir()
    saved = json.loads((base / "gradinit.json").read_text())
    saved["scales"]["encoder.layers.0.fc1.weight"] = bad  # its fingerprint still matches this run
    (save / "gradinit.json").write_text(json.dumps(saved))
    with pytest.raises(SystemExit) as exc:
        train_inprocess([a if a != str(base) else str(save) for a in argv])
    message = str(exc.value.code)
    assert message.startswith(f"gradinit: error: {save / 'gradinit.json'} exists but is not a usable GradInit result "
                              f"({words}, e.g. ['encoder.layers.0.fc1.weight']"), message
    assert message.endswith(f"use another --save-dir, or delete {save / 'gradinit.json'} to compute it again")
    assert "\n" not in message and not (save / "checkpoint_last.pt").exists()


def test_a_clamped_record_is_not_a_gradinit_result_and_never_replaces_another(base_run, tiny_data, tmp_path, caplog):
    argv, base = base_run
    source = base / "gradinit.json"
    fingerprint = json.loads(source.read_text())["fingerprint"]
    save = tmp_path / "ck"
    clamp = ["--gradinit-init-file", str(source), "--gradinit-init-clamp", "[('re:.', 0.9, None)]"]
    train_inprocess(_argv(tiny_data, save, *clamp))
    record = json.loads((save / "gradinit.json").read_text())
    assert "fingerprint" not in record and record["clamped_from"]["fingerprint"] == fingerprint
    (save / "checkpoint_last.pt").unlink()  # as if the run stopped before its first checkpoint
    written = (save / "gradinit.json").read_text()

    # a --gradinit-iters run with the source's fingerprint computes; it does not take the clamp for its result
    with pytest.raises(SystemExit) as exc:
        train_inprocess([a if a != str(base) else str(save) for a in argv])
    assert str(exc.value.code).startswith(f"gradinit: error: {save / 'gradinit.json'} exists and holds scales clamped "
                                          f"by --gradinit-init-clamp from {source}, which no GradInit run"), exc.value
    # another clamp into the folder is refused before any work; the same clamp again is the same record
    with pytest.raises(SystemExit) as exc:
        train_inprocess(_argv(tiny_data, save, *clamp[:3], "[('re:.', 0.5, None)]"))
    assert str(exc.value.code) == (
        f"gradinit: error: --gradinit-init-clamp: {save / 'gradinit.json'} exists and holds scales clamped from "
        f"{source} with the bounds [['re:.', 0.9, None]]; the clamped scales of this run are written there and a "
        f"gradinit.json is never overwritten: use another --save-dir, or delete {save / 'gradinit.json'}")
    assert (save / "gradinit.json").read_text() == written and not (save / "checkpoint_last.pt").exists()
    caplog.set_level("INFO")
    train_inprocess(_argv(tiny_data, save, *clamp))
    assert "already holds these clamped scales" in caplog.text and (save / "checkpoint_last.pt").exists()
    # a folder holding GradInit's own result: the clamp does not replace it
    other = tmp_path / "other"
    other.mkdir()
    (other / "gradinit.json").write_text(source.read_text())
    with pytest.raises(SystemExit, match="exists and holds another run's GradInit result"):
        train_inprocess(_argv(tiny_data, other, *clamp))
    assert (other / "gradinit.json").read_text() == source.read_text()


# -- faults of the machine and the save dir: one line, or a warning and the run goes on --------------
def test_a_full_disk_at_the_periodic_phase_state_warns_once_and_the_phase_goes_on(tiny_data, tmp_path, monkeypatch,
                                                                                   caplog):
    import errno

    from fairseq_gradinit.fairseq_plugin.phase import compute as phase

    def disk_full(path, state, fingerprint):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(phase, "save_phase_state", disk_full)
    save = tmp_path / "ck"
    caplog.set_level("INFO")
    train_inprocess(_argv(tiny_data, save, "--gradinit-iters", "4", "--gradinit-checkpoint-interval", "1"))
    assert json.loads((save / "gradinit.json").read_text())["iterations"] == 4
    assert (save / "checkpoint_last.pt").exists()
    warnings = [r.getMessage() for r in caplog.records if "could not save the GradInit phase state" in r.getMessage()]
    assert warnings == [f"gradinit: WARNING: could not save the GradInit phase state {save / 'gradinit.state.pt'} (No "
                        "space left on device) after iteration 1; GradInit goes on, but a stop now can resume only from "
                        "an earlier saved state. Free space (or fix the permissions); this warning is not repeated"]


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_an_unreadable_checkpoint_last_is_one_line(base_run, tmp_path, damage):
    argv, base = base_run
    save = tmp_path / "ck"
    save.mkdir()
    data = (base / "checkpoint_last.pt").read_bytes()
    (save / "checkpoint_last.pt").write_bytes(b"" if damage == "empty" else data[: len(data) // 2])
    with pytest.raises(SystemExit) as exc:
        train_inprocess([a if a != str(base) else str(save) for a in argv])
    message = str(exc.value.code)
    assert message.startswith(f"gradinit: error: cannot resume from {save / 'checkpoint_last.pt'}: it is not a "
                              "readable checkpoint ("), message
    assert message.endswith("it may be truncated (a run stopped while writing it). Move it away to resume from "
                            "another checkpoint (--restore-file) or to start anew") and "\n" not in message
    reason = {"empty": "(EOFError: Ran out of input)",
              "truncated": "(RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central "
                           "directory)"}[damage]
    assert f"readable checkpoint {reason}; it may" in message


def test_an_unstepped_uses_pattern_matching_nothing_stops_when_the_model_is_built(tiny_data, tmp_path, caplog):
    save = tmp_path / "ck"
    caplog.set_level("INFO")
    with pytest.raises(SystemExit) as exc:
        train_inprocess(_argv(tiny_data, save, "--gradinit-iters", "2", "--gradinit-unstepped-uses", "output_proj$"))
    message = str(exc.value.code)
    assert message.startswith("gradinit: error: --gradinit-unstepped-uses 'output_proj$' matches no use of a parameter "
                              "that GradInit steps; give a regular expression (searched in each name) on the names of "
                              "the uses, which here are e.g. ["), message
    # tied uses first: the ones such a pattern is meant for
    assert "which here are e.g. ['encoder.embed_tokens.weight', 'decoder.embed_tokens.weight', " \
           "'decoder.output_projection.weight', " in message
    assert "gradinit iter" not in caplog.text and not (save / "gradinit.json").exists()


def test_a_clamp_cannot_make_a_scale_the_file_check_refuses(tmp_path):
    """The file was checked (scales > 0, biases >= 0) and a clamp's upper bounds are > 0, so clamping
    never gives a negative scale or a zero weight: a bound that would is refused."""
    from torch import nn

    from fairseq_gradinit.fairseq_plugin.settings.init_file import clamped_init_file

    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    path = tmp_path / "gradinit.json"
    saved = {"scales": {"0.weight": 0.5, "0.bias": 0.5, "1.weight": 2.0, "1.bias": 0.0}}
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"max_scale=0 must be None, a number > 0 or inf"):
        clamped_init_file(model, str(path), saved, "[('re:^1\\.weight$', 0, 0)]")
    out = clamped_init_file(model, str(path), saved, "[('re:.', 0, 0.1)]")["scales"]
    assert out == {"0.weight": 0.1, "0.bias": 0.1, "1.weight": 0.1, "1.bias": 0.0}


def test_the_docs_section_on_saved_scales_and_faults_names_tests_that_exist():
    """Each item of docs/reliability.md's section on saved scales, clamp records, work not done and faults
    names the test that checks its words; every test it names exists in a file it names."""
    import re

    doc = (REPO / "docs" / "reliability.md").read_text(encoding="utf-8")
    section = doc.split("## Saved scales, records of clamped scales, work not done, and faults during the run")[1]
    section = section.split("\n## ")[0]
    files = set(re.findall(r"tests/((?:\w+/)?test_\w+\.py)", section))
    named = set(re.findall(r"`(?:tests/(?:\w+/)?test_\w+\.py::)?(test_\w+)`", section))
    named |= set(re.findall(r"\.py::(test_\w+)", section))
    assert files and len(named) >= 10
    sources = "".join((REPO / "tests" / f).read_text(encoding="utf-8") for f in files)
    missing = [n for n in sorted(named) if f"def {n}(" not in sources]
    assert not missing, missing
    items = re.split(r"^- ", section, flags=re.M)[1:]
    assert items and all(re.search(r"^  - test: (`[^\n]*test_\w+|same)", item, flags=re.M) for item in items), items
