"""The ncu reader on real Nsight Compute output (fixtures/ncu, ../shared/samples/ncu) and hand-written older layouts.

Expected figures are computed here from the files with the csv module and
Python's decimal, independently of the reader.
"""

from __future__ import annotations

import csv
import lzma
import math
import os
import re
import shutil
import sys
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import run_cli
from traceparse.errors import InputError
from traceparse.ingest import read_paths

NCU = Path(__file__).resolve().parent.parent / "fixtures" / "ncu"
HAND = NCU / "handwritten"
#: ns per unit, for the units these files use
TIME_NS = {"ns": 1, "nsecond": 1, "us": 1000, "usecond": 1000, "ms": 10**6, "msecond": 10**6}


def raw_rows(path: Path) -> tuple[list[str], list[str], list[list[str]]]:
    """Header, units row and kernel rows of a raw page, read with the csv module."""
    rows = [r for r in csv.reader(open(path, newline="")) if len(r) > 1]
    return rows[0], rows[1], [r for r in rows[2:] if r[0].isdigit()]


def number(text: str) -> Decimal:
    return Decimal(text.replace(",", ""))


def events(path) -> tuple[pl.DataFrame, pl.DataFrame, object]:
    trace = read_paths([path])[0]
    e = trace.events
    return e.filter(pl.col("kind") == "kernel"), e.filter(pl.col("kind") == "counter"), trace


# -- raw page ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ncu_raw_vgg11_bs16.csv", "ncu_raw_vgg13_bs16.csv", "ncu_raw_vgg19_bs16.csv",
                                  "ncu_vgg11_bs16_rep_raw.csv", "ncu_llama_h200_rep_raw.csv"])
def test_raw_page_kernels_match_the_csv(name):
    header, units, rows = raw_rows(NCU / name)
    ix = {h: i for i, h in enumerate(header)}
    kernels, counters, trace = events(NCU / name)
    assert trace.meta.format == "ncu" and trace.meta.variant == "csv raw page"
    assert kernels.height == len(rows)
    assert kernels["name"].to_list() == [r[ix["Kernel Name"]] for r in rows]
    unit = units[ix["gpu__time_duration.sum"]]
    assert kernels["duration_ns"].to_list() == [int(number(r[ix["gpu__time_duration.sum"]]) * TIME_NS[unit])
                                                for r in rows]
    assert kernels["registers_per_thread"].to_list() == [int(number(r[ix["launch__registers_per_thread"]]))
                                                         for r in rows]
    grids = [tuple(int(x) for x in re.findall(r"\d+", r[ix["Grid Size"]])) for r in rows]
    assert list(zip(kernels["grid_x"], kernels["grid_y"], kernels["grid_z"])) == grids
    assert kernels["stream_id"].to_list() == [int(r[ix["Stream"]]) for r in rows]
    assert kernels["start_ns"].null_count() == kernels.height
    # every numeric metric cell that is not a device attribute is one counter, linked to its kernel
    metric_cols = [i for i, h in enumerate(header)
                   if i > ix["CC"] and not h.startswith(("device__attribute_", "derived_tempMetric"))]
    expected = sum(1 for r in rows for i in metric_cols
                   if re.fullmatch(r"-?[\d,]+(\.\d+)?", r[i].strip()))
    assert counters.height == expected
    assert set(counters["parent_id"].to_list()) == set(kernels["event_id"].to_list())


def test_raw_page_bytes_are_exact_and_in_base_units():
    header, units, rows = raw_rows(NCU / "ncu_raw_vgg11_bs16.csv")
    ix = {h: i for i, h in enumerate(header)}
    kernels, counters, _ = events(NCU / "ncu_raw_vgg11_bs16.csv")
    assert units[ix["dram__bytes_read.sum"]] == "byte"
    got = counters.filter(pl.col("name") == "dram__bytes_read.sum").sort("parent_id")
    assert got["value"].to_list() == [float(number(r[ix["dram__bytes_read.sum"]])) for r in rows]
    assert set(got["unit"].to_list()) == {"byte"}
    clock = counters.filter(pl.col("name") == "sm__cycles_elapsed.avg.per_second")
    assert set(clock["unit"].to_list()) == {"hz"}


def test_raw_page_device_comes_from_the_device_attributes():
    header, _, rows = raw_rows(NCU / "ncu_raw_vgg11_bs16.csv")
    ix = {h: i for i, h in enumerate(header)}
    _, counters, trace = events(NCU / "ncu_raw_vgg11_bs16.csv")
    (device,) = trace.meta.devices
    first = rows[0]
    assert device.id == 0
    assert device.name == first[ix["device__attribute_display_name"]] == "NVIDIA H100 80GB HBM3"
    assert device.sm_count == int(number(first[ix["device__attribute_multiprocessor_count"]]))
    assert device.memory_bytes == int(number(first[ix["device__attribute_total_memory"]]))
    assert device.compute_capability == "9.0"
    assert device.core_clock_mhz == int(number(first[ix["device__attribute_max_gpu_frequency_khz"]])) / 1000
    assert not counters.filter(pl.col("name").str.starts_with("device__attribute_")).height


def test_shared_raw_sample(samples_dir):
    path = samples_dir / "ncu" / "ncu_raw_resnet18_bs16.csv"
    header, units, rows = raw_rows(path)
    ix = {h: i for i, h in enumerate(header)}
    kernels, counters, trace = events(path)
    assert kernels.height == len(rows) == 372
    assert kernels["duration_ns"].sum() == sum(int(number(r[ix["gpu__time_duration.sum"]])) for r in rows)
    hfma = counters.filter(pl.col("name") == "sm__sass_thread_inst_executed_op_hfma_pred_on.sum")
    assert hfma["value"].sum() == float(sum(number(r[ix["sm__sass_thread_inst_executed_op_hfma_pred_on.sum"]])
                                            for r in rows))


# -- details page -----------------------------------------------------------------------------
def details_rows(path: Path) -> list[dict]:
    rows = [r for r in csv.reader(open(path, newline="")) if len(r) > 1]
    header = rows[0]
    return [dict(zip(header, r + [""] * (len(header) - len(r)))) for r in rows[1:]]


@pytest.mark.parametrize("where", ["fixture", "sample"])
def test_details_page(where, request):
    if where == "fixture":
        path = NCU / "ncu_details_vgg11_bs16.csv"
    else:
        path = request.getfixturevalue("samples_dir") / "ncu" / "ncu_details_alexnet_bs16.csv"
    rows = details_rows(path)
    kernels, counters, trace = events(path)
    ids = list(dict.fromkeys(r["ID"] for r in rows))
    assert trace.meta.variant == "csv details page"
    assert kernels.height == len(ids)
    durations = {r["ID"]: int(number(r["Metric Value"]) * TIME_NS[r["Metric Unit"]])
                 for r in rows if r["Metric Name"] == "Duration"}
    assert kernels["duration_ns"].to_list() == [durations[i] for i in ids]
    regs = {r["ID"]: int(number(r["Metric Value"])) for r in rows if r["Metric Name"] == "Registers Per Thread"}
    assert kernels["registers_per_thread"].to_list() == [regs[i] for i in ids]
    rule_rows = [r for r in rows if r["Rule Name"] and not r["Metric Name"]]
    rules = counters.filter(pl.col("group") == "rule")
    assert rules.height == len(rule_rows) > 0
    assert sorted(rules["name"].unique().to_list()) == sorted({"rule:" + r["Rule Name"] for r in rule_rows})
    with_speedup = [float(r["Estimated Speedup"]) for r in rule_rows if r["Estimated Speedup"]]
    assert sorted(rules["value"].drop_nulls().to_list()) == sorted(with_speedup)
    assert set(rules["unit"].to_list()) == {"%"}
    text_values = sum(1 for r in rows if r["Metric Name"] and not re.fullmatch(r"[\d,.]+", r["Metric Value"]))
    assert counters.height == len(rule_rows) + sum(1 for r in rows if r["Metric Name"]) - text_values
    sol = counters.filter(pl.col("name") == "Memory Throughput")
    assert set(sol["group"].to_list()) == {"GPU Speed Of Light Throughput"}
    (device,) = trace.meta.devices
    assert device.compute_capability == "9.0" and device.sm_count == 132 and device.name is None
    assert "ncu_rules" in trace.meta.extra


# -- plain text ---------------------------------------------------------------------------------
def test_text_output_fixture():
    path = NCU / "ncu_sol_vgg11_bs16.txt"
    text = path.read_text()
    kernels, counters, trace = events(path)
    lines = re.findall(r"^  (\S.*) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context", text, re.M)
    durations = [int(Decimal(v) * TIME_NS[u]) for u, v in re.findall(r"^    Duration\s+(\S+)\s+([\d.,]+)$", text, re.M)]
    assert trace.meta.variant == "text" and kernels.height == len(lines) == 5
    assert kernels["name"].to_list() == [m[0] for m in lines]
    assert kernels["grid_y"].to_list() == [int(m[2]) for m in lines]
    assert kernels["block_x"].to_list() == [int(m[4]) for m in lines]
    assert kernels["duration_ns"].to_list() == durations
    assert kernels["pid"].to_list() == [2083] * 5
    table_rows = len(re.findall(r"^    \S.*\s(Ghz|cycle|%|us)\s+[\d.,]+$", text, re.M))
    rules = counters.filter(pl.col("group") == "rule")
    assert counters.height - rules.height == table_rows == 50
    assert rules.height == len(re.findall(r"^    (OPT|INF|WRN)   ", text, re.M)) == 5
    freq = counters.filter(pl.col("name") == "SM Frequency")["value"].to_list()
    assert freq[0] == 1.59e9


def test_text_output_with_estimated_speedup():
    _, counters, _ = events(HAND / "text_2024_speedup.txt")
    rules = counters.filter(pl.col("group") == "rule").sort("parent_id")
    assert rules.select("name", "value").rows() == [("rule:GPU Speed Of Light Throughput", None),
                                                    ("rule:Occupancy (local)", 13.11)]


def test_text_output_of_every_section_keeps_every_rule_result_and_its_kind():
    """Real `ncu --set full` text (fixtures/make_ncu_text_fixtures.sh, ncu 2025.3, an H200): two results of one
    section are separated by a `----- -----` line, which was taken for a table and swallowed the second result;
    ncu prints global estimates as plain `Est. Speedup` and local ones as `Est. Local Speedup`."""
    path = NCU / "ncu_full_vgg11_bs16.txt"
    text = path.read_text()
    results = re.findall(r"^    (OPT|INF|WRN|ERR) +(Est\. (Local )?Speedup: ([0-9.]+)%)?", text, re.M)
    assert len(results) == 28 and text.count("\n    ----- ---") == 2
    kernels, counters, trace = events(path)
    rules = counters.filter(pl.col("group") == "rule").sort("event_id")
    assert kernels.height == 4 and rules.height == len(results)
    assert rules["value"].to_list() == [float(r[3]) if r[3] else None for r in results]
    local = rules.filter(pl.col("name").str.ends_with(" (local)"))["value"].to_list()
    assert local == [float(r[3]) for r in results if r[2]] and len(local) == 4
    kinds = {name: info["speedup_types"] for name, info in trace.meta.extra["ncu_rules"].items()}
    assert kinds["Occupancy (local)"] == ["local"] and kinds["Occupancy"] == ["global"]
    assert all(len(k) <= 1 for k in kinds.values())
    # each rule's result types counted from the text, in name order (stored metadata is the same each ingest)
    types = {name: info["types"] for name, info in trace.meta.extra["ncu_rules"].items()}
    assert all(list(t) == sorted(t) for t in types.values())
    assert sum(sum(t.values()) for t in types.values()) == len(results)
    assert sum(t.get("OPT", 0) for t in types.values()) == sum(r[0] == "OPT" for r in results)


def test_text_output_of_2020_versions():
    kernels, counters, trace = events(HAND / "text_2020_kernel_time.txt")
    assert kernels.select("name", "duration_ns", "stream_id", "registers_per_thread").rows() == [
        ("vectorAdd(float const*, float const*, float*, int)", 8160, 7, 16)]
    values = dict(counters.select("name", "value").rows())
    assert values["Shared Memory Configuration Size"] == 65540.0  # 65.54 Kbyte
    assert values["DRAM Frequency"] == 5e9                          # 5.00 cycle/nsecond
    assert values["Grid Size"] == 196.0
    assert counters.filter(pl.col("group") == "rule").height == 1


# -- older CSV layouts and units --------------------------------------------------------------------
def test_details_page_of_2020_with_scaled_units():
    kernels, counters, trace = events(HAND / "details_2020_kernel_time.csv")
    assert kernels.select("name", "duration_ns", "registers_per_thread", "static_smem_bytes").rows() == [
        ("cuda_initialize_variables(int, float*, float*)", 8580, 16, 1020),
        ("cuda_compute_step_factor(int, float*, float*, float*)", 1250000, 32, 0)]
    first = dict(counters.filter(pl.col("parent_id") == 0).select("name", "value").rows())
    units = dict(counters.filter(pl.col("parent_id") == 0).select("name", "unit").rows())
    assert first["SM Frequency"] == 1.365e9 and units["SM Frequency"] == "hz"
    assert first["Memory Throughput"] == 72.06e9 and units["Memory Throughput"] == "byte/s"
    assert first["Elapsed Cycles"] == 11733
    assert "Mem Busy" not in first          # n/a: not a value
    assert "L2 Transactions" not in first   # instanced: skipped, with a warning
    assert any("1 instanced metric values" in w for w in trace.meta.warnings)
    assert kernels["grid_x"].null_count() == 2  # a scalar "Grid Size" is not a grid shape


def test_raw_page_of_2021_with_scaled_units():
    kernels, counters, _ = events(HAND / "raw_2021_scaled_units.csv")
    assert kernels["duration_ns"].to_list() == [12350, 12510]
    reads = counters.filter(pl.col("name") == "dram__bytes_read.sum")["value"].to_list()
    writes = counters.filter(pl.col("name") == "dram__bytes_write.sum")["value"].to_list()
    assert reads == [8_390_000.0, 8_390_000.0] and writes == [4_194_300.0, 4_194_560.0]
    assert counters.filter(pl.col("name") == "sm__cycles_elapsed.avg.per_second")["value"].to_list() == [1.41e9] * 2


# -- bad and truncated input ------------------------------------------------------------------------
def test_csv_that_is_not_ncu_output(tmp_path, store):
    path = tmp_path / "x.csv"
    path.write_text('"a","b"\n"1","2"\n')
    code, _, err = run_cli("ingest", "--format", "ncu", str(path))
    assert code == 2
    assert err == (f"traceparse: error: {path}: not Nsight Compute CSV output: no header row starting "
                   '"ID",...,"Kernel Name" (expected the output of ncu --csv or ncu --csv --page raw)\n')
    assert not any(store.rglob("*.parquet"))


def test_raw_page_without_units_row(tmp_path, store):
    lines = (NCU / "ncu_raw_vgg11_bs16.csv").read_text().splitlines(keepends=True)
    header_at = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    path = tmp_path / "nounits.csv"
    path.write_text("".join(lines[:header_at + 1] + lines[header_at + 2: header_at + 5]))
    code, _, err = run_cli("ingest", "--format", "ncu", str(path))
    assert code == 2
    assert err == (f"traceparse: error: {path}:{header_at + 2}: raw page without its units row: the row under the "
                   "header must hold the metric units (an empty ID cell), found ID '0'; export with ncu --csv "
                   "--page raw, which writes the units row\n")


def test_metric_value_that_is_not_a_number(tmp_path, store):
    header, units, rows = raw_rows(NCU / "ncu_raw_vgg11_bs16.csv")
    col = header.index("dram__bytes_write.sum")
    rows[1][col] = "12,3x4"
    path = tmp_path / "bad.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerows([header, units] + rows[:3])
    code, _, err = run_cli("ingest", str(path))
    assert code == 2
    assert err == f"traceparse: error: {path}:4: metric 'dram__bytes_write.sum' (byte): value '12,3x4' is not a number\n"


def test_truncated_raw_page_keeps_the_complete_kernels(tmp_path):
    text = (NCU / "ncu_raw_vgg11_bs16.csv").read_text()
    lines = text.splitlines(keepends=True)
    header_at = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    cut = lines[header_at + 2 + 7]  # the 8th kernel's row, cut in the middle of a field
    path = tmp_path / "cut.csv"
    path.write_text("".join(lines[: header_at + 2 + 7]) + cut[: len(cut) // 2])
    trace = read_paths([path])[0]
    assert trace.events.filter(pl.col("kind") == "kernel").height == 7
    assert any("ends" in w and "7 complete kernels" in w for w in trace.meta.warnings)


# -- .ncu-rep ----------------------------------------------------------------------------------------
def test_ncu_rep_without_ncu_report(tmp_path, monkeypatch, store):
    from traceparse_plugins.readers.ncu import report_form

    monkeypatch.setitem(sys.modules, "ncu_report", None)
    monkeypatch.setattr(report_form, "INSTALL_GLOBS", ())
    monkeypatch.delenv("TRACEPARSE_NCU_PYTHON", raising=False)
    path = tmp_path / "prof.ncu-rep"
    with lzma.open(NCU / "ncu_vgg11_bs16.ncu-rep.xz") as src, open(path, "wb") as dst:
        dst.write(src.read(4096))
    code, _, err = run_cli("ingest", str(path))
    assert code == 2
    assert err == (f"traceparse: error: {path}: reading .ncu-rep files needs NVIDIA's ncu_report Python module: "
                   "pip install 'traceparse[ncu]' (or set TRACEPARSE_NCU_PYTHON to Nsight Compute's extras/python "
                   f"folder), or export it with: ncu --import {path} --csv --page raw > prof_raw.csv\n")


#: Base units per unit the raw CSV export prints (it scales: us, Kbyte, Ghz ...). ncu scales the number and puts
#: the prefix on the unit's byte (or hz) part wherever it is: 1164 %/byte prints as 1.164 %/Kbyte.
CSV_PREFIX = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
CSV_TIME_NS = {"ns": 1, "us": 10**3, "ms": 10**6, "s": 10**9}
CSV_HZ = {"hz": 1, "khz": 10**3, "mhz": 10**6, "ghz": 10**9}


def csv_scale(unit: str) -> Decimal:
    """The factor that brings a value in ncu's CSV ``unit`` to traceparse's base units, worked out here on its own:
    times to ns, frequencies to Hz, SI-prefixed counts to counts, a count per time unit to a count per second."""
    def simple(u: str) -> Decimal:
        if u in CSV_TIME_NS:
            return Decimal(CSV_TIME_NS[u])
        if u.lower() in CSV_HZ:
            return Decimal(CSV_HZ[u.lower()])
        if len(u) > 1 and u[0] in CSV_PREFIX and u[1:].islower():  # Kbyte, Mbyte, Gsector...
            return Decimal(CSV_PREFIX[u[0]])
        return Decimal(1)
    top, slash, bottom = unit.partition("/")
    if not slash:
        return simple(top)
    if bottom in CSV_TIME_NS:  # a rate: per second
        return simple(top) * Decimal(10**9) / Decimal(CSV_TIME_NS[bottom])
    # a prefix under the line is ncu's display scaling of the value (1164 %/byte is printed 1.164 %/Kbyte)
    return simple(top) * simple(bottom)


def real_ncu_report():
    """NVIDIA's ncu_report (the ncu extra); skipped without it, unless $TRACEPARSE_REQUIRE_NCU_REPORT (.ci/run)."""
    try:
        import ncu_report
    except ImportError:
        if os.environ.get("TRACEPARSE_REQUIRE_NCU_REPORT"):
            raise
        pytest.skip("ncu_report is not installed: pip install 'traceparse[ncu]'")
    return ncu_report


@pytest.mark.parametrize("name, device, n_kernels", [
    ("ncu_vgg11_bs16", "NVIDIA H100 80GB HBM3", 5),
    # a second report, other GPU and workload (fixtures/make_acceptance_captures.py's eager bf16 Llama-like model,
    # `ncu --set full -s 200 -c 12` on an H200): ncu 2025.3.1 writes "no data" and the units "branches", "sectors"
    ("ncu_llama_h200", "NVIDIA H200", 12),
])
def test_ncu_rep_through_the_real_ncu_report(tmp_path, name, device, n_kernels):
    """The committed report read through NVIDIA's ncu_report gives the figures of ncu's own CSV export of it
    (fixtures/ncu/README.md: ``ncu --import NAME.ncu-rep --csv --page raw``): the same kernels with
    the same launch figures, the same metrics, each value equal to the CSV's to the digits the CSV prints."""
    module = real_ncu_report()
    csv_path = NCU / f"{name}_rep_raw.csv"
    path = tmp_path / f"{name}.ncu-rep"
    with lzma.open(NCU / f"{name}.ncu-rep.xz") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    header, units, rows = raw_rows(csv_path)
    ix = {h: i for i, h in enumerate(header)}
    kernels, counters, trace = events(path)
    assert trace.meta.variant == "ncu-rep" and trace.meta.devices[0].name == device
    assert kernels.height == len(rows) == n_kernels
    value = lambda r, name: number(r[ix[name]]) * csv_scale(units[ix[name]])  # noqa: E731 - in base units
    assert kernels["duration_ns"].to_list() == [int(value(r, "gpu__time_duration.sum")) for r in rows]
    for column, metric in (("grid_x", "launch__grid_dim_x"), ("grid_y", "launch__grid_dim_y"),
                           ("block_x", "launch__block_dim_x"), ("registers_per_thread", "launch__registers_per_thread"),
                           ("dynamic_smem_bytes", "launch__shared_mem_per_block_dynamic")):
        assert kernels[column].to_list() == [int(value(r, metric)) for r in rows], column
    # kernel names: the module demangles on its own (its templates read "(int)128" where ncu 2025.3 wrote "128");
    # the function name is the same
    report = module.load_report(str(path)).range_by_idx(0)
    for i, r in enumerate(rows):
        function = report.action_by_idx(i).name(module.IAction.NameBase_FUNCTION)
        assert function in kernels["name"][i] and function in r[ix["Kernel Name"]]
    # every metric of the CSV, and no other, with its value
    got = {(k, n): v for k, n, v in counters.select("parent_id", "name", "value").iter_rows()}
    ids = kernels["event_id"].to_list()
    expected = {}
    for i, r in enumerate(rows):
        for name in header[ix["CC"] + 1:]:  # the metric columns follow ncu's fixed launch columns
            if name.startswith(("device__attribute_", "derived_tempMetric")) or not r[ix[name]]:
                continue
            text = r[ix[name]].replace(",", "")
            if not re.fullmatch(r"-?\d+(\.\d+)?", text):
                continue  # a text metric (a name, "No-CC")
            expected[(ids[i], name)] = (Decimal(text), csv_scale(units[ix[name]]), len(text.partition(".")[2]))
    assert set(got) == set(expected)
    for key, (shown, scale, decimals) in expected.items():
        tolerance = max(Decimal(5) * Decimal(10) ** -(decimals + 1) * scale,  # half a unit of the last digit printed
                        Decimal(math.ulp(float(shown * scale))))  # or a double's own step, past 2**53
        assert abs(Decimal(repr(got[key])) - shown * scale) <= tolerance, key


def test_sniffing_picks_ncu_for_each_form(tmp_path):
    from traceparse.ingest import detect_reader
    from traceparse.plugins import registry

    for path in (NCU / "ncu_raw_vgg11_bs16.csv", NCU / "ncu_details_vgg11_bs16.csv", NCU / "ncu_sol_vgg11_bs16.txt",
                 HAND / "text_2020_kernel_time.txt", HAND / "raw_2021_scaled_units.csv"):
        assert detect_reader(path, registry()).name == "ncu", path
    rep = tmp_path / "r.bin"
    with lzma.open(NCU / "ncu_vgg11_bs16.ncu-rep.xz") as src:
        rep.write_bytes(src.read(64))
    assert detect_reader(rep, registry()).name == "ncu"
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(InputError):
        detect_reader(other, registry())


def test_values_ncu_could_not_collect_are_left_out(tmp_path):
    """ncu marks a metric it could not collect '(!) nan' (a launch that failed: ncu 2023.2 on an RTX 40x0, a
    course project's report): the whole file was refused at the first such value."""
    text = (NCU / "ncu_sol_vgg11_bs16.txt").read_text()
    line = next(l for l in text.splitlines() if l.strip().startswith("DRAM Frequency"))
    value = line.split()[-1]
    path = tmp_path / "failed.txt"
    path.write_text(text.replace(line, line[: len(line) - len(value)] + "(!) nan", 1))
    whole = events(NCU / "ncu_sol_vgg11_bs16.txt")
    kernels, counters, trace = events(path)
    assert kernels.height == whole[0].height
    assert counters.height == whole[1].height - 1
    assert [w for w in trace.meta.warnings if "(!)" in w] == [
        f"{path}: 1 metric values marked '(!)' by ncu (not collected, e.g. '(!) nan' for 'DRAM Frequency') were "
        "left out"]


def test_print_summary_per_kernel_text():
    """Real `ncu --print-summary per-kernel` text (fixtures/make_ncu_text_fixtures.sh, ncu 2025.3, an H200): a
    kernel line `NAME (grid)x(block), Device 0, CC 9.0, Invocations N` and Minimum/Maximum/Average tables. It was
    refused as "not Nsight Compute output". Each block is one aggregated kernel row: its invocations as calls,
    its mean duration times them as its time; its metrics are the means."""
    path = NCU / "ncu_summary_vgg11_bs16.txt"
    text = path.read_text()
    blocks = re.findall(r"^  (\S.*?) \(\d+, ?\d+, ?\d+\)x\(\d+, ?\d+, ?\d+\), Device 0, CC 9\.0, Invocations (\d+)\n"
                        r"(.*?)(?=^  \S|\Z)", text, re.M | re.S)
    assert len(blocks) >= 5
    want = []
    for name, invocations, body in blocks:
        (avg,) = re.findall(r"^    Duration +(\w+) +[\d.,]+ +[\d.,]+ +([\d.,]+)$", body, re.M)
        unit, value = avg
        want.append((name, int(invocations), int(Decimal(value.replace(",", "")) * TIME_NS[unit]) * int(invocations)))
    kernels, counters, trace = events(path)
    assert trace.meta.variant == "text --print-summary per-kernel"
    assert kernels.select("name", "calls", "duration_ns").rows() == want
    assert sum(n for _, n, _ in want) == 12  # --launch-count 12
    rows = len(re.findall(r"^    (?!Metric Name|-)\S.*? +\S+ +[\d.,]+ +[\d.,]+ +[\d.,]+$", text, re.M))
    assert counters.height == rows
    assert set(counters["calls"].to_list()) == {n for _, n, _ in want}


#: ncu 2020 text under a decimal-comma locale, laid out as a real `nv-nsight-cu-cli` run published in a course's
#: solution notes (ax_kernel on a V100, 2020-Oct-30: `Duration msecond 10,55`, `Elapsed Cycles 13 181 137`,
#: `SM Active Cycles 12 837 852,30`); hand-written with other numbers (that page names no licence).
def _text_2020(kernel_line: str, rows: list[tuple[str, str, str]], section: str = "GPU Speed Of Light") -> str:
    """A result of ncu 2020 text output: its kernel line, and a section table laid out as ncu lays it out (a
    70-wide name column, a 15-wide unit column and a 30-wide value column, both right-aligned)."""
    rule = f"    {'-' * 70} {'-' * 15} {'-' * 30}\n"
    body = "".join(f"    {name:<70} {unit:>15} {value:>30}\n" for name, unit, value in rows)
    return (kernel_line + "\n" if kernel_line else "") + f"    Section: {section}\n" + rule + body + rule


LOCALE_TEXT = _text_2020("  ax_kernel, 2020-Oct-30 17:40:42, Context 1, Stream 7", [
    ("Memory Frequency", "cycle/usecond", "870,25"), ("SOL FB", "%", "80,5"),
    ("Elapsed Cycles", "cycle", "12 500 000"), ("SM Frequency", "cycle/nsecond", "1,25"),
    ("Duration", "msecond", "1,234"), ("SM Active Cycles", "cycle", "11 900 250,75"), ("SM [%]", "%", "3,34")])


def test_text_in_a_decimal_comma_locale(tmp_path):
    """A real 2020 text output written under a decimal-comma locale was refused on its first value ('875,84' is not
    a number). With the locale shown by the file (space-grouped thousands, decimal commas), its numbers are read as
    such, with a warning, a three-decimal `Duration msecond 1,234` included (1.234 ms, not 1234 ms)."""
    path = tmp_path / "locale.txt"
    path.write_text(LOCALE_TEXT)
    kernels, counters, trace = events(path)
    assert kernels.select("name", "duration_ns").rows() == [("ax_kernel", 1_234_000)]
    value = dict(counters.select("name", "value").rows())
    assert value["Elapsed Cycles"] == 12_500_000 and value["SM Active Cycles"] == 11_900_250.75
    assert value["SOL FB"] == 80.5 and value["SM [%]"] == 3.34
    assert value["Memory Frequency"] == pytest.approx(870.25e6) and value["SM Frequency"] == pytest.approx(1.25e9)
    assert [w for w in trace.meta.warnings if "locale" in w] == [
        f"{path}: numbers are written in a decimal-comma locale (e.g. '12 837 852,30'): read with ',' as the decimal "
        "mark and spaces between thousands"]
    # the C locale's own "1,234" (thousands) is unchanged where nothing shows another locale
    path.write_text(LOCALE_TEXT.replace("12 500 000", "12500000").replace("11 900 250,75", "11900250")
                    .replace("870,25", "870").replace("80,5", "80").replace("1,25", "1").replace("3,34", "3"))
    kernels, _, trace = events(path)
    assert kernels["duration_ns"].to_list() == [1_234_000_000]
    assert not [w for w in trace.meta.warnings if "locale" in w]


def test_text_tables_before_the_first_kernel_line_are_said(tmp_path):
    """ncu 2020 text of a `--nvtx` run as published in a Julia package's docs (`==PROF==   0: Naive transpose
    (32, 32)`, the SOL table, then `  ptxcall_..._2, 2020-Feb-20 22:42:24, Context 1, Stream 23`; three tables,
    two kernel lines): the first table has no kernel line above it and was dropped without a word. Hand-written
    after that layout with other numbers (the page's repository is not named by the index)."""
    def sol(fb: str, ms: str) -> str:
        return _text_2020("", [("SOL FB", "%", fb), ("Duration", "msecond", ms)])

    path = tmp_path / "nvtx.txt"
    path.write_text("==PROF==   0: range a\n" + sol("40.00", "1.10") + "\n"
                    "  kernel_b, 2020-Feb-20 22:42:24, Context 1, Stream 23\n\n==PROF==   0: range b\n"
                    + sol("20.00", "2.20"))
    kernels, counters, trace = events(path)
    assert kernels.select("name", "duration_ns", "stream_id").rows() == [("kernel_b", 2_200_000, 23)]
    assert counters.filter(pl.col("name") == "SOL FB")["value"].to_list() == [20.0]
    assert [w for w in trace.meta.warnings if "before the first kernel line" in w] == [
        f"{path}: 1 section tables come before the first kernel line (NAME ..., Context N, Stream N) and were "
        "skipped: they belong to no kernel the file names"]


def test_print_summary_keeps_minimum_and_maximum():
    """`--print-summary per-kernel` tables give each metric's Minimum, Maximum and Average over the invocations.
    Only the Average was read: the real summary of ishana23g/heat_eq (ncu 2023-2024, CC 8.9; its
    `add_heat_kernel_1d` Duration 1.70/1.98/1.75 us over 14 launches) read min_ns and max_ns as null and the DRAM
    Throughput range 0.57-10.65% as nothing. The hand-written file follows its layout (fixtures/ncu/handwritten)."""
    path = NCU / "handwritten" / "text_2024_summary_minmax.txt"
    text = path.read_text()
    blocks = re.findall(r"^  (\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), Device 0, CC 8\.9, Invocations (\d+)\n"
                        r"(.*?)(?=^  \S|\Z)", text, re.M | re.S)
    want_kernels, want_dram = [], []
    for name, invocations, body in blocks:
        ((unit, low, high, avg),) = re.findall(r"^    Duration +(\w+) +([\d.]+) +([\d.]+) +([\d.]+)$", body, re.M)
        ns = [int(Decimal(v) * TIME_NS[unit]) for v in (low, high, avg)]
        want_kernels.append((name, int(invocations), ns[2] * int(invocations), ns[0], ns[1]))
        ((low, high, avg),) = re.findall(r"^    DRAM Throughput +% +([\d.]+) +([\d.]+) +([\d.]+)$", body, re.M)
        want_dram.append((float(avg), float(low), float(high)))
    assert want_kernels == [("add_heat(float *, int)", 12, 21720, 1720, 2040),
                            ("step_sim(float *, float *, int)", 200, 390000, 1840, 2810)]
    kernels, counters, _ = events(path)
    assert kernels.select("name", "calls", "duration_ns", "min_ns", "max_ns").rows() == want_kernels
    dram = counters.filter(pl.col("name") == "DRAM Throughput")
    assert dram.select("value", "value_min", "value_max").rows() == want_dram
    ghz = counters.filter(pl.col("name") == "SM Frequency")  # scaled like the value: Ghz -> hz
    assert ghz.select("value", "value_min", "value_max", "unit").rows()[0] == (2.24e9, 2.2e9, 2.28e9, "hz")
    assert counters["value_min"].null_count() == 0 and counters["value_max"].null_count() == 0


def test_a_report_without_floating_point_work_gets_its_bandwidth_share():
    """ncu_llama_h200_rep_raw.csv: 12 timed kernels that count 0 FLOPs. Their whole was told "with no kernel time in
    the trace, its share of the roof is unknown"; its DRAM bandwidth against the H200's 4,800 GB/s is what it
    attained."""
    import traceparse
    from traceparse.figures import fmt_number, fmt_pct

    trace = read_paths([NCU / "ncu_llama_h200_rep_raw.csv"])[0]
    f = traceparse.analyze(trace, rules=["arithmetic-intensity"])[0]
    m = f.metrics
    assert m["flops"] == 0 and m["time_ns"] > 0 and m["roof_pct"] is None
    # the bytes and time, from the report with the csv module: dram__bytes_{read,write}.sum and gpu__time_duration
    with open(NCU / "ncu_llama_h200_rep_raw.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    units, rows = rows[0], rows[1:]
    scale = {"byte": 1, "Kbyte": 1000, "Mbyte": 10**6, "Gbyte": 10**9}
    dram = sum(Decimal(r[c].replace(",", "")) * scale[units[c]] for r in rows
               for c in ("dram__bytes_read.sum", "dram__bytes_write.sum"))
    ns = sum(Decimal(r["gpu__time_duration.sum"].replace(",", "")) * TIME_NS[units["gpu__time_duration.sum"]]
             for r in rows)
    assert (m["dram_bytes"], m["time_ns"]) == (int(dram), int(ns))
    gbps = float(dram) / float(ns)
    assert "no kernel time in the trace" not in f.message
    assert (f"it counts no floating-point work, so no share of a compute roof: its DRAM traffic ran at "
            f"{fmt_number(gbps)} GB/s, {fmt_pct(100 * gbps / m['peak_gbps'])} of the "
            f"{fmt_number(m['peak_gbps'])} GB/s peak") in re.sub(r"\s+", " ", f.message)
