"""A rank is named slowest, longest or notable only where it differs by more than noise (sweep 10).

On a 64-rank run whose spans differ by 1 ns, ``ingest`` listed ranks 0, 1 and 3 as "notable: longest span" at
the median's 151.7 ms; rank-balance called rank 8 the slowest at imbalance 1.000×; the bottleneck ended "to
150.4 ms on rank 7" where 63 ranks waited as long. A difference within 0.1% (or 1 us) is no difference.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from helpers import FIXTURES, REPO, run_cli
from plugins.commands.core.store import _spread, notable_ranks
from traceparse.figures import fmt_ns
from traceparse.report import _rest_row, mean_of
from traceparse.run import impact_range
from traceparse.verdict import Column

GLOO4 = FIXTURES / "torch" / "multirank" / "gloo4_balanced"
#: The shared 4-rank samples (whole traces: the fixtures' are trimmed to kernels and collectives).
SHARED = REPO.parent / "shared" / "samples" / "multirank" / "gloo4_resnet18_bs16"


def meta(span_ns: int, events: int = 10_443) -> SimpleNamespace:
    return SimpleNamespace(summary={"span_ns": span_ns}, event_count=events, warnings=[])


def test_a_nanosecond_over_the_median_is_not_notable():
    metas = {r: meta(151_734_363) for r in range(64)}
    for r in (0, 1, 3):
        metas[r] = meta(151_734_364)
    assert notable_ranks(metas) == {}
    assert _spread([m.summary["span_ns"] for m in metas.values()], fmt_ns, 1_000) == "151.7 ms each (within 0.1%)"
    metas[5] = meta(631_734_363)  # the slow rank of `make_ranks.py --slow-rank 5`
    assert notable_ranks(metas) == {5: "longest span"}


def test_ingest_says_no_rank_stands_out(tmp_path):
    """24 skewed copies of one rank: the panel names none of them (it named three at the median's span)."""
    out = tmp_path / "r24"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_ranks.py"), str(GLOO4 / "rank0.json.gz"),
                    str(out), "--ranks", "24", "--skew-us", "50000"], check=True, capture_output=True)
    code, screen, err = run_cli("--store", str(tmp_path / "s"), "--width", "200", "ingest", str(out))
    assert code == 0, err
    spans = []
    for path in sorted(out.glob("rank*.json.gz")):
        events = [e for e in json.load(gzip.open(path))["traceEvents"] if "ts" in e]
        spans.append(max(e["ts"] + e.get("dur", 0) for e in events) - min(e["ts"] for e in events))
    assert max(spans) - min(spans) < 0.001 * max(spans)  # the run this test is about: spans alike but for noise
    assert "notable        none: every rank's span and event count alike (within 0.1%)" in screen
    assert "longest span" not in screen


def test_the_bottleneck_counts_the_ranks_that_tie():
    waited = [(0, "rank 5")] + [(150_447_000 + (r % 3), f"rank {r}") for r in range(64) if r != 5]
    spread = impact_range(waited, "rank")
    assert (spread["least_like"], spread["most_like"]) == (1, 63)
    assert mean_of(spread, 64) == " per rank (mean of 64, from 0 ns on rank 5 to 150.4 ms on 63 ranks)"
    alike = impact_range([(1_000_000 + r, f"rank {r}") for r in range(8)], "rank")
    assert mean_of(alike, 8) == " per rank (mean of 8)"


def test_rank_balance_names_no_slowest_rank_of_equal_work(tmp_path):
    """make_ranks.py's slow rank is slow on the host: its GPU does the same work, so no rank is the slowest."""
    out = tmp_path / "r4"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_ranks.py"), str(GLOO4 / "rank0.json.gz"),
                    str(out), "--ranks", "4", "--slow-rank", "2"], check=True, capture_output=True)
    code, doc, err = run_cli("--store", str(tmp_path / "s"), "-q", "analyze", "--json", "--rule", "rank-balance",
                             str(out))
    assert code == 0, err
    [f] = json.loads(doc)["findings"]
    work = [v["work_ns"] for v in f["metrics"]["ranks"].values()]
    assert max(work) - min(work) <= max(work) / 1000
    assert (f["metrics"]["slowest_rank"], f["metrics"]["fastest_rank"]) == (None, None)
    assert f["message"].startswith(f"4 ranks: the same work on each, {fmt_ns(max(work))} of compute and copies "
                                   "(within 0.1%; a rank slower on the host than on its GPU is the stragglers "
                                   "rule's); imbalance (max/mean work) 1")


def test_counts_have_thousands_separators():
    from plugins.commands.whatif import edit_line

    assert _rest_row("stream", [Column("n", "n", "count")], [{"n": i} for i in range(3320)])["stream"] == \
        "(3,320 more, max)"
    edit = {"edit": "--drop x", "calls": 13928, "calls_in_steps": 3928, "step_windows": 1200, "ranks": [],
            "removed_per_step_by_rank": {"-": 1_000}}
    assert edit_line(edit) == ("--drop x: 3,928 events in 1,200 steps (13,928 in the whole trace), 1 us less work "
                               "per step")


def test_durations_of_a_thousand_seconds_have_thousands_separators():
    """"6122 s in all" beside "3,320 more": a duration of 1,000 s or more has separators as counts do (prose,
    --json's message text; the tables' cells already had them), and still rolls over at the unit's edge."""
    assert [fmt_ns(ns) for ns in (6_122 * 10**9, 6_122_400_000_000, 1_234_567 * 10**9, -6_122 * 10**9, 999.9996e9,
                                  999.96e6, 1.5e9, 12_000)] == \
        ["6,122 s", "6,122 s", "1,234,567 s", "-6,122 s", "1,000 s", "1 s", "1.5 s", "12 us"]


def test_launch_stats_keeps_its_sort_key_at_80_columns(tmp_path):
    """The items are sorted by delay: with a rank column, 80 columns dropped the delay and named "kernel" (the
    kernel's time) as not shown beside the kernel names' column of the same label."""
    if not SHARED.is_dir():
        pytest.skip("shared multirank samples not present")
    code, screen, err = run_cli("--store", str(tmp_path / "s"), "-q", "--width", "80", "analyze", "--rule",
                                "launch-stats", str(SHARED))
    assert code == 0, err
    header = " ".join(line for line in screen.splitlines() if "┃" in line)
    assert re.search(r"\bdelay\b", header)
    shown = {"rank", "kernel", "launched by", "delay", "launch"}
    note = re.search(r"not shown at this width: ([^)]*)\)", screen).group(1)
    assert not shown & {c.strip() for c in note.split(",")}


def cut_to_steps(source, target, keep: int) -> None:
    """``source`` (a torch.profiler rank trace) with its first ``keep`` ProfilerStep#N windows only: events that
    start after the last kept step's end dropped."""
    doc = json.load(gzip.open(source))
    steps = [e for e in doc["traceEvents"] if re.fullmatch(r"ProfilerStep#\d+", str(e.get("name", "")))]
    kept = sorted({int(e["name"].split("#")[1]) for e in steps})[:keep]
    end = max(e["ts"] + e["dur"] for e in steps if int(e["name"].split("#")[1]) in kept)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if "ts" not in e or float(e["ts"]) <= end]
    with gzip.open(target, "wt") as f:
        json.dump(doc, f)


def test_whatif_says_how_many_steps_each_rank_has(tmp_path):
    """Ranks of 3, 2, 1 and 3 steps: the header said "(3 steps × 4 ranks)" over 9 windows, and --balance "0 names,
    no time in the steps" where no name exceeds the median rank's by 1% of a step."""
    if not SHARED.is_dir():
        pytest.skip("shared multirank samples not present")
    run = tmp_path / "uneven"
    run.mkdir()
    for rank, keep in enumerate((3, 2, 1, 3)):
        cut_to_steps(SHARED / f"rank{rank}.json.gz", run / f"rank{rank}.json.gz", keep)
    store = str(tmp_path / "s")
    code, doc, err = run_cli("--store", store, "-q", "whatif", "--json", "--balance", str(run))
    assert code == 0, err
    doc = json.loads(doc)
    assert sorted(r["steps"] for r in doc["ranks"]) == [1, 2, 3, 3] and len(doc["steps"]) == 9
    assert doc["edits"][0]["calls"] == 0
    code, screen, err = run_cli("--store", store, "-q", "--width", "200", "whatif", "--balance", str(run))
    assert code == 0, err
    assert "(9 step windows over 4 ranks, 1 to 3 steps each)" in screen
    assert ("--balance: nothing to even out: no rank spends 1% of its mean step or more longer than the median "
            "rank in any name") in screen


def test_large_byte_counts_take_a_larger_unit_and_separators():
    """The roofline of 8 ranks read "dram 11901 GB" beside "11,901 GB" in its message; 999.96 GB read "1000.0 GB"."""
    from traceparse.figures import fmt_bytes, fmt_bytes_binary

    assert fmt_bytes(11_901e9) == "11.90 TB"
    assert fmt_bytes(999.96e9) == "1.000 TB" and fmt_bytes(999.94e9) == "999.9 GB"
    assert fmt_bytes(1.5e15) == "1,500 TB" and fmt_bytes(2_500) == "2.500 kB" and fmt_bytes(12) == "12 B"
    assert fmt_bytes_binary(3 * 2 ** 40) == "3.000 TiB" and fmt_bytes_binary(1023.99 * 2 ** 20) == "1.000 GiB"


def test_shares_of_one_whole_add_up_to_100_as_shown():
    """Six parts of one whole each rounded alone read 99.8% (dp2's GPU time); four read 100.1% (api-share's
    classes): shown to one decimal they add up to 100, each within 0.1 of its exact value; any other list (a
    top-N, not a whole) is rounded alone."""
    from traceparse.figures import shares_shown

    assert shares_shown([65.2541, 15.2769, 3.0104, 16.4586, 0.0]) == [65.2, 15.3, 3.0, 16.5, 0.0]
    assert shares_shown([97.74, 2.17, 0.09]) == [97.7, 2.2, 0.1]
    assert shares_shown([51.04, 12.04, None, "-"]) == [51.0, 12.0, None, "-"]  # not a whole: alone
    assert shares_shown([33.3333, 33.3333, 33.3334]) == [33.3, 33.3, 33.4]


def test_parts_of_parts_add_up_to_their_group_as_shown():
    """Calls within their classes: each group's parts add up to the group's share as shown, a group of one part
    reads as the group does, a part under 0.05 reads "<0.1" (a Bound of 0.0), and shares already shown are not
    rounded again (7.7 * 10 is 77.00000000000001 in floats)."""
    from traceparse.figures import Bound, shares_shown, shares_within

    groups = {"memset": 1.6, "launch": 88.2, "other": 10.2}
    shown = shares_within([1.55, 73.05, 15.097, 0.04, 10.16, 0.103], ["memset", "launch", "launch", "launch",
                                                                      "other", "other"], groups)
    assert shown == [1.6, 73.1, 15.1, 0.0, 10.1, 0.1] and isinstance(shown[3], Bound) and shown[3].said == "<0.1"
    assert shares_within([2.5, None], ["x", "x"], {}) == [2.5, None]  # no group figure: alone
    assert shares_shown([7.7, 57.3, 35.0]) == [7.7, 57.3, 35.0]


def test_the_summary_and_api_share_show_shares_that_add_up_to_100(tmp_path):
    sample = SHARED.parent.parent / "torch" / "dp2_resnet18_bs16.json.gz"
    if not sample.is_file():
        pytest.skip("shared samples not present")
    store = str(tmp_path / "s")
    code, screen, err = run_cli("--store", store, "-q", "--width", "200", "analyze", str(sample))
    assert code == 0, err
    code, out, err = run_cli("--store", store, "analyze", str(sample), "--json", "--rule", "api-share")
    doc = json.loads(out)
    line = next(x for x in screen.splitlines() if "summed over activities" in x)
    # a part more than none shown as <0.1% counts as 0.0, one short of the whole as >99.9% as 100.0
    bounds = {"<0.1": 0.0, ">99.9": 100.0}
    shown = {p: bounds.get(v) if v in bounds else float(v)
             for p, v in re.findall(r"(\w+) (<0\.1|>99\.9|\d+\.\d)%", line.split("activities:")[1])}
    exact = {p["part"]: p["share_pct"] for p in doc["summary"][0]["gpu_time"]["parts"]}
    # each part "<0.1%" stands for up to 0.1: the others add up to 100 less at most that much
    tiny = sum(1 for _, v in re.findall(r"(\w+) (<0\.1)%", line.split("activities:")[1]))
    assert set(shown) == set(exact) and 100.0 - 0.1 * tiny - 1e-9 <= round(sum(shown.values()), 1) <= 100.0
    assert all(abs(shown[p] - exact[p]) <= 0.1 for p in exact)
    classes = doc["findings"][0]["metrics"]["classes"]
    table = {c: float(v) for c, v in re.findall(r"│  (\w+) +│ +[\d,]+ │ +[\d.]+ │ +(\d+\.\d)%", screen)
             if c in classes}
    assert set(table) == set(classes) and round(sum(table.values()), 1) == 100.0
    # the headline figure, where shown, as the table shows it
    launch = re.search(r"(?<!graph )launch share +(\d+\.\d)%", screen)
    assert launch is None or float(launch.group(1)) == table["launch"]
    assert f"launch {table['launch']}%" in " ".join(screen.split())  # the sentence says it as the table does


def test_gpu_idles_reasons_read_the_same_in_the_sentence_and_the_figures(tmp_path):
    """The real 4-rank DDP run's idle time: the sentence said "other 1.5%" (rounded with host and kernel wait so
    that they add up to 100) and the figures "other wait 1.4%" (rounded alone). One share, one value."""
    import traceparse
    from traceparse.report import shown_figures

    run = traceparse.load(FIXTURES / "torch" / "multirank" / "ddp4_slow_loader", store=tmp_path / "s")
    (idle,) = [f for f in traceparse.analyze(run, rules=["gpu-idle"]) if f.rule == "gpu-idle"]
    shown = dict(shown_figures(idle))
    said = dict(re.findall(r"(host wait|kernel wait|other) (\d+\.\d)%", idle.message))
    figures = {label: shown[label] for label in ("host wait", "kernel wait", "other wait") if label in shown}
    assert round(sum(float(v) for v in said.values()), 1) == 100.0
    for label, value in figures.items():
        assert value == said[label.replace(" wait", "") if label == "other wait" else label] + "%"


def test_a_share_too_small_to_show_takes_no_tenth_from_the_others():
    """thrust2D's nvprof log (MD_native): API classes of 476.30, 421.04, 112.27, 89.19 and 0.41 ms in 1,099.22 ms.
    The shares were rounded so that the shown ones add up to 100 with "other" (0.037%) counted as 0: the
    synchronize class's 43.33% read 43.4%, beside 476.30 / 1,099.22 = 43.33 that a reader works out. "<0.1%"
    stands for up to 0.1, so each share now reads its nearest; without such a part they still add up to 100."""
    from traceparse.figures import fmt_pct, shares_shown

    times = [476.30, 421.04, 112.27, 89.19, 0.41]
    exact = [100 * t / sum(times) for t in times]
    assert [fmt_pct(v) for v in shares_shown(exact)] == ["43.3%", "38.3%", "10.2%", "8.1%", "<0.1%"]
    assert [round(v, 1) for v in exact[:4]] == [43.3, 38.3, 10.2, 8.1]  # each to its nearest
    # no part too small to show: they add up to 100, the largest remainders rounded up (97.74, 2.17, 0.09)
    assert [fmt_pct(v) for v in shares_shown([97.74, 2.17, 0.09])] == ["97.7%", "2.2%", "0.1%"]
    assert round(sum(shares_shown([100 / 3] * 3)), 9) == 100.0
