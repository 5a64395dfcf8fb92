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


def _copies(tmp_path):
    """fsdp2_slow_loader's copies, straight from its traces: HtoD 5,155,152 B in 393.632 us; DtoD 24 B in 7.681 us."""
    totals: dict[str, list[float]] = {}
    for path in sorted((FIXTURES / "torch" / "multirank" / "fsdp2_slow_loader").glob("rank*.json.gz")):
        for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]:
            if e.get("cat") == "gpu_memcpy":
                kind = next(k for k in ("HtoD", "DtoH", "DtoD") if k in e["name"])
                t = totals.setdefault(kind, [0, 0.0])
                t[0] += e["args"]["bytes"]
                t[1] += e["dur"]
    return totals


def test_a_tiny_value_in_a_scaled_column_is_not_zero_and_the_page_rounds_as_the_screen(tmp_path):
    """fsdp2's 24 B of DtoD copies read "0.000" in a column of MB on screen and "0.00" on the page; the page wrote
    393.632 us of HtoD copies where the screen wrote 393.6."""
    copies = _copies(tmp_path)
    assert copies["HtoD"][0] == 5_155_152 and round(copies["HtoD"][1], 3) == 393.632 and copies["DtoD"][0] == 24
    run = FIXTURES / "torch" / "multirank" / "fsdp2_slow_loader"
    store = str(tmp_path / "s")
    code, screen, err = run_cli("--store", store, "-q", "--width", "200", "analyze", str(run),
                                "--rule", "low-memcpy-throughput")
    assert code == 0, err
    rows = {m[0]: m[1:] for m in re.findall(r"│  (HtoD|DtoD) │ +(\d+) │ +(\S+) │ +(\S+) │", screen)}
    # bytes in MB and time in us, each to 4 significant figures of the column's largest
    assert rows == {"HtoD": ("90", "5.155", "393.6"), "DtoD": ("6", "<0.001", "7.7")}
    page = tmp_path / "r.html"
    code, _, err = run_cli("--store", store, "-q", "report", str(run), "--rule", "low-memcpy-throughput",
                           "--html", str(page))
    assert code == 0, err
    cells = {m[0]: m[1:] for m in re.findall(r'<td class="">(HtoD|DtoD)</td><td class="num">(\d+)</td>'
                                             r'<td class="num">([^<]+)</td><td class="num">([^<]+)</td>',
                                             page.read_text())}
    assert cells == {"HtoD": ("90", "5.155", "393.6"), "DtoD": ("6", "&lt;0.001", "7.7")}


def test_a_column_of_plain_numbers_reads_on_the_page_as_on_the_screen(tmp_path):
    """tuning-candidates' scores of the TAU multi-cupti profiles: the screen rounds the column to the decimals of
    its largest (2,500,062: none), so winograd_3x3_kernel's 181.89 (1,200,500 ns × 0.00015152 warps per
    instruction) reads 182; the page rounded each cell alone and wrote 181.9."""
    multi = FIXTURES / "tau" / "handwritten" / "multi-cupti"
    store = str(tmp_path / "s")
    code, screen, err = run_cli("--store", store, "-q", "--width", "200", "analyze", str(multi),
                                "--rule", "tuning-candidates")
    assert code == 0, err
    on_screen = re.findall(r"│  winograd_3x3_kernel │ (\w+) +│ +(\S+) │ +(\S+) │ +(\S+) ", screen)
    assert on_screen[0] == ("warps_per_inst", "0.0001520", "1.200", "182")
    page = tmp_path / "r.html"
    code, _, err = run_cli("--store", store, "-q", "report", "--rule", "tuning-candidates", "--html", str(page))
    assert code == 0, err
    on_page = re.findall(r'<td class="">winograd_3x3_kernel</td><td class="">(\w+)</td><td class="num">([^<]+)</td>'
                         r'<td class="num">([^<]+)</td><td class="num">([^<]+)</td>', page.read_text())
    assert on_page == on_screen


def test_a_change_in_percent_has_no_sign_on_zero_and_no_zero_for_a_change():
    """diff wrote "(±0 ns, +0.0%)" for no change and "-0.0%" for a change of -0.04%."""
    from traceparse_plugins.commands.diff import _pct

    assert [_pct(v) for v in (0.0, 0, 0.04, -0.04, 55.6, -2.54, None)] == [
        "±0.0%", "±0.0%", "+<0.1%", "-<0.1%", "+55.6%", "-2.5%", "-"]


def test_a_slow_copy_rate_keeps_its_significant_figures(tmp_path):
    """24 B of DtoD copies in 7.681 us is 0.003125 GB/s: rounded to 4 decimals it was kept as 0.0031, which reads
    "0.003100 GB/s" (and read "0.00 GB/s" in low-memcpy-throughput's sentence)."""
    copies = _copies(tmp_path)
    rate = copies["DtoD"][0] / (copies["DtoD"][1] * 1e3)  # bytes per ns: GB/s
    assert f"{rate:.4g}" == "0.003125"
    run = FIXTURES / "torch" / "multirank" / "fsdp2_slow_loader"
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "-q", "analyze", str(run), "--rule", "low-memcpy-throughput", "--json")
    assert code == 0, err
    finding = json.loads(out)["findings"][0]
    dtod = next(i for i in finding["items"] if i["copy_kind"] == "DtoD")
    assert dtod["achieved_gbps"] == 0.003125
    assert ("Device-to-device copies: 0.003125 GB/s, <0.1% of the DRAM bandwidth, 3,350 GB/s"
            in " ".join(finding["message"].split()))
    page = tmp_path / "r.html"
    code, _, err = run_cli("--store", store, "-q", "report", str(run), "--rule", "low-memcpy-throughput",
                           "--html", str(page))
    assert code == 0, err
    assert "Device-to-device copies: 0.003125 GB/s, &lt;0.1% of the DRAM bandwidth" in page.read_text()


def test_tuning_candidates_say_what_a_score_is_and_its_unit(tmp_path):
    """"(value 0.019048, score 28572.609524)": six decimals, no unit, no definition, beside a table that read
    0.01905× and 28,573 (a metric's value is a rate, not a multiple: no ×, stop 53). A score is a time in ns
    (time × value, time ÷ value for ipc): said so, as the table rounds it. relu_kernel: 1,500,062 ns × 0.0190476
    warps/inst (test_tau_rules computes these from the profiles) = 28,572.6 ns."""
    multi = FIXTURES / "tau" / "handwritten" / "multi-cupti"
    store = str(tmp_path / "s")
    code, screen, err = run_cli("--store", store, "-q", "--width", "200", "analyze", str(multi),
                                "--rule", "tuning-candidates")
    assert code == 0, err
    said = " ".join(screen.replace("│", " ").split())
    assert ("Top candidates by warps_per_inst: 'relu_kernel' (value 0.01905, score 28,573 ns); gmem_per_inst: "
            "'relu_kernel' (value 0.4000, score 600,025 ns);") in said
    assert ("A score is the routine's time in ns weighted by the metric: time × value, or time ÷ value where more "
            "is better (ipc).") in said
    assert re.search(r"┃ time \(ms\) ┃ score \(ns\)", screen)
    assert re.search(r"│  relu_kernel +│ warps_per_inst │ +0\.01905 │ +1\.500 │ +28,573 ", screen)


def test_what_to_pass_is_said_as_the_user_passes_it(tmp_path):
    """A notebook was told "pass --gpu NAME", "check --gpu", "(from --gpu)" and "--set ...": flags it has no way
    to give. Python is told the keyword (gpu=, settings=), the command line the flag."""
    import traceparse
    from helpers import read_torch, run_rule
    from traceparse.catalog import gpu_for_trace
    from traceparse.errors import command_line
    from traceparse.meta import Device, TraceMeta
    from traceparse.trace import Trace

    unnamed = Trace(None, TraceMeta(devices=[Device(id=0, sm_count=133, compute_capability="9.0")]))
    assert gpu_for_trace(unnamed)[1] == "the trace does not name its GPU; pass gpu=NAME"
    with command_line():
        assert gpu_for_trace(unnamed)[1] == "the trace does not name its GPU; pass --gpu NAME"

    resnet = FIXTURES / "torch" / "resnet18_bs8.json.gz"  # 9.634 MB of host copies at 51 GB/s: above 1 GB/s
    python = run_rule(read_torch(resnet), "low-memcpy-throughput", "low-memcpy-throughput.host_link_gbps=1").message
    assert python.endswith('no share of its peak is given: pass gpu=NAME or settings={"low-memcpy-throughput": '
                           '{"host_link_gbps": GBPS}}.')
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(resnet), "--json", "--rule",
                             "low-memcpy-throughput", "--set", "low-memcpy-throughput.host_link_gbps=1")
    assert code == 0, err
    assert json.loads(out)["findings"][0]["message"].endswith(
        "no share of its peak is given: pass --gpu NAME or --set low-memcpy-throughput.host_link_gbps=GBPS.")

    vgg = FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv"  # an H100's kernels against a T4's roofs: above them
    (finding,) = traceparse.analyze(traceparse.load(str(vgg)), rules="arithmetic-intensity", gpu="T4")
    assert "the peak figures do not fit the GPU that ran them; check gpu=. GPU: T4 (from gpu=)." in finding.message
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(vgg), "--json", "--rule",
                             "arithmetic-intensity", "--gpu", "T4")
    assert code in (0, 1), err
    assert ("the peak figures do not fit the GPU that ran them; check --gpu. GPU: T4 (from --gpu)."
            in json.loads(out)["findings"][0]["message"])


def test_compare_bars_say_a_share_more_than_none(tmp_path):
    """compare's bars wrote each figure with {pct:6.1f}: 0.04% of the kernel time with two kernels read "0.0"."""
    from traceparse_plugins.commands.compare import bar

    assert [bar(v).plain[6:] for v in (0.04, 0.0, 59.6, 99.97, 100.0)] == [
        "  <0.1", "   0.0", "  59.6", " >99.9", " 100.0"]


def test_a_change_under_a_tenth_of_a_percent_below_none_keeps_its_sign_in_a_column():
    """A column of percentages (whatif's gain %) rounded -0.03 to -0.0 before writing it, which read "0.0%"."""
    from traceparse.report import _format_column
    from traceparse.verdict import Column

    assert [fmt_pct(v) for v in shares_shown([-0.03, 5.0, 0.0])] == ["-<0.1%", "5.0%", "0.0%"]
    assert _format_column(Column("gain_pct", "gain %", "pct"), [-0.03, 48.3, 0.0])[1] == ["-<0.1%", "48.3%", "0.0%"]


def test_a_trace_in_a_notebook_counts_its_events_with_separators():
    """"<Trace a5bae5806774aa42 torch 4499 events>", where ingest and every other count read 4,499."""
    import traceparse

    raw = json.loads(gzip.decompress((FIXTURES / "torch" / "resnet18_bs8.json.gz").read_bytes()))["traceEvents"]
    trace = traceparse.load(str(FIXTURES / "torch" / "resnet18_bs8.json.gz"))
    assert trace.events.height == 4_499 and len(raw) > 4_499  # (its metadata and flow events are not events)
    assert repr(trace) == f"<Trace {trace.meta.id} torch 4,499 events>"


def test_the_roofline_command_gives_the_whole_as_analyze_does(tmp_path):
    """roofline's total read "AI 52.4 FLOP/B" where analyze's arithmetic-intensity read 52.35 (three significant
    figures, not four), and a total past 9,999 GFLOP read "1.234e+04 GFLOP"."""
    from traceparse_plugins.commands.roofline import _g

    vgg = FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv"
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "roofline", "--json", str(vgg))
    assert code == 0, err
    total = json.loads(out)["total"]
    ai = total["flops"] / total["dram_bytes"]
    assert f"{ai:.2f}" == "52.35"
    code, screen, err = run_cli("--store", store, "-q", "--width", "200", "roofline", str(vgg))
    assert code == 0, err
    assert "; AI 52.35 FLOP/B, 66,407 GFLOP/s, memory-bound at 37.9% of the roof" in screen
    code, out, err = run_cli("--store", store, "analyze", "--json", "--rule", "arithmetic-intensity", str(vgg))
    assert "= 52.35 FLOP/byte in 11.16 ms, 66,407 GFLOP/s." in json.loads(out)["findings"][0]["message"]
    assert _g(12_345e9, 1e9, "GFLOP") == "12,345 GFLOP" and _g(None, 1e9) == "-"


def test_compare_page_and_screen_show_one_sweep_alike(tmp_path):
    """The AlexNet sweep: two kernels overlap for 0.0119% of bs32's kernel time and 0.0197% of bs64's; the bars
    and the page read 0.0. The page wrote the GPU spans as 14.610 ms where the screen wrote 14.61."""
    sweep = [str(FIXTURES / "torch" / f"alexnet_bs{b}.json.gz") for b in (4, 8, 16, 32, 64)]
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "-q", "compare", "--json", *sweep)
    assert code == 0, err
    exact = {r["label"]: r["metrics"] for r in json.loads(out)["rows"]}
    assert 0 < exact["alexnet_bs32.json.gz"]["concurrency_pct"] < 0.05
    assert 0 < exact["alexnet_bs64.json.gz"]["concurrency_pct"] < 0.05
    page = tmp_path / "c.html"
    code, screen, err = run_cli("--store", store, "-q", "--width", "200", "compare", *sweep, "--out", str(page))
    assert code == 0, err
    figures = screen.split("rule figures")[1].split("share of kernel time")[0]
    bars = dict(re.findall(r"(alexnet_bs\d+\.json\.gz) +\S+ +(\S+) +[█▏▎▍▌▋▊▉ ]*\d", figures))
    assert bars["alexnet_bs32.json.gz"] == bars["alexnet_bs64.json.gz"] == "<0.1"
    assert bars["alexnet_bs16.json.gz"] == "0.0"
    spans = dict(re.findall(r"(alexnet_bs\d+\.json\.gz) +│ +([\d.]+) │", screen.split("GPU and API time")[1]))
    assert spans["alexnet_bs16.json.gz"] == f"{exact['alexnet_bs16.json.gz']['span_ns'] / 1e6:.2f}" == "14.61"
    rows = {r[0]: r[1:] for r in re.findall(r"<tr><td>(alexnet_bs\d+\.json\.gz)</td><td>([^<]*)</td><td>([^<]*)</td>"
                                           r"<td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>",
                                           page.read_text())}
    assert rows["alexnet_bs16.json.gz"][2] == "14.61" and rows["alexnet_bs32.json.gz"][4] == "&lt;0.1"
    assert all(rows[label][2] == spans[label] for label in spans)


def test_arithmetic_intensity_reads_in_flop_per_byte_not_as_a_ratio(tmp_path):
    """ResNet-18's derived roofline: the sentence said "59.64 FLOP/byte", the figure beside it "arithmetic
    intensity 59.64×" and the table's FLOP/byte column "189.1×": × marks a dimensionless ratio, which FLOP per
    byte is not."""
    trace = FIXTURES / "torch" / "resnet18_bs8.json.gz"
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "analyze", "--json", "--rule", "arithmetic-intensity", str(trace))
    assert code == 0, err
    (finding,) = json.loads(out)["findings"]
    m = finding["metrics"]
    assert f"{m['flops'] / m['dram_bytes']:.2f}" == "59.64" and "= 59.64 FLOP/byte" in finding["message"]
    assert finding["figures"]["arithmetic_intensity"] == finding["figures"]["ridge_ai"] == "flop_per_byte"
    code, screen, err = run_cli("--store", store, "-q", "--width", "200", "analyze", "--rule",
                                "arithmetic-intensity", str(trace))
    assert code == 0, err
    assert "×" not in screen.split("bound")[0].split("GPU: H100 SXM")[-1]  # the figures under the sentence
    rows = re.findall(r"│ +([\d.,]+) │ +[\d,]+ │ +(?:[\d.]+%|-) │ (?:compute|memory)", screen)
    assert rows and "0.7500" in rows and not any("×" in r for r in rows)
    page = tmp_path / "r.html"
    code, _, err = run_cli("--store", store, "-q", "report", "--rule", "arithmetic-intensity", "--html", str(page))
    assert code == 0, err
    html = page.read_text()
    assert "<span>arithmetic intensity</span><span>59.64 FLOP/byte</span>" in html
    assert '<td class="num">0.7500</td>' in html and '<td class="num">0.7500×</td>' not in html


def test_chart_hovers_say_a_share_more_than_none():
    """The charts' hovers wrote shares with plotly's %{y:.1f}%: a bin busy for 0.02% of its width read "busy
    0.0%", one busy for 99.97% "busy 100.0%"."""
    import plotly.graph_objects as go

    from traceparse_plugins.commands.report.charts import names_chart, timeline_chart

    busy = [0.02, 50.0, 0.0, 99.97]
    tl = {"x_ms": [0.0, 1.0, 2.0, 3.0], "width_ns": 1_000_000, "members": [{"label": "GPU 0", "busy_pct": busy}]}
    (line,) = timeline_chart(go, tl).figure.data
    assert list(line.customdata) == ["<0.1%", "50.0%", "0.0%", ">99.9%"] and "busy %{customdata}" in line.hovertemplate
    many = {**tl, "members": [{"label": f"GPU {i}", "busy_pct": busy} for i in range(12)]}
    (heat,) = timeline_chart(go, many).figure.data
    assert [list(row) for row in heat.customdata][0] == ["<0.1%", "50.0%", "0.0%", ">99.9%"]
    names = {"names": [{"name": "big", "time_ns": 9_999_000, "calls": 1}, {"name": "tiny", "time_ns": 1_000,
                                                                          "calls": 1}],
             "total_ns": 10_000_000, "rest_names": 0, "rest_ns": 0}
    (bars,) = names_chart(go, names).figure.data
    assert [row[1] for row in bars.customdata] == ["<0.1%", ">99.9%"]  # longest on top: listed last


def test_a_bound_survives_a_pickle_and_a_copy():
    import copy
    import pickle

    (bound,) = [v for v in shares_shown([99.97, 0.03]) if v == 0]
    for again in (pickle.loads(pickle.dumps(bound)), copy.deepcopy(bound), copy.copy(bound)):
        assert again == 0.0 and fmt_pct(again) == "<0.1%"


def test_a_gpus_memory_reads_alike_in_the_device_line_and_the_memory_finding(tmp_path):
    """The H200 capture: its device line said "140 GiB" and memory's sentence "of 139.801 GiB" for one
    capacity (and "peak allocated 0.233 GiB" for 238 MiB): both are fmt_bytes_binary's now."""
    amp = FIXTURES / "torch" / "acceptance" / "amp_stack_loader_h200.json.gz"
    (props,) = json.loads(gzip.decompress(amp.read_bytes()))["deviceProperties"]
    capacity = f"{props['totalGlobalMem'] / 2**30:.1f} GiB"
    assert capacity == "139.8 GiB"
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "--width", "200", "ingest", str(amp))
    assert code == 0, err
    assert re.search(rf"device 0 +NVIDIA H200, sm 9\.0, 132 SMs, {capacity} ", out)
    code, out, err = run_cli("--store", store, "analyze", "--json", "--rule", "memory")
    message = json.loads(out)["findings"][0]["message"]
    assert f"of {capacity})" in message and "peak allocated 238.2 MiB, peak reserved 356.0 MiB" in message
