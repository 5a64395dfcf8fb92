"""Reading an Nsight Systems report file (``.nsys-rep``; ``.qdrep`` before 2021.4) through its SQLite export.

The report format is private to Nsight Systems; its own ``nsys export
--type sqlite`` turns it into the SQLite export
:mod:`~traceparse_plugins.readers.nsys.sqlite_export` reads. The ``nsys``
used is ``$TRACEPARSE_NSYS`` if set, else the first ``nsys`` on ``PATH``;
without one the reader stops with a one-line error saying how to export the
file by hand.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions
from traceparse.trace import Trace

from traceparse_plugins.readers.nsys.sqlite_export import read_sqlite

#: Seconds ``nsys export`` may take before it is stopped.
EXPORT_TIMEOUT_S = 3600
#: First bytes of an .nsys-rep / .qdrep file.
MAGIC = b"NVIDIA Tegra Profiler Report"


def find_nsys(path: Path) -> str:
    """The ``nsys`` executable to export with; a one-line error naming what to do when there is none."""
    configured = os.environ.get("TRACEPARSE_NSYS")
    if configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            return configured
        raise bad_input(path, None, f"TRACEPARSE_NSYS={configured} is not an executable nsys")
    found = shutil.which("nsys")
    if found:
        return found
    raise bad_input(path, None, "reading an Nsight Systems report needs nsys (not found on PATH; set "
                                f"TRACEPARSE_NSYS to it), or export it first: nsys export --type sqlite {path} "
                                "and ingest the .sqlite it writes")


def read_report(path: Path, options: ReadOptions) -> Trace:
    """Export ``path`` to SQLite in a temporary directory with nsys, then read the export."""
    nsys = find_nsys(path)
    workdir = tempfile.TemporaryDirectory(prefix="traceparse-nsys-rep-")
    out = Path(workdir.name) / "export.sqlite"
    command = [nsys, "export", "--type", "sqlite", "--output", str(out), str(path)]
    timeout = int(options.params.get("nsys_export_timeout_s", EXPORT_TIMEOUT_S))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        workdir.cleanup()
        raise bad_input(path, None, f"nsys export took longer than {timeout} s and was stopped") from None
    except OSError as exc:
        workdir.cleanup()
        raise bad_input(path, None, f"cannot run {nsys}: {exc}") from None
    if done.returncode != 0 or not out.is_file():
        workdir.cleanup()
        said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        reason = said[-1] if said else f"exit status {done.returncode}"
        raise bad_input(path, None, f"nsys export failed: {reason[:200]}")
    options.progress(path.stat().st_size)
    trace = read_sqlite(out, options, source=path, owned=workdir)
    trace.meta.extra["exported_with"] = nsys
    return trace
