"""A pytest plugin that writes each test's result as it finishes, for runs that may be cut off.

pytest prints failure names and durations only at the end of a session; a run on a
machine with a hard time limit can be killed before that. With this plugin every
finished test appends one line, ``outcome  seconds  nodeid``, to $FLASHTILE_REPORT, and
every failure's traceback to $FLASHTILE_REPORT.failures:

    FLASHTILE_REPORT=out/report.tsv python -m pytest -p tools.stream_report -n 16 tests/

Under pytest-xdist only the controller writes (the workers' reports reach it), so
lines never interleave.
"""

from __future__ import annotations

import os


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("FLASHTILE_REPORT")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if report.when != "call" and not report.failed:
        return  # setup/teardown lines only when they fail (a fixture error, say)
    outcome = report.outcome if report.when == "call" else f"{report.outcome}-{report.when}"
    with open(path, "a") as f:
        f.write(f"{outcome}\t{report.duration:.1f}\t{report.nodeid}\n")
    if report.failed:
        with open(path + ".failures", "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[-4000:]}\n\n")
