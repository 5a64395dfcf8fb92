"""One share, one value on one screen: hotspots' sentence and the summary's "top routines" give each routine's
share as its table does (the shares of one whole rounded so that they add up to 100), not rounded alone: a TAU
profile read "MPI_Init() 97.5%" in the summary above a table row of 97.6% (a sweep of public files, stop 53)."""

from __future__ import annotations

import json
import math

from helpers import FIXTURES, run_cli

CPI = FIXTURES / "tau" / "real" / "cpi-mpi"


def _largest_remainders(values: list[float]) -> list[float]:
    """Percentages to one decimal adding up to 100: floors, then a tenth more to the largest remainders."""
    tenths = [v * 10 for v in values]
    floors = [math.floor(t + 1e-9) for t in tenths]
    for k in sorted(range(len(values)), key=lambda k: (-(tenths[k] - floors[k]), k))[:1000 - sum(floors)]:
        floors[k] += 1
    return [f / 10 for f in floors]


def test_the_summary_and_the_sentence_give_the_tables_shares(store):
    code, out, err = run_cli("analyze", str(CPI), "--rule", "hotspots", "--json")
    assert code == 0, err
    doc = json.loads(out)
    found = next(f for f in doc["findings"] if f["title"] == "Hotspots: routines by exclusive time")
    exact = [i["share_pct"] for i in found["items"]]
    assert abs(sum(exact) - 100) < 1e-6  # every routine listed: the shares of one whole
    shown = _largest_remainders(exact)
    top3 = [(i["name"], s) for i, s in zip(found["items"][:3], shown)]
    assert any(f"{s:.1f}" != f"{round(e, 1):.1f}" for e, s in zip(exact[:3], shown))  # this profile tells them apart
    assert f"leads with {shown[0]:.1f}%" in found["message"]
    code, out, err = run_cli("--width", "250", "analyze", "--rule", "hotspots")
    line = next(l for l in out.splitlines() if "top routines" in l)
    assert ", ".join(f"{name} {share:.1f}%" for name, share in top3) in line
