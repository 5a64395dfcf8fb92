"""No shown figure misleads (sweep 19): a part more than none does not read 0.0%, one short of the whole does not
read 100.0%, and what the screen, JSON and HTML show of one finding agree.

On the nsys capture of ResNet-18 the summary read "DtoH 0.0%" for a copy of 1.536 us of 3.677 ms of GPU time.
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3

from helpers import FIXTURES, run_cli
from traceparse.figures import fmt_pct, shares_shown

NSYS = FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz"


def test_a_share_more_than_none_or_less_than_the_whole_reads_as_a_bound():
    assert [fmt_pct(v) for v in shares_shown([99.97, 0.03, 0.0])] == [">99.9%", "<0.1%", "0.0%"]
    # the bound counts as the 0.0 / 100.0 it rounds to, so the shown shares still add up to 100
    assert shares_shown([99.97, 0.03, 0.0]) == [100.0, 0.0, 0.0]
    assert [fmt_pct(v) for v in shares_shown([81.0, 18.6, 0.3, 0.0877, 0.0123])] == [
        "81.0%", "18.6%", "0.3%", "0.1%", "<0.1%"]
    assert [fmt_pct(v) for v in (0.04, 99.96, 100.0, 0.0, -0.0, -0.02, 0.05, None, float("nan"), float("inf"))] == [
        "<0.1%", ">99.9%", "100.0%", "0.0%", "0.0%", "-<0.1%", "0.1%", "-", "-", "-"]


def _dtoh_share_pct(tmp_path) -> float:
    """DtoH copies' share of the summed GPU activities, straight from the capture's tables."""
    db = tmp_path / "capture.sqlite"
    db.write_bytes(gzip.decompress(NSYS.read_bytes()))
    con = sqlite3.connect(db)
    total = sum(con.execute(f"SELECT SUM(end - start) FROM {t}").fetchone()[0]
                for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))
    dtoh = con.execute("SELECT SUM(end - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 2").fetchone()[0]
    con.close()
    return 100 * dtoh / total  # 1,536 ns of 3,677,136 ns


def test_a_short_copy_reads_under_a_tenth_of_a_percent_not_zero(tmp_path):
    exact = _dtoh_share_pct(tmp_path)
    assert 0 < exact < 0.05
    store = str(tmp_path / "s")
    code, screen, err = run_cli("--store", store, "-q", "--width", "200", "analyze", str(NSYS))
    assert code == 0, err
    line = next(x for x in screen.splitlines() if "summed over activities" in x)
    assert "DtoH <0.1%" in line and "0.0%" not in line
    code, out, err = run_cli("--store", store, "analyze", "--json")
    parts = {p["part"]: p["share_pct"] for p in json.loads(out)["summary"][0]["gpu_time"]["parts"]}
    assert abs(parts["DtoH"] - exact) < 1e-3  # JSON keeps the exact share
    page = tmp_path / "r.html"
    code, _, err = run_cli("--store", store, "-q", "report", "--html", str(page))
    assert code == 0, err
    html = page.read_text()  # copy-dominated's table of the parts of GPU time
    assert re.search(r'<td class="">DtoH</td><td class="num">[\d.]+</td><td class="num">&lt;0\.1%</td>', html)
    assert not re.search(r'<td class="">DtoH</td><td class="num">[\d.]+</td><td class="num">0\.0%</td>', html)


def test_rank_balance_parts_of_the_span_add_up_to_100_as_shown(tmp_path):
    """gloo4_slow_rank2 read "compute 3.5%, comm exposed 0.0%, memcpy 1.6%, idle 95.0% of the span": 100.1."""
    run = FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2"
    store = str(tmp_path / "s")
    code, screen, err = run_cli("--store", store, "-q", "--width", "400", "analyze", str(run), "--rule", "rank-balance")
    assert code == 0, err
    code, out, err = run_cli("--store", store, "analyze", str(run), "--rule", "rank-balance", "--json")
    m = json.loads(out)["findings"][0]["metrics"]
    parts = ("compute", "comm_exposed", "memcpy", "idle")
    assert sum(m[f"{p}_ns"] for p in parts) == m["span_ns"]  # a partition of the span
    exact = {p: 100 * m[f"{p}_ns"] / m["span_ns"] for p in parts}  # 3.453, 0, 1.580, 94.97
    said = re.search(r"Over all ranks: compute (\S+)%, comm exposed (\S+)%, memcpy (\S+)%, idle (\S+)% of the span",
                     " ".join(screen.split()))
    shown = dict(zip(parts, map(float, said.groups())))
    assert shown == {"compute": 3.4, "comm_exposed": 0.0, "memcpy": 1.6, "idle": 95.0}
    assert round(sum(shown.values()), 1) == 100.0 and all(abs(shown[p] - exact[p]) <= 0.1 for p in parts)
