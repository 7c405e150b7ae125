"""CI's strict-skip mode: a test skipped for a missing dependency or file fails the run."""
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/


def run(tmp_path, body, strict):
    (tmp_path / "test_case.py").write_text(body)
    env = dict(os.environ, PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("GRADINIT_STRICT_SKIPS", None)
    if strict:
        env["GRADINIT_STRICT_SKIPS"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "strict_skips", "-p", "no:cacheprovider",
                           str(tmp_path / "test_case.py")], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_a_skip_for_a_missing_package_fails_only_in_strict_mode(tmp_path):
    body = ("import pytest\n\ndef test_x():\n    pytest.importorskip('surely_not_a_module_xyz')\n\n"
            "def test_y():\n    pass\n")
    assert run(tmp_path, body, strict=False).returncode == 0
    r = run(tmp_path, body, strict=True)
    assert r.returncode == 1 and "skipped because something they need is missing" in r.stdout, r.stdout


def test_hardware_skips_are_allowed_in_strict_mode(tmp_path):
    body = "import pytest\n\n@pytest.mark.skipif(True, reason='needs CUDA')\ndef test_x():\n    pass\n"
    r = run(tmp_path, body, strict=True)
    assert r.returncode == 0, r.stdout


def test_optional_data_skips_are_allowed_in_strict_mode(tmp_path):
    body = ("import pytest\n\n@pytest.mark.skipif(True, reason='optional: Debian package x not installed')\n"
            "def test_x():\n    pass\n")
    assert run(tmp_path, body, strict=True).returncode == 0


def test_a_module_skipped_at_collection_fails_in_strict_mode(tmp_path):
    body = "import pytest\npytest.importorskip('surely_not_a_module_xyz')\n\ndef test_x():\n    pass\n"
    r = run(tmp_path, body, strict=True)
    assert r.returncode == 1 and "surely_not_a_module_xyz" in r.stdout, r.stdout
