"""Host names: what each format's trace says of the machine it was recorded on, shown by ``ingest``/``show`` and
the page, a run's ranks grouped by host, and the straggler finding's word on hosts (a slow host, one clock).

Real files: PyTorch 2.13's Kineto (``host_name``), made by fixtures/make_hosts_run.py (four gloo ranks whose
UTS namespaces give them the host names of a cluster) and fixtures/make_cpu_trace.py; an nsys SQLite export
(``TARGET_INFO_SYSTEM_ENV``'s ``Hostname``); TAU's ``Hostname`` metadata. The oracles read the raw files (gzip +
json, sqlite3, a regular expression) and share no code with traceparse. Hostile names are the real trace with
its ``host_name`` rewritten (hand-made edge cases).
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3

import pytest

from helpers import FIXTURES, run_cli
from traceparse.meta import hosts, ranks_by_host
from traceparse.store import Store

RUNS = FIXTURES / "torch" / "multirank"
TWO_HOSTS = RUNS / "gloo4_two_hosts"
ONE_HOST = RUNS / "gloo4_one_host_busy"
CPU_TRACE = FIXTURES / "torch" / "cpu" / "convnet_cpu_torch213.json.gz"


def raw(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def raw_hosts(folder) -> dict[int, str]:
    """{rank: host_name} as the rank files say (distributedInfo's rank, the top-level host_name)."""
    out = {}
    for path in sorted(folder.glob("rank*.json.gz")):
        doc = raw(path)
        out[doc["distributedInfo"]["rank"]] = doc["host_name"]
    return out


def ingest(store, path) -> str:
    code, out, err = run_cli("ingest", str(path))
    assert code == 0, err
    return out


def only_finding(data: dict, rule: str) -> dict:
    [finding] = [f for f in data["findings"] if f["rule"] == rule]
    return finding


def test_torch_trace_names_its_host(store):
    want = raw(CPU_TRACE)["host_name"]
    assert want == "vm"
    out = ingest(store, CPU_TRACE)
    assert re.search(rf"│ host +{want} +│", out), out
    s = Store(store)
    [trace_id] = s.ids()
    assert hosts(s.load(trace_id).meta) == [want]


def test_a_torch_trace_without_host_name_names_none(store):
    path = FIXTURES / "torch" / "resnet18_bs16.json.gz"
    assert "host_name" not in raw(path)
    out = ingest(store, path)
    assert "host" not in out.replace("ingested", "")
    s = Store(store)
    assert hosts(s.load(s.ids()[0]).meta) == []


@pytest.mark.parametrize("value, shown", [
    (5, None), (["a", "b"], None), ("", None), ("   ", None), ({"name": "x"}, None),
    ("[bold red]node[/bold red]", "[bold red]node[/bold red]"),
    ("node\x1b[31m-7", "node\\x1b[31m-7"),
])
def test_hostile_host_names_are_data(store, tmp_path, value, shown):
    """A host_name of another type is not a host (and no error); text is printed literally, never as markup or a
    terminal escape."""
    doc = raw(CPU_TRACE)
    doc["host_name"] = value
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    out = ingest(store, path)
    assert "\x1b" not in out
    lines = [line for line in out.splitlines() if line.startswith("│ host ")]
    if shown is None:
        assert lines == []
    else:
        assert len(lines) == 1 and shown in lines[0], out


def test_run_panel_groups_ranks_by_host(store):
    want = raw_hosts(TWO_HOSTS)
    assert want == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
    out = ingest(store, TWO_HOSTS)
    assert "│ hosts          2 — node-a: ranks 0–1; node-b: ranks 2–3" in out, out
    header = next(line for line in out.splitlines() if " rank " in line and " host " in line)
    assert header.index("span") < header.index("host") < header.index("source")
    for rank, host in want.items():
        row = next(line for line in out.splitlines() if re.match(rf"│ +{rank} ", line.split("ranks", 1)[-1]))
        assert f" {host} " in row, row
    s = Store(store)
    [run_id] = s.run_ids()
    meta = s.load_run(run_id, lazy=True).meta
    assert ranks_by_host(meta) == {"node-a": [0, 1], "node-b": [2, 3]}
    assert hosts(meta) == ["node-a", "node-b"]


def test_run_of_one_host_says_it_once(store):
    assert set(raw_hosts(ONE_HOST).values()) == {"node-a"}
    out = ingest(store, ONE_HOST)
    assert "│ hosts          node-a (every rank)" in out, out
    header = next(line for line in out.splitlines() if " rank " in line and " span " in line)
    assert " host " not in header


def test_run_without_host_names_has_no_hosts_line(store):
    out = ingest(store, RUNS / "gloo4_slow_rank2")
    assert "hosts" not in out and " host " not in out


def test_straggler_names_the_slow_host(store):
    ingest(store, TWO_HOSTS)
    code, out, err = run_cli("analyze", "gloo4_two_hosts", "--rule", "stragglers", "--json")
    assert code == 0, err
    finding = only_finding(json.loads(out), "stragglers")
    on = raw_hosts(TWO_HOSTS)
    caused = {item["rank"]: item["wait_caused_ns"] for item in finding["items"]}
    assert {item["rank"]: item["host"] for item in finding["items"]} == on
    per_host = {}
    for rank, host in on.items():
        per_host[host] = per_host.get(host, 0) + caused[rank]
    assert finding["metrics"]["hosts"] == {
        host: {"ranks": sorted(r for r, h in on.items() if h == host), "wait_caused_ns": per_host[host]}
        for host in per_host}
    # node-b's two ranks slept 40 ms a step (the script): each made the others wait longer than either of node-a's
    assert min(caused[2], caused[3]) > max(caused[0], caused[1])
    assert finding["suggestion"].startswith("Every rank on node-b made the others wait longer than any rank "
                                            "elsewhere: the host is slow, not one rank;")
    total = sum(per_host.values())
    b, a = (round(100 * per_host[h] / total, 1) for h in ("node-b", "node-a"))
    assert round(b + a, 1) == 100.0
    assert f"by host: node-b (ranks 2–3) " in finding["message"]
    assert f", {b:.1f}%; node-a (ranks 0–1) " in finding["message"] and f", {a:.1f}%." in finding["message"]
    assert "their clocks likely differ (they ran on 2 hosts)" in finding["message"]


def test_straggler_on_one_host_does_not_blame_clocks(store):
    """Every rank on one host, one clock: collectives that end milliseconds apart (four ranks on two cores) are not
    a clock difference, and aligning clocks is not suggested."""
    ingest(store, ONE_HOST)
    code, out, err = run_cli("analyze", "gloo4_one_host_busy", "--rule", "stragglers", "--json")
    assert code == 0, err
    finding = only_finding(json.loads(out), "stragglers")
    assert finding["metrics"]["straggler_rank"] == 2  # the rank that computed 40 ms more a step (the script)
    assert "though every rank ran on node-a, on one clock: the waits are not a difference of clocks" in \
        finding["message"]
    assert "align_clocks" not in finding["message"] and "clocks likely differ" not in finding["message"]
    assert "hosts" not in finding["metrics"] and all("host" not in item for item in finding["items"])


def test_nsys_export_names_its_host(store, tmp_path):
    path = FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz"
    db = tmp_path / "r.sqlite"
    db.write_bytes(gzip.decompress(path.read_bytes()))
    with sqlite3.connect(db) as con:
        want = [v for (v,) in con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")]
    assert want == ["vm"]
    ingest(store, path)
    s = Store(store)
    assert hosts(s.load(s.ids()[0]).meta) == want


def test_tau_profiles_name_their_hosts(store):
    folder = FIXTURES / "tau" / "real" / "cpi-mpi"
    found = [re.search(r"<attribute><name>Hostname</name><value>([^<]*)</value>", p.read_text())
             for p in sorted(folder.glob("profile.*"))]
    want = list(dict.fromkeys(m.group(1) for m in found if m))
    assert want == ["nid01045"]
    out = ingest(store, folder)
    assert re.search(r"│ host +nid01045 +│", out), out
    s = Store(store)
    assert hosts(s.load(s.ids()[0]).meta) == want


def test_page_shows_the_run_hosts(store, tmp_path):
    ingest(store, TWO_HOSTS)
    page = tmp_path / "p.html"
    code, out, err = run_cli("report", "gloo4_two_hosts", "--html", str(page))
    assert code == 0, err
    text = re.sub(r"<[^>]+>", " ", page.read_text())
    assert re.search(r"hosts\s+2 — node-a: ranks 0–1; node-b: ranks 2–3", text)


def test_host_memory_of_a_cpu_trace(store):
    """A CPU-only trace's memory finding is about the host's memory, in a unit that fits its size."""
    samples = [e["args"] for e in raw(CPU_TRACE)["traceEvents"] if e.get("name") == "[memory]"]
    assert samples and {a["Device Type"] for a in samples} == {0}
    peak = max(a["Total Allocated"] for a in samples)
    ingest(store, CPU_TRACE)
    code, out, err = run_cli("analyze", "--rule", "memory", "--json")
    assert code == 0, err
    finding = only_finding(json.loads(out), "memory")
    assert finding["title"] == "Host memory"
    assert finding["metrics"]["peak_allocated_bytes"] == peak
    assert finding["message"].startswith(f"Host memory: peak allocated {peak / 2**20:.3f} MiB, ")


def test_analyze_json_names_the_hosts(store):
    ingest(store, TWO_HOSTS)
    code, out, err = run_cli("analyze", "gloo4_two_hosts", "--rule", "memory", "--json")
    assert code == 0, err
    [trace] = json.loads(out)["traces"]
    on = raw_hosts(TWO_HOSTS)
    assert trace["hosts"] == list(dict.fromkeys(on[r] for r in sorted(on)))
    assert trace["rank_hosts"] == {str(r): h for r, h in on.items()}
    ingest(store, FIXTURES / "torch" / "resnet18_bs16.json.gz")
    code, out, err = run_cli("analyze", "--rule", "memory", "--json")
    assert code == 0, err
    [trace] = json.loads(out)["traces"]
    assert "hosts" not in trace and "rank_hosts" not in trace
