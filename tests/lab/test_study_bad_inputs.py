"""The study's own options and its arms file: a value it cannot use (a budget that is not a finite
number, an arms file that is missing, a folder, not UTF-8, an arm name too long for a folder) is one
``error:`` line and exit status 2 before anything runs, never a traceback or a study that never ends.
docs/reliability.md ("Malformed files and values")."""
import pytest

pytest.importorskip("fairseq")

from lab.study import cli as study_cli  # noqa: E402
from lab.study import runner as study_runner  # noqa: E402
from lab.study.arms import Arm  # noqa: E402


def _main(tmp_path, monkeypatch, *extra):
    monkeypatch.setattr(study_runner, "run_jobs", lambda *a, **k: pytest.fail("a job was started"))
    (tmp_path / "bin").mkdir(exist_ok=True)
    return study_cli.main([str(tmp_path / "bin"), "--out", str(tmp_path / "out"), "--cpu", "--no-bleu", *extra])


@pytest.mark.parametrize("extra, expected", [
    (["--time-budget", "nan"], "--time-budget must be positive and finite (minutes), got nan; leave it out for no limit"),
    (["--time-budget", "inf"], "--time-budget must be positive and finite (minutes), got inf; leave it out for no limit"),
    (["--finish-margin", "inf"], "--finish-margin must be a finite number of seconds, got inf"),
])
def test_a_budget_that_is_not_a_finite_number_is_refused(tmp_path, monkeypatch, capsys, extra, expected):
    code = _main(tmp_path, monkeypatch, "--arm", "x=--seed 2", *extra)
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines()[-1] == f"error: {expected}", err
    assert not (tmp_path / "out").exists()


def test_an_arms_file_that_cannot_be_read_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "missing.txt"
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"a=--seed 2\nb=--lr caf\xe9\n")
    cases = [
        (missing, f"error: --arms-file {missing}: cannot read it (No such file or directory); give a text file "
                  "of arms, one NAME[@DATA]=ARGS per line"),
        (tmp_path, f"error: --arms-file {tmp_path}: cannot read it (Is a directory); give a text file of arms, "
                   "one NAME[@DATA]=ARGS per line"),
        (latin1, f"error: --arms-file {latin1}, line 2: byte 0xe9 at byte 11 of the line is not UTF-8; the arms "
                 "file must be UTF-8 text"),
    ]
    for path, expected in cases:
        code = _main(tmp_path, monkeypatch, "--arms-file", str(path))
        err = capsys.readouterr().err
        assert code == 2 and err.strip().splitlines() == [expected], err
    assert not (tmp_path / "out").exists()


def test_an_arm_name_too_long_for_its_folder_is_refused(tmp_path, monkeypatch, capsys):
    name = "a" * 300
    code = _main(tmp_path, monkeypatch, "--arm", f"{name}=--seed 2")
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        f"error: arm name {'a' * 40}... is 300 characters long; use at most 128 (it names the arm's folder, and a "
        "file name has at most 255 bytes)"], err
    assert Arm("a" * 128).name == "a" * 128  # the longest name allowed
