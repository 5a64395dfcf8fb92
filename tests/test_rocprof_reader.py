"""The ``rocprof`` reader on real rocprof v1 ``results.json`` files (fixtures/rocprof/SOURCE.md): every row,
time and link checked against an independent parse of the raw JSON here, with ``json`` and plain Python."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from helpers import FIXTURES, refused, run_cli
from traceparse.analysis import analyze
from traceparse.errors import InputError
from traceparse.ingest import detect_reader, read_paths
from traceparse.plugins import registry
from traceparse.sources import read_head

HERE = FIXTURES / "rocprof"
REAL = sorted(HERE.glob("*.json.gz"))
HANDWRITTEN = HERE / "handwritten" / "tblextr_head_roctx_barriers.json"


def _doc(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def _expected(path: Path) -> dict:
    """What the file holds, by track: rows per kind, the kernels' time, the devices of the GPU rows and the
    launch links (arrows from a call track that end where a GPU operation starts, no later than it)."""
    events = _doc(path)["traceEvents"]
    tracks = {str(e["pid"]): re.sub(r"^\d+ ", "", e["args"]["name"]) for e in events
              if e.get("ph") == "M" and e.get("name") == "process_name"}
    kinds, kernel_ns, devices, zero = Counter(), 0, set(), 0
    ops = {}  # (track, lane, ts) -> the longest non-barrier operation starting there

    def lane(e):
        return (str(e["pid"]), str(e["args"].get("stream-id", e["tid"])), e["args"].get("KernelName")
                or e["args"].get("Name") or e["name"], int(e["args"]["BeginNs"]))

    timed = {lane(e) for e in events if e.get("ph") == "X" and int(e["args"]["EndNs"]) > int(e["args"]["BeginNs"])}
    for e in events:
        if e.get("ph") != "X":
            continue
        track = tracks.get(str(e["pid"]), "")
        a = e["args"]
        ns = int(a["EndNs"]) - int(a["BeginNs"])
        name = a.get("KernelName") or a.get("Name") or e["name"]
        if track.startswith("CPU "):
            kinds["marker" if name == "hsa_dispatch" else "api"] += 1
        elif track == "COPY" or re.fullmatch(r"GPU\d+", track):
            if name == "<barrier packet>":
                kinds["barrier"] += 1
                continue
            if ns == 0 and lane(e) in timed:  # recorded again, with its time
                kinds["twice"] += 1
                continue
            kind = "memcpy" if track == "COPY" else "kernel"
            kinds[kind] += 1
            if kind == "kernel":
                kernel_ns += ns
                zero += ns == 0
                devices.add(int(a.get("dev-id", a.get("gpu-id"))))
            key = (str(e["pid"]), str(e["tid"]), int(e["ts"]))
            if key not in ops or ns > ops[key]:
                ops[key] = ns
        elif track == "Markers and Ranges":
            kinds["marker" if ns <= 1 else "region"] += 1
    starts = {e["id"]: e for e in events if e.get("ph") == "s"}
    marks = {(str(e["pid"]), str(e["tid"]), int(e["ts"])) for e in events
             if e.get("ph") == "X" and e["name"] == "hsa_dispatch"}  # rocprof's mark of a dispatch: no call
    linked = set()
    for t in (e for e in events if e.get("ph") == "t"):
        s = starts.get(t["id"])
        if s and tracks.get(str(s["pid"]), "").startswith("CPU ") and s["ts"] <= t["ts"] \
                and (str(t["pid"]), str(t["tid"]), int(t["ts"])) in ops \
                and (str(s["pid"]), str(s["tid"]), int(s["ts"])) not in marks:
            linked.add((str(t["pid"]), str(t["tid"]), int(t["ts"])))
    # and a copy no arrow reaches, inside synchronous copy calls of one thread of its process
    span = lambda e: (int(e["args"]["BeginNs"]), int(e["args"]["EndNs"]))  # noqa: E731
    calls = [e for e in events if _copy_call(e) and tracks.get(str(e["pid"]), "").startswith("CPU ")]
    process = lambda e: e["args"].get("proc-id", e["args"]["pid"])  # noqa: E731
    for c in events:
        key = (str(c.get("pid")), str(c.get("tid")), int(c["ts"])) if c.get("ph") == "X" else None
        if key is None or tracks.get(key[0]) != "COPY" or key in linked:
            continue
        holding = [k for k in calls if process(k) == process(c) and span(k)[0] <= span(c)[0]
                   and span(c)[1] <= span(k)[1]]
        if holding and len({k["args"]["tid"] for k in holding}) == 1:
            linked.add(key)
    links = len(linked)
    kernel_links = sum(1 for key in linked if re.fullmatch(r"GPU\d+", tracks[key[0]]))
    # the COPY track names no device: its copies are the one GPU track's where there is one, else unknown
    gpus = {int(t[3:]) for t in tracks.values() if re.fullmatch(r"GPU\d+", t)}
    only = next(iter(gpus)) if len(gpus) == 1 else None
    copy_devices = {int(d) if (d := e["args"].get("dev-id", e["args"].get("gpu-id"))) is not None else only
                    for e in events if e.get("ph") == "X" and tracks.get(str(e["pid"])) == "COPY"
                    and (e["args"].get("Name") or e["name"]) != "<barrier packet>"}
    return {"kinds": dict(kinds), "kernel_ns": kernel_ns, "devices": devices, "links": links, "zero": zero,
            "kernel_links": kernel_links, "copy_devices": copy_devices}


def test_every_real_fixture_is_claimed_by_the_rocprof_reader():
    reg = registry()
    assert len(REAL) == 4
    for path in [*REAL, HANDWRITTEN]:
        assert detect_reader(path, reg).name == "rocprof", path


@pytest.mark.parametrize("path", [*REAL, HANDWRITTEN], ids=lambda p: p.name)
def test_rows_times_devices_and_links_match_an_independent_parse(path):
    want = _expected(path)
    trace = read_paths([path])[0]
    events = trace.events
    got = dict(Counter(events["kind"].to_list()))
    barriers = want["kinds"].pop("barrier", 0)
    twice = want["kinds"].pop("twice", 0)
    assert got == want["kinds"]
    kernels = events.filter(events["kind"] == "kernel")
    assert int(kernels["duration_ns"].sum() or 0) == want["kernel_ns"]  # exact: BeginNs/EndNs, not ts/dur
    assert set(kernels["device_id"].to_list()) == want["devices"]
    assert set(events.filter(events["kind"] == "memcpy")["device_id"].to_list()) == want["copy_devices"]
    gpu = events.filter(events["kind"].is_in(["kernel", "memcpy"]))
    linked = gpu.filter(gpu["correlation_id"].is_not_null())
    assert linked.height == want["links"]
    # each linked operation's call is on a call track, shares its id, and began before the operation did
    calls = events.filter((events["kind"] == "api") & events["correlation_id"].is_not_null())
    assert sorted(calls["correlation_id"].to_list()) == sorted(linked["correlation_id"].to_list())
    joined = linked.join(calls, on="correlation_id", suffix="_call")
    assert (joined["start_ns_call"] <= joined["start_ns"]).all()
    if barriers:
        assert f"{barriers} barrier packets" in " ".join(trace.meta.warnings)
    if twice:
        assert f"{twice} zero-length records of dispatches or copies recorded again" in " ".join(trace.meta.warnings)


def test_the_old_form_gives_the_process_not_the_track():
    """Before ROCm 4.3, ``args.pid`` held the track (2, 3: the event's own pid) and ``args.proc-id`` the process,
    on copies and dispatches only; the calls take the one process the file names."""
    path = HERE / "millipyde_rocm4_results.json.gz"
    events = [e for e in _doc(path)["traceEvents"] if e.get("ph") == "X"]
    processes = {int(e["args"]["proc-id"]) for e in events if "proc-id" in e["args"]}
    assert len(processes) == 1 and all(e["args"]["pid"] == e["pid"] for e in events if "proc-id" not in e["args"])
    trace = read_paths([path])[0]
    assert set(trace.events.filter(trace.events["kind"] == "api")["pid"].to_list()) == processes


def test_a_real_trace_reads_as_gpu_work_and_its_launches(store):
    """The first screen gives GPU busy time (it said "the trace recorded no GPU activity" when the file was read
    as a plain Chrome trace) and launch-stats counts the launches the arrows link, as counted here."""
    path = HERE / "millipyde_2gpu_results.json.gz"
    code, out, err = run_cli("analyze", str(path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["summary"][0]["gpu_busy_pct"] is not None and doc["summary"][0]["gpu_devices"] == 2
    launches = next(f for f in doc["findings"] if f["rule"] == "launch-stats")
    assert launches["metrics"]["linked_kernels"] == _expected(path)["kernel_links"]


def test_rocprofv2_json_and_a_plain_chrome_trace_are_not_claimed(tmp_path):
    """rocprofv2's JSON plugin writes tracks ``CPU``/``GPU`` and no ``BeginNs`` (a hand-written file after its
    layout): not claimed (a Chrome trace of another reader)."""
    v2 = tmp_path / "1234_output.json"
    v2.write_text(json.dumps({"traceEvents": [
        {"args": {"name": "CPU"}, "ph": "M", "pid": 1, "name": "process_name"},
        {"args": {"name": "GPU"}, "ph": "M", "pid": 2, "name": "process_name"},
        {"ph": "X", "name": "vector_add", "pid": 2, "tid": 1, "ts": 5, "dur": 2, "cat": "kernel",
         "args": {"cid": 7}}]}, indent=2))
    assert detect_reader(v2, registry()).name != "rocprof"


def test_an_event_without_its_nanoseconds_is_refused_naming_it(store, tmp_path):
    """A real file with one copy's ``BeginNs`` taken out: one line naming the event and what it lacks."""
    path = HERE / "rocm_blogs_hip_trace_results.json.gz"
    text = gzip.decompress(path.read_bytes()).decode()
    doc = json.loads(text)
    index = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("name") == "CopyHostToDevice")
    cut = re.sub(r'"BeginNs":"\d+",', "", text, count=1)
    assert cut.count('"BeginNs"') == text.count('"BeginNs"') - 1
    first = min(i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X")
    bad = tmp_path / "results.json"
    bad.write_text(cut)
    refused(["ingest", str(bad)], f"{bad}: traceEvents[{first}].args: BeginNs and EndNs (rocprof writes both on "
            "every event)", store)
    assert index >= first


def test_the_sniff_needs_rocprofs_tracks_and_nanoseconds():
    head = read_head(HERE / "rocm_blogs_hip_trace_results.json.gz", 64 * 1024)
    reader = registry().readers["rocprof"]
    assert reader.sniff(Path("results.json"), head) == 0.8
    assert reader.sniff(Path("x.json"), head.replace(b'"BeginNs"', b'"Begin"')) == 0.0
    assert reader.sniff(Path("x.json"), head.replace(b"CPU HIP API", b"CPU").replace(b'"COPY"', b'"C"')
                        .replace(b'"GPU', b'"G')) == 0.0
    with pytest.raises(InputError):
        read_paths([HERE / "SOURCE.md"], fmt="rocprof")[0].events


def _without(path: Path, tmp_path: Path, name: str, drop) -> Path:
    """A derived copy of a real trace with the events ``drop`` picks taken out."""
    doc = _doc(path)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not drop(e)]
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(doc))
    return out


def _copy_call(e: dict) -> bool:
    return e.get("ph") == "X" and re.fullmatch(r"hipMemcpy(?:[A-Z][A-Za-z]*)?", e.get("name") or "") is not None


def test_a_trace_of_one_gpu_is_not_read_as_two():
    """hip_course: one GPU track and the COPY track, which names no device. Its copies made a second, unknown
    GPU: "the 2 GPUs ran nothing for 91.2%", with a longest gap of 5.534 ms beside a mean span of 3.069 ms. One
    GPU now, whose span runs from its first copy to its last activity (the raw BeginNs/EndNs here)."""
    path = HERE / "hip_course_hsa_trace_result.json.gz"
    events = _doc(path)["traceEvents"]
    tracks = {str(e["pid"]): e["args"]["name"] for e in events if e.get("ph") == "M"}
    gpu = [e["args"] for e in events if e.get("ph") == "X" and (tracks[str(e["pid"])] == "COPY"
                                                                 or tracks[str(e["pid"])].startswith("GPU"))]
    span = max(int(a["EndNs"]) for a in gpu) - min(int(a["BeginNs"]) for a in gpu)
    [finding] = analyze(read_paths([path])[0], rules=["gpu-idle"])
    assert list(finding.metrics["devices"]) == ["0"] and finding.metrics["devices"]["0"]["span_ns"] == span


def test_a_copy_with_no_arrow_is_linked_to_the_synchronous_call_it_ran_in():
    """rocprof drew no arrow to any of this trace's 23 copies; a synchronous ``hipMemcpy*`` returns once its copy
    is done, so a copy inside such calls of one thread is that call's (the innermost). Worked out here from the
    raw events: the copies and the calls holding them."""
    path = HERE / "millipyde_2gpu_results.json.gz"
    events = _doc(path)["traceEvents"]
    tracks = {str(e["pid"]): e["args"]["name"] for e in events if e.get("ph") == "M"}
    copies = [e for e in events if e.get("ph") == "X" and tracks.get(str(e["pid"])) == "COPY"]
    calls = [e for e in events if _copy_call(e) and tracks.get(str(e["pid"])) == "CPU HIP API"]
    span = lambda e: (int(e["args"]["BeginNs"]), int(e["args"]["EndNs"]))  # noqa: E731
    want = {}
    for c in copies:
        holding = [k for k in calls if k["args"]["pid"] == c["args"]["pid"]
                   and span(k)[0] <= span(c)[0] and span(c)[1] <= span(k)[1]]
        if holding and len({k["args"]["tid"] for k in holding}) == 1:
            inner = max(holding, key=lambda k: (span(k)[0], -span(k)[1]))
            want[span(c)[0]] = (inner["name"], span(inner)[0])
    trace = read_paths([path])[0]
    rows = trace.events
    got = {}
    for copy in rows.filter((rows["kind"] == "memcpy") & rows["correlation_id"].is_not_null()).iter_rows(named=True):
        (call,) = rows.filter((rows["kind"] == "api") & (rows["correlation_id"] == copy["correlation_id"])).iter_rows(
            named=True)
        got[copy["start_ns"]] = (call["name"], call["start_ns"])
    assert len(want) == 13 and got == want
    # the three-second gaps before the device-to-host copies are the GPU waiting for the host
    (found,) = analyze(trace, ["gpu-idle"])
    assert found.metrics["host_wait_pct"] > 90 and found.suggestion.startswith("The GPU waits for the host")


def test_gpu_idle_says_when_no_call_is_linked_to_the_gpu_work(tmp_path):
    """A real rocprof trace with its arrows and copy calls taken out (derived files: rocprof writes no
    correlation id) has runtime calls but none linked to a copy or kernel: gpu-idle cannot tell a GPU waiting for
    the host from one waiting for other work, and says so, instead of counting every gap as "queued work waiting
    for something else than the host". With the arrows but without the copy calls, its kernels are linked and
    its copies not: the long gaps before the copies are said to be before unlinked work, with no "queued work"
    advice."""
    path = HERE / "millipyde_2gpu_results.json.gz"
    blind_file = _without(path, tmp_path, "blind", lambda e: e.get("ph") in ("s", "t") or _copy_call(e))
    (blind,) = analyze(read_paths([blind_file])[0], ["gpu-idle"])
    assert "The trace links no runtime call to the GPU work it queued" in blind.message
    assert blind.suggestion.startswith("The trace ties no runtime call to the GPU work it queued")
    part_file = _without(path, tmp_path, "part", _copy_call)
    (part,) = analyze(read_paths([part_file])[0], ["gpu-idle"])
    m = part.metrics
    assert "links no runtime call" not in part.message and m["host_wait_ns"] > 0
    assert 0 < m["unlinked_wait_ns"] <= m["other_wait_ns"] and 2 * m["unlinked_wait_ns"] > m["other_wait_ns"]
    assert "is before copies or kernels the trace links to no launch call" in part.message
    assert part.suggestion.startswith("Most of the idle time comes before copies or kernels the trace ties to no")


def test_the_links_are_the_same_on_every_read():
    """The ids given to copies linked by the call they ran in are numbered in file order: two reads (one of them
    with one polars thread) give the same table (they differed from read to read when numbered in the order a
    hash-based unique left the rows: reader.read() against store.load() found it)."""
    import os
    import subprocess
    import sys

    path = HERE / "millipyde_2gpu_results.json.gz"
    code = ("import sys; from traceparse.ingest import read_paths; e = read_paths([sys.argv[1]])[0].events; "
            "print(e.select('correlation_id', 'start_ns', 'kind').rows())")
    runs = [subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                           env={**os.environ, "POLARS_MAX_THREADS": threads}).stdout for threads in ("1", "4")]
    assert runs[0] == runs[1] and runs[0].count("memcpy") == 23
