"""A JAX inference XSpace of 4 TPUs (openxla/xprof, Apache-2.0: fixtures/jax/tpu/xprof_tpu_inference_2/SOURCE.md):
no streams, and a critical path that reaches no event taking time (the trace's last event is an instant
``MemoryDeallocation`` marker). ``report --html`` crashed on it (``min() arg is an empty sequence``) and the
critical path's sentence read "the critical path is 0 ns: ."."""

from __future__ import annotations

import json

from helpers import FIXTURES, run_cli, union
from traceparse.ingest import read_paths

TPU = FIXTURES / "jax" / "tpu" / "xprof_tpu_inference_2" / "tpu_inference_2.xplane.pb"


def test_the_html_report_of_a_path_of_zero_length(tmp_path):
    page = tmp_path / "r.html"
    code, out, err = run_cli("--store", str(tmp_path / "s"), "report", str(TPU), "--html", str(page))
    assert code == 0, err
    assert page.stat().st_size > 10_000 and "critical path" in page.read_text().lower()


def test_the_critical_paths_sentence_when_it_reached_nothing(tmp_path):
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(TPU), "--rule", "critical-path", "--json")
    assert code == 0, err
    f = json.loads(out)["findings"][0]
    assert f["metrics"]["length_ns"] == 0
    assert "the critical path is 0 ns (it reached no event that takes time)." in f["message"]
    assert ": ." not in f["message"]
    # no step is marked: the figures are of the one window over the trace, not "per step"
    assert " a window lies before the first event the path reached." in f["message"]
    assert "per step" not in f["message"]
    # and no table of its parts: a path of instants has none ("MemoryDeallocation 0 ns" was listed as its part)
    assert f["items"] == []


def test_a_tpus_lanes_nest_as_one_thread_in_hotspots(tmp_path):
    """xprof's XLA Modules, XLA Ops and XLA TraceMe lines of a TPU are views of one device's work: summed side by
    side, hotspots counted ``jit_f`` (a module) beside its ops, 31.5% of the total, and warned a 2.0x imbalance
    over the device's lanes. Each device's time is now the time its lanes cover, computed here by a sweep of
    the stored rows; ``jit_f`` keeps only its self time, and nothing is warned."""
    import polars as pl

    from traceparse.measures.routines import routine_choices, routine_time
    from traceparse.store import Store

    store = tmp_path / "s"
    code, out, err = run_cli("--store", str(store), "analyze", str(TPU), "--rule", "hotspots", "--json")
    assert code == 0, err
    found = json.loads(out)["findings"][0]
    assert found["severity"] == "info"
    assert ("nested host and device-lane events computed from their nesting on each thread (a device's XLA lanes "
            "nest as one thread: a module over its ops).") in found["message"]
    events = Store(store).load(json.loads(out)["traces"][0]["id"]).events
    events = events.filter(pl.col("group").ne_missing("async"))
    lanes = events.filter(pl.col("pid").is_null() & pl.col("tid").is_not_null()
                          & pl.col("kind").is_in(["region", "op"]))
    kinds = ("region", "kernel", "op", "api", "marker", "memcpy", "memset", "sync")
    chosen = routine_choices(events, kinds)
    assert chosen["device_lane_rows"] == lanes.height == 6_013 + 630  # ops and regions of the four devices
    routines = routine_time(events, kinds=kinds, drop_nested=chosen["drop_nested"],
                            drop_aggregated=tuple(chosen["drop_aggregated"]))
    on_devices = routines.filter(pl.col("pid").is_null())
    assert on_devices["tid"].null_count() == on_devices.height  # a device's lanes are one thread
    for device in range(4):
        mine = lanes.filter(pl.col("device_id") == device)
        spans = mine.select("start_ns", "duration_ns").iter_rows()
        covered = sum(e - s for s, e in union((s, s + d) for s, d in spans))
        assert on_devices.filter(pl.col("device_id") == device)["time_ns"].sum() == covered
    jit = on_devices.filter(pl.col("name") == "jit_f(12190760917235803885)")
    module_time = lanes.filter(pl.col("name") == "jit_f(12190760917235803885)")["duration_ns"].sum()
    assert 0 < jit["time_ns"].sum() < module_time // 20  # its ops took the rest
    assert jit["inclusive_ns"].sum() == module_time
    assert sum(i["time_ns"] for i in found["items"] if i["name"] == "jit_f(12190760917235803885)") < module_time // 20


def test_a_gpus_lanes_are_views_of_its_kernels_and_are_left_out():
    """Hand-written edge case: a GPU with kernels on a stream and xprof's XLA Ops and XLA Modules lanes over them
    (the same 200 ns of work at three levels). hotspots ranks the kernels; the lanes would count that time two
    times more, so they are left out. A host region is its own thread's, as before."""
    from helpers import table
    from traceparse.measures.routines import routine_choices, routine_time

    rows = [dict(kind="kernel", name="fusion_k", device_id=0, stream_id=7, start_ns=0, duration_ns=100),
            dict(kind="kernel", name="fusion_k", device_id=0, stream_id=7, start_ns=150, duration_ns=100),
            dict(kind="op", name="fusion", device_id=0, tid=3, start_ns=0, duration_ns=100),
            dict(kind="op", name="fusion", device_id=0, tid=3, start_ns=150, duration_ns=100),
            dict(kind="region", name="jit_step", device_id=0, tid=2, start_ns=0, duration_ns=300),
            dict(kind="region", name="train", pid=1, tid=1, start_ns=0, duration_ns=400)]
    events = table(*rows)
    kinds = ("region", "kernel", "op")
    assert routine_choices(events, kinds)["device_lane_rows"] == 3
    got = routine_time(events, kinds=kinds).select("name", "pid", "device_id", "tid", "time_ns")
    assert sorted(got.iter_rows()) == [("fusion_k", None, 0, None, 200), ("train", 1, None, 1, 400)]


def test_arithmetic_intensity_says_a_tpus_ops_are_no_gpu_kernels(tmp_path):
    """It said "its operators ran on the CPU, or the GPU was not traced" of a TPU's XLA ops, and asked for --gpu."""
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(TPU), "--rule", "arithmetic-intensity",
                             "--json")
    assert code == 0, err
    f = json.loads(out)["findings"][0]
    assert f["message"] == ("The trace's operators ran on accelerator devices that record no GPU kernels (XLA ops of "
                            "a TPU): this rule places GPU kernels on a GPU's roofline, so there is nothing to place.")
    assert f["metrics"]["gpu_source"] == "none: the trace's devices ran no GPU kernels"


def _tpu_lanes_busy() -> tuple[int, int, int]:
    """The oracle: read the XSpace's TPU planes directly (protobuf) and, per TPU, merge the events of its
    synchronous lines (``XLA Modules``, ``XLA Ops``, ``XLA TraceMe``; not ``Async XLA Ops``): Σ busy, Σ span
    (first start to last end) over the TPUs, in picoseconds, and the number of TPUs."""
    from traceparse_plugins.readers.jax.xplane import _protobuf, _top_level

    planes, _, _ = _top_level(TPU, TPU.read_bytes())
    busy = span = devices = 0
    for _, blob in planes:
        plane = _protobuf()()
        plane.ParseFromString(blob)
        if not plane.name.startswith("/device:TPU:"):
            continue
        spans = [(line.timestamp_ns * 1000 + e.offset_ps, line.timestamp_ns * 1000 + e.offset_ps + e.duration_ps)
                 for line in plane.lines if line.name in ("XLA Modules", "XLA Ops", "XLA TraceMe")
                 for e in line.events]
        merged = union(spans)
        busy += sum(e - s for s, e in merged)
        span += merged[-1][1] - merged[0][0]
        devices += 1
    return busy, span, devices


def test_a_tpu_profile_says_tpu_and_how_busy_its_tpus_were(tmp_path):
    """The summary said "GPU busy -" of 4 busy TPUs, and hotspots labelled their rows "GPU 2". The TPUs' busy
    share is now that of their lanes' union, checked against the XPlane read here; rows and devices say TPU."""
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "analyze", str(TPU), "--rule", "hotspots", "--json")
    assert code == 0, err
    report = json.loads(out)
    summary = report["summary"][0]
    busy, span, devices = _tpu_lanes_busy()
    assert devices == 4 and summary["other_devices"] == {"TPU": 4} and summary["lane_devices"] == 4
    assert summary["gpu_busy_pct"] is None
    assert abs(summary["lane_busy_pct"] - 100 * busy / span) < 1e-4  # ns rounding of picosecond times
    threads = [i["thread"] for f in report["findings"] if f["title"] == "Hotspots per thread" for i in f["items"]]
    on_devices = [t for t in threads if not t[0].isdigit()]
    assert on_devices and all(t.startswith("TPU ") for t in on_devices) and not any("GPU" in t for t in threads)

    code, out, err = run_cli("--store", store, "--width", "100", "analyze", str(TPU), "--rule", "hotspots")
    assert code == 0, err
    flat = " ".join(out.replace("│", " ").split())  # the label column is as wide as its longest label
    assert (f" TPU busy {100 * busy / span:.1f}% of the mean TPU's span (first to last activity on its "
            "lanes)") in flat
    assert "GPU busy" not in out

    code, out, err = run_cli("--store", store, "show", report["traces"][0]["id"], "--json")
    assert code == 0, err
    assert [(d["id"], d["kind"], d["name"]) for d in json.loads(out)["devices"]] == [
        (i, "TPU", "TPU v6 Lite") for i in range(4)]


def test_a_roofline_of_tpus_says_there_is_no_gpu_kernel(tmp_path):
    """It said a JAX profile's .xplane.pb was needed, of an .xplane.pb."""
    code, out, err = run_cli("--store", str(tmp_path / "s"), "roofline", str(TPU))
    assert code == 2 and out == ""
    assert err.strip() == (f"traceparse: error: {TPU}: no GPU kernels to place on a GPU's roofline: the trace's "
                           "devices are TPUs (hotspots gives their ops' time)")


def test_a_json_timeline_of_a_tpu_lists_the_tpu(tmp_path):
    """Hand-written edge case (the xprof trace-viewer JSON of one TPU, two lines): the JSON has no device
    properties, but its process name says TPU, and the device is listed as one."""
    trace = tmp_path / "t.trace.json"
    trace.write_text(json.dumps({"displayTimeUnit": "ns", "traceEvents": [
        {"ph": "M", "pid": 5, "name": "process_name", "args": {"name": "/device:TPU:3"}},
        {"ph": "M", "pid": 5, "tid": 1, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 7, "tid": 9, "name": "thread_name", "args": {"name": "main"}},
        {"ph": "X", "pid": 5, "tid": 1, "name": "fusion.1", "ts": 10.0, "dur": 5.0},
        {"ph": "X", "pid": 5, "tid": 1, "name": "fusion.2", "ts": 20.0, "dur": 5.0},
        {"ph": "X", "pid": 7, "tid": 9, "name": "step", "ts": 0.0, "dur": 40.0}]}))
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "analyze", str(trace), "--json")
    assert code == 0, err
    summary = json.loads(out)["summary"][0]
    assert summary["other_devices"] == {"TPU": 1}
    assert summary["lane_busy_pct"] == round(100 * 10 / 15, 4)  # 10 us busy of the 15 us from the first op to the last


def test_a_tpu_summary_names_its_top_ops(tmp_path):
    """The summary of a TPU profile named no work of the TPUs ("top kernels" is of GPU kernels): their XLA ops
    with the most time are listed now, checked against the XPlane's XLA Ops lines read directly."""
    from collections import Counter

    from traceparse_plugins.readers.jax.xplane import _protobuf, _top_level

    planes, _, _ = _top_level(TPU, TPU.read_bytes())
    ops: Counter = Counter()
    for _, blob in planes:
        plane = _protobuf()()
        plane.ParseFromString(blob)
        if plane.name.startswith("/device:TPU:"):
            names = {k: v.display_name or v.name for k, v in plane.event_metadata.items()}
            for line in plane.lines:
                if line.name == "XLA Ops":
                    for e in line.events:
                        ops[names[e.metadata_id]] += e.duration_ps
    total = sum(ops.values())
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(TPU), "--rule", "hotspots", "--json")
    assert code == 0, err
    top = json.loads(out)["summary"][0]["top_lane_ops"]
    assert [o["name"] for o in top] == [n for n, _ in ops.most_common(3)]
    for o in top:
        assert abs(o["share_pct"] - 100 * ops[o["name"]] / total) < 1e-3


def test_a_tpus_peaks_are_shown_as_xla_gives_them(tmp_path):
    """Each TPU plane carries XLA's peak figures; ``show`` lists them under the keys every reader uses
    (``peak_tflops``, ``peak_memory_gbps``), read here from the planes' stats directly."""
    from traceparse_plugins.readers.jax.xplane import _protobuf, _top_level, _values

    planes, _, _ = _top_level(TPU, TPU.read_bytes())
    want = {}
    for _, blob in planes:
        plane = _protobuf()()
        plane.ParseFromString(blob)
        if plane.name.startswith("/device:TPU:"):
            stats = _values(plane.stats, {k: v.name for k, v in plane.stat_metadata.items()})
            want[int(plane.name.rsplit(":", 1)[1])] = (stats["peak_teraflops_per_second"],
                                                        stats["peak_hbm_bw_gigabytes_per_second"])
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "ingest", "--json", str(TPU))
    assert code == 0, err
    devices = json.loads(out)["traces"][0]["devices"]
    assert {d["id"]: (d["extra"]["peak_tflops"], d["extra"]["peak_memory_gbps"]) for d in devices} == want
    code, out, err = run_cli("--store", store, "--width", "120", "show", json.loads(out)["traces"][0]["id"])
    tflops, gbps = want[0]
    assert f"TPU v6 Lite, {tflops:,.0f} TFLOP/s peak, {gbps:,.0f} GB/s memory peak" in out


def test_the_gpu_catalog_does_not_look_a_tpu_up():
    """The catalog looked a TPU's model up as a GPU ("the trace's GPU 'TPU v6 Lite' is not in the catalog")."""
    from traceparse.catalog import gpu_for_trace

    (trace,) = read_paths([TPU])
    spec, how = gpu_for_trace(trace)
    assert spec is None and how == "the trace's devices are TPUs, not GPUs; pass gpu=NAME for a GPU's roofs"


def test_the_critical_path_of_a_tpu_trace_says_what_it_cannot_follow(tmp_path):
    """It read "The trace has no timed GPU work" of a trace whose four TPUs are 86.7% busy, and named a 0 ns
    "largest part" of a 0 ns path."""
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(TPU), "--rule", "critical-path", "--json")
    assert code == 0, err
    [finding] = json.loads(out)["findings"]
    assert finding["metrics"]["length_ns"] == 0
    message = finding["message"]
    assert "GPU work" not in message and "largest part" not in message
    assert ("The trace has no GPU streams: the TPUs' ops are not in the graph (nothing in the trace links them to "
            "the host's calls), so the path follows the host only.") in message


def test_an_xspace_saved_as_text_is_not_called_cut_short(store, tmp_path):
    """xprof's own copy of this file at later commits is the binary saved as text (every byte that is no UTF-8
    replaced by U+FFFD): its first varint then claims a plane of trillions of bytes, and the error said the file
    was "cut short", sending the user after a truncation. No protobuf field passes 2 GiB: it is no XSpace, and
    the error counts the replacement characters. Expected length and count worked out here from the bytes."""
    from helpers import refused

    mangled = TPU.read_bytes().decode("utf-8", errors="replace").encode()
    path = tmp_path / "saved_as_text.xplane.pb"
    path.write_bytes(mangled)
    assert mangled[0] == 0x0A  # field 1 (a plane), length-delimited
    length, shift, i = 0, 0, 1
    while True:
        length |= (mangled[i] & 0x7F) << shift
        shift += 7
        if mangled[i] < 0x80:
            break
        i += 1
    assert length > 2**31
    saved = mangled.count("\ufffd".encode())
    refused(["ingest", str(path)], f"{path}: byte 0: not an XSpace protobuf (.xplane.pb): a field {length:,} bytes "
            f"long, past protobuf's 2 GiB limit; {saved:,} U+FFFD replacement characters in it: binary bytes saved "
            "as text?", store)
