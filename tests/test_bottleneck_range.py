"""A bottleneck figure that is a mean says of what, and names the least and the most (stop 44).

On a 2-rank run whose rank 1 is slow, the summary said "GPU idle, 127.7 ms lost per rank (mean of 2)": true of
neither rank (rank 0 idles 20.9 ms, rank 1 234.6 ms). The line now names both; the figures are each GPU's span
less the union of its kernels, copies and memsets, computed here from the raw JSON of each rank.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict

from helpers import FIXTURES, raw_events, run_cli, union, us_to_ns
from traceparse.figures import fmt_ns

RUNS = FIXTURES / "torch" / "multirank"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def idle_by_device(path) -> dict[int, int]:
    """Each GPU's idle time in one raw trace: its span (first start to last end) less the union of its activities."""
    intervals = defaultdict(list)
    for e in raw_events(path):
        if e.get("cat") in GPU_CATS:
            start = us_to_ns(e["ts"])
            intervals[e["pid"]].append((start, start + us_to_ns(e["dur"])))
    out = {}
    for device, spans in intervals.items():
        merged = union(spans)
        out[device] = (merged[-1][1] - merged[0][0]) - sum(e - s for s, e in merged)
    return out


def analyzed(tmp_path, *paths) -> tuple[dict, str]:
    store = str(tmp_path / "store")
    code, out, err = run_cli("--store", store, "-q", "analyze", "--json", *map(str, paths))
    assert code == 0, err
    code, screen, err = run_cli("--store", store, "-q", "--width", "300", "analyze", *map(str, paths))
    assert code == 0, err
    return json.loads(out)["summary"][0], screen


def test_two_ranks_name_both(tmp_path):
    folder = RUNS / "nccl2_slow_rank1"
    idle = {rank: sum(idle_by_device(folder / f"rank{rank}.json.gz").values()) for rank in (0, 1)}
    assert idle[1] > 10 * idle[0]  # the run this test is about: one rank idles ten times as long
    summary, screen = analyzed(tmp_path, folder)
    worst = summary["bottleneck"]
    assert worst["rule"] == "gpu-idle"
    assert worst["range"] == {"parts": 2, "per": "rank", "least_ns": idle[0], "least": "rank 0",
                              "most_ns": idle[1], "most": "rank 1", "least_like": 1, "most_like": 1}
    assert worst["impact_ns"] == round((idle[0] + idle[1]) / 2)
    assert (f"GPU idle, {fmt_ns(worst['impact_ns'])} lost per rank (mean of 2: {fmt_ns(idle[0])} on rank 0, "
            f"{fmt_ns(idle[1])} on rank 1)") in re.sub(r"\s*│\s*", " ", screen)


def test_four_ranks_least_and_most(tmp_path):
    folder = RUNS / "gloo4_slow_rank2"
    idle = {rank: sum(idle_by_device(folder / f"rank{rank}.json.gz").values()) for rank in range(4)}
    summary, screen = analyzed(tmp_path, folder)
    worst = summary["bottleneck"]
    if worst["rule"] != "gpu-idle":  # the case this test is for: the GPUs' idle time is what has most at stake
        raise AssertionError(f"expected gpu-idle as the bottleneck, got {worst}")
    least = min(idle, key=lambda r: (idle[r], r))
    most = max(idle, key=lambda r: (idle[r], -r))
    assert worst["range"] == {"parts": 4, "per": "rank", "least_ns": idle[least], "least": f"rank {least}",
                              "most_ns": idle[most], "most": f"rank {most}", "least_like": 1, "most_like": 1}
    assert (f"lost per rank (mean of 4, from {fmt_ns(idle[least])} on rank {least} to {fmt_ns(idle[most])} on "
            f"rank {most})") in re.sub(r"\s*│\s*", " ", screen)


def test_two_gpus_of_one_trace(tmp_path):
    path = FIXTURES / "torch" / "multigpu" / "dp2_resnet18_bs16.json.gz"
    idle = idle_by_device(path)
    assert sorted(idle) == [0, 1]
    summary, screen = analyzed(tmp_path, path)
    worst = summary["bottleneck"]
    assert worst["rule"] == "gpu-idle"
    least, most = sorted(idle, key=lambda d: idle[d])
    assert worst["range"] == {"parts": 2, "per": "GPU", "least_ns": idle[least], "least": f"GPU {least}",
                              "most_ns": idle[most], "most": f"GPU {most}", "least_like": 1, "most_like": 1}
    assert (f"lost per GPU (mean of 2: {fmt_ns(idle[least])} on GPU {least}, {fmt_ns(idle[most])} on GPU {most})"
            in re.sub(r"\s*│\s*", " ", screen))


def test_the_page_says_it_too(tmp_path):
    folder = RUNS / "nccl2_slow_rank1"
    idle = {rank: sum(idle_by_device(folder / f"rank{rank}.json.gz").values()) for rank in (0, 1)}
    page = tmp_path / "page.html"
    code, out, err = run_cli("--store", str(tmp_path / "store"), "-q", "report", str(folder), "--html", str(page))
    assert code == 0, err
    assert (f"lost per rank (mean of 2: {fmt_ns(idle[0])} on rank 0, {fmt_ns(idle[1])} on rank 1)"
            in page.read_text())


def test_a_stragglers_cost_names_who_waits_most_and_the_straggler(tmp_path):
    """The straggler's cost is the others' wait over every rank ("141.8 ms lost per rank (mean of 4)"): the straggler
    waits nothing and the others up to 192.4 ms. Rank 1 is last at every collective here, so every wait is for it,
    and the range is the table's own "waited" figures."""
    folder = RUNS / "ddp4_slow_loader"
    code, out, err = run_cli("--store", str(tmp_path), "-q", "analyze", "--json", "--rule", "stragglers", str(folder))
    assert code == 0, err
    [finding] = json.loads(out)["findings"]
    ranks = finding["metrics"]["ranks"]
    assert ranks["1"]["last_count"] == finding["metrics"]["collectives"] == 8  # every wait is for rank 1
    waited = {int(r): v["waited_ns"] for r, v in ranks.items()}
    most = max(waited, key=lambda r: waited[r])
    assert finding["impact_ns"] == round(sum(waited.values()) / 4)
    assert finding["impact_range"] == {"parts": 4, "per": "rank", "least_ns": 0, "least": "rank 1",
                                       "most_ns": waited[most], "most": f"rank {most}", "least_like": 1,
                                       "most_like": sum(abs(w - waited[most]) <= max(waited[most] / 1000, 1000)
                                                        for w in waited.values())}


def test_the_page_counts_findings_as_the_terminal_does(tmp_path):
    """The page said "Findings (17: 4 critical, 2 warnings, 11 info)" where the terminal said "4 critical, 2
    warnings, 6 info; 5 rules with nothing to report" of the same findings."""
    folder = RUNS / "ddp4_slow_loader"
    store = str(tmp_path / "store")
    code, screen, err = run_cli("--store", store, "-q", "--width", "300", "analyze", str(folder))
    assert code == 0, err
    counted = re.search(r"findings +(.+? with nothing to report)", screen).group(1)
    page = tmp_path / "page.html"
    code, out, err = run_cli("--store", store, "-q", "report", str(folder), "--html", str(page))
    assert code == 0, err
    assert re.search(r"Findings <span class=\"muted\">\(\d+: " + re.escape(counted) + r"\)", page.read_text())
