"""A pytest plugin that fails the run when a test was skipped because something it needs is missing
(fairseq, sentencepiece, a data file): with ``GRADINIT_STRICT_SKIPS=1`` (as CI sets it) such a skip
would otherwise pass a suite that did not test the plugin. Skips for hardware (CUDA), opt-in slow
tests, facts of the installed PyTorch and reasons starting with "optional:" (data a user may install,
e.g. a Debian dataset package) stay allowed."""
import os
import re

ENV = "GRADINIT_STRICT_SKIPS"
MISSING = re.compile(r"could not import|not installed|not found|no such file|missing", re.I)

_offending = []


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _note(report) -> None:
    reason = _reason(report)
    if report.skipped and MISSING.search(reason) and "optional:" not in reason:
        _offending.append(f"{report.nodeid}: {reason}")


def pytest_collectreport(report):
    _note(report)


def pytest_runtest_logreport(report):
    _note(report)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get(ENV) == "1" and _offending:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"{ENV}=1: {len(_offending)} test(s) skipped because something they need is missing:"]
        lines += [f"  {o}" for o in _offending]
        if tr is not None:
            tr.write_line("\n".join(lines), red=True)
        session.exitstatus = 1
