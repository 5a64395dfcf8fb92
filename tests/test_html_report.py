"""``traceparse report TRACE --html FILE``, opened in a real browser (headless Chromium driven by Playwright).

Each report (a torch trace, an nsys capture, an ncu page, a run of four
ranks) must load with no console error, no page error and no request
beyond the file itself; every chart must be drawn with data; and the
figures it draws are checked against an independent reading of the raw
files (the JSON, the SQLite export). A trace whose names are HTML and
script must show them as text and run nothing. A screenshot of each page is
saved (in $TRACEPARSE_SCREENSHOTS when set: docs/img/ is made that way).

The browser tests skip when Chromium or Playwright is missing, unless
$TRACEPARSE_REQUIRE_BROWSER is set (.ci/run sets it): then they fail.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sqlite3
import sys
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, run_cli, us_to_ns

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1300}  # the screenshot: summary, metadata, the first charts
TORCH = FIXTURES / "torch" / "resnet18_bs16.json.gz"
NSYS = FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz"
NCU = FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


# -- the browser -------------------------------------------------------------------------------------------
def chromium_path() -> str | None:
    """Debian's Chromium (``chromium`` on PATH, else /usr/bin/chromium), or None."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def browser_or_skip() -> tuple[str, object]:
    """Chromium's path and Playwright's sync API; a skip when either is missing, a failure when the browser is
    required ($TRACEPARSE_REQUIRE_BROWSER, set by .ci/run)."""
    required = bool(os.environ.get("TRACEPARSE_REQUIRE_BROWSER"))
    path = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = ("chromium is not installed (apt-get install chromium)" if path is None
               else "playwright is not installed (pip install -e '.[dev]')" if sync_playwright is None else None)
    if missing:
        if required:
            pytest.fail(f"TRACEPARSE_REQUIRE_BROWSER is set but {missing}")
        pytest.skip(missing)
    return path, sync_playwright


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless Chromium for the module, with a fresh profile directory and no network-facing services."""
    path, sync_playwright = browser_or_skip()
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(profile), executable_path=path, headless=True,
                                                       args=CHROMIUM_FLAGS, viewport=VIEWPORT)
        try:
            yield context
        finally:
            context.close()


class Opened:
    """A report open in the browser, and what went wrong while it loaded."""

    def __init__(self, page, problems: list[str]):
        self.page = page
        self.problems = problems

    def charts(self) -> dict[str, list[dict]]:
        """Every chart div's traces as plotly drew them: {div id: [{type, name, points, x, y, values}]}."""
        return self.page.evaluate("""() => {
          const out = {};
          document.querySelectorAll('div.chart').forEach(div => {
            out[div.id] = (div._fullData || []).map(t => ({
              type: t.type, name: t.name, x: t.x ? Array.from(t.x) : null, y: t.y ? Array.from(t.y) : null,
              values: t.values ? Array.from(t.values) : null, labels: t.labels ? Array.from(t.labels) : null,
              base: t.base ? Array.from(t.base) : null,
              customdata: t.customdata ? Array.from(t.customdata) : null,
              z: t.z ? Array.from(t.z, row => Array.from(row)) : null,
              points: (t.x || t.values || []).length,
              drawn: div.querySelectorAll('.main-svg').length}));
          });
          return out;
        }""")


def open_report(context, path: Path, screenshot: Path, publish: bool = True) -> Opened:
    """Open ``path`` in a new tab, wait until every chart is drawn, save a screenshot of the first screen (and,
    with ``publish``, a copy in $TRACEPARSE_SCREENSHOTS when set)."""
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: None if r.url.startswith(("file:", "data:", "blob:", "about:"))
            else problems.append(f"request: {r.url}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function("""() => Array.from(document.querySelectorAll('div.chart'))
                                 .every(d => d._fullLayout && d.querySelector('.main-svg'))""", timeout=30_000)
    page.screenshot(path=str(screenshot))
    out = os.environ.get("TRACEPARSE_SCREENSHOTS")
    if out and publish:
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(screenshot, Path(out) / screenshot.name)
    return Opened(page, problems)


def shown(path: Path) -> str:
    """``path`` relative to the working directory where it is under it (as a user types it; the page shows it)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def report(tmp_path: Path, *args: str) -> Path:
    """Run ``traceparse report ARGS --html FILE`` in-process; the file's path."""
    out = tmp_path / "report.html"
    code, stdout, err = run_cli("report", *args, "--html", str(out), "-q")
    assert code == 0, err
    assert out.stat().st_size > 1_000_000  # plotly.js is inside
    return out


def check_drawn(opened: Opened, expected: set[str]) -> dict[str, list[dict]]:
    """No problem while loading; exactly the ``expected`` charts, each drawn with at least one trace of data."""
    assert opened.problems == []
    charts = opened.charts()
    assert set(charts) == expected
    for chart_id, traces in charts.items():
        assert traces, chart_id
        assert all(t["drawn"] > 0 for t in traces), chart_id
        assert any(t["points"] > 0 for t in traces), chart_id
    return charts


#: What overlaps on the page: in each chart, plotly's toolbar, titles (the figure's, the subplots', the axes'),
#: legend and colour bar against each other; a chart wider than its card; summary or chart cards over each other.
OVERLAPS_JS = """() => {
  const boxes = (root, sel) => Array.from(root.querySelectorAll(sel)).map(e => [sel, e.getBoundingClientRect()])
      .filter(([s, r]) => r.width > 0 && r.height > 0);
  const hit = (a, b) => a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 && b.top < a.bottom - 1;
  const out = [];
  document.querySelectorAll('div.chart').forEach(div => {
    const parts = ['.modebar', '.infolayer .gtitle', '.annotation', '.g-xtitle', '.g-ytitle', '.legend', '.colorbar']
      .flatMap(sel => boxes(div, sel));
    for (let i = 0; i < parts.length; i++) for (let j = i + 1; j < parts.length; j++)
      if (hit(parts[i][1], parts[j][1])) out.push(div.id + ': ' + parts[i][0] + ' overlaps ' + parts[j][0]);
    const card = div.closest('.card').getBoundingClientRect();
    const svg = div.querySelector('.main-svg').getBoundingClientRect();
    if (svg.right > card.right + 1 || svg.left < card.left - 1) out.push(div.id + ': wider than its card');
  });
  for (const sel of ['.charts > .card', '.cards > .card']) {
    const cards = boxes(document, sel);
    for (let i = 0; i < cards.length; i++) for (let j = i + 1; j < cards.length; j++)
      if (hit(cards[i][1], cards[j][1])) out.push(sel + ' ' + i + ' overlaps ' + j);
  }
  return out;
}"""


def check_layout(opened: Opened, screenshot: Path) -> None:
    """With every finding opened (their tables shown): nothing overlaps (:data:`OVERLAPS_JS`), and a screenshot
    of the whole page is as wide as the window (1400 px): no table or chart makes the page scroll sideways,
    wide tables scroll inside their card."""
    page = opened.page
    page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    assert page.evaluate(OVERLAPS_JS) == []
    png = page.screenshot(path=str(screenshot), full_page=True)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == VIEWPORT["width"]  # the IHDR width of the whole page
    assert page.evaluate("document.documentElement.scrollWidth") == VIEWPORT["width"]
    assert page.evaluate("""() => Array.from(document.querySelectorAll('.tablewrap'))
        .every(w => w.getBoundingClientRect().right <= w.closest('details, .card').getBoundingClientRect().right)""")


def findings_on_page(opened: Opened) -> list[tuple[str, str, str]]:
    """(severity, rule, title) of every finding section of the page, in its order."""
    return opened.page.evaluate("""() => Array.from(document.querySelectorAll('details.finding')).map(d => {
        const s = d.querySelector('summary');
        return [s.querySelector('.sev').textContent.toLowerCase(), s.querySelector('.rule').textContent,
                s.textContent.split(': ').slice(1).join(': ')];
      })""")


def analyzed(*args: str) -> list[dict]:
    code, out, err = run_cli("analyze", "--json", *args)
    assert code in (0, 1), err
    return json.loads(out)["findings"]


def union_length(spans: list[tuple[int, int]]) -> int:
    """Length of the union of half-open intervals, computed here (independent of traceparse.intervals)."""
    total, cur_start, cur_end = 0, None, None
    for start, end in sorted(spans):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    return total + (cur_end - cur_start if cur_end is not None else 0)


def timeline_busy_ns(traces: list[dict]) -> dict[str, float]:
    """The busy time each member of the timeline stands for: Σ busy % × bin width (equal bins, centres one width
    apart), from its lines, or from the rows of its heatmap."""
    out = {}
    for t in traces:
        width_ns = (t["x"][1] - t["x"][0]) * 1e6
        rows = zip(t["y"], t["z"]) if t["type"] == "heatmap" else [(t["name"], t["y"])]
        for label, pct in rows:
            out[label] = sum(pct) / 100.0 * width_ns
    return out


def raw_torch(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f, parse_float=Decimal)["traceEvents"]


def torch_gpu_figures(events: list[dict]) -> tuple[int, dict[str, int], set[int]]:
    """From the raw JSON: busy time (union of GPU events), kernel time per name, host ProfilerStep numbers."""
    spans, by_name, steps = [], defaultdict(int), set()
    for e in events:
        if e.get("ph") != "X":
            continue
        if e.get("cat") in GPU_CATS:
            start = us_to_ns(e["ts"])
            spans.append((start, start + us_to_ns(e["dur"])))
            if e["cat"] == "kernel":
                by_name[e["name"]] += us_to_ns(e["dur"])
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"):
            steps.add(int(e["name"].split("#")[1]))
    return union_length(spans), dict(by_name), steps


# -- the four reports --------------------------------------------------------------------------------------
def test_torch_trace_report(browser, store, tmp_path):
    page = open_report(browser, report(tmp_path, shown(TORCH)), tmp_path / "report_torch.png")
    charts = check_drawn(page, {"chart-critical-path", "chart-timeline", "chart-steps", "chart-categories",
                                "chart-names", "chart-copies", "chart-roofline"})  # the roofline from the shapes
    assert "derived from the recorded shapes" in page.page.inner_text("#chart-roofline-card .chart-note")
    busy, by_name, steps = torch_gpu_figures(raw_torch(TORCH))
    # the critical path, a row per thread and stream: each step's segments tile it up to its end (raw JSON)
    windows = {int(e["name"].split("#")[1]): (us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
               for e in raw_torch(TORCH) if e.get("ph") == "X" and e.get("cat") == "user_annotation"
               and e["name"].startswith("ProfilerStep#")}
    t0 = min(a for a, _ in windows.values())
    path = [(b, b + x, c[2]) for t in charts["chart-critical-path"] if t["type"] == "bar" and t["name"] != "step"
            for b, x, c in zip(t["base"], t["x"], t["customdata"])]
    assert all(y.startswith(("thread ", "stream ")) for t in charts["chart-critical-path"] for y in t["y"])
    for n, (a, b) in windows.items():
        mine = sorted(p[:2] for p in path if p[2] == n)
        assert mine[0][0] >= (a - t0) / 1e6 - 1e-6 and mine[-1][1] == pytest.approx((b - t0) / 1e6, abs=1e-6)
        assert all(p[1] == pytest.approx(q[0], abs=1e-6) for p, q in zip(mine, mine[1:]))
    # the timeline's one line holds the GPU's busy time, to the rounding of its percentages (3 decimals per bin)
    assert timeline_busy_ns(charts["chart-timeline"]) == {"GPU 0": pytest.approx(busy, rel=1e-4)}
    # the 15 longest kernel names, longest on top (the last of the reversed list); the rest named in the note
    bar = charts["chart-names"][0]
    top = sorted(by_name.values(), reverse=True)
    assert bar["x"][::-1] == pytest.approx([t / 1e6 for t in top[:15]], rel=1e-12)
    note = page.page.inner_text("#chart-names-card .chart-note")
    assert f"the other {len(top) - 15} names take " in note
    pie = charts["chart-categories"][0]
    assert sum(pie["values"]) == pytest.approx(sum(by_name.values()) / 1e6, rel=1e-12)
    # one group of bars per step, each step's busy + idle = the step's window
    busy_bars = charts["chart-steps"][0]
    assert busy_bars["x"] == [f"step {n}" for n in sorted(steps)]
    summary = page.page.inner_text("#summary")
    assert f"{len(steps)} ×" in summary
    # every finding of analyze, most severe first
    expected = analyzed(str(TORCH))
    on_page = findings_on_page(page)
    assert sorted((f["severity"], f["rule"], f["title"]) for f in expected) == sorted(map(tuple, on_page))
    ranks = [("critical", "warning", "info").index(s) for s, _, _ in on_page]
    assert ranks == sorted(ranks)
    check_layout(page, tmp_path / "report_torch_full.png")


def test_nsys_capture_report(browser, store, tmp_path):
    page = open_report(browser, report(tmp_path, shown(NSYS)), tmp_path / "report_nsys.png")
    # its one NVTX train_step range is its one step, as in the summary and analyze --step
    charts = check_drawn(page, {"chart-critical-path", "chart-timeline", "chart-steps", "chart-categories",
                                "chart-names", "chart-copies"})
    assert charts["chart-steps"][0]["x"] == ["step 1"]
    db = tmp_path / "capture.sqlite"
    with gzip.open(NSYS) as f, open(db, "wb") as g:
        shutil.copyfileobj(f, g)
    con = sqlite3.connect(db)
    try:
        spans = [tuple(r) for t in ("KERNEL", "MEMCPY", "MEMSET")
                 for r in con.execute(f"SELECT start, end FROM CUPTI_ACTIVITY_KIND_{t}")]
        names = dict(con.execute("SELECT s.value, SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                 "JOIN StringIds s ON s.id = k.demangledName GROUP BY s.value"))
        copies = dict(con.execute("SELECT copyKind, SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind"))
    finally:
        con.close()
    assert timeline_busy_ns(charts["chart-timeline"]) == {"GPU 0": pytest.approx(union_length(spans), rel=1e-4)}
    bar = charts["chart-names"][0]
    top = sorted(names.values(), reverse=True)[:15]
    assert bar["x"][::-1] == pytest.approx([t / 1e6 for t in top], rel=1e-12)
    copy_bytes = charts["chart-copies"][0]  # bytes (MB) per direction; CUPTI copyKind 1 = HtoD, 2 = DtoH
    assert sorted(copy_bytes["y"]) == pytest.approx(sorted(v / 1e6 for v in copies.values()), rel=1e-12)
    assert len(findings_on_page(page)) == len(analyzed(str(NSYS)))
    check_layout(page, tmp_path / "report_nsys_full.png")


def test_ncu_page_report(browser, store, tmp_path):
    page = open_report(browser, report(tmp_path, shown(NCU)), tmp_path / "report_ncu.png")
    charts = check_drawn(page, {"chart-categories", "chart-names", "chart-roofline"})
    code, out, err = run_cli("roofline", str(NCU), "--json", "--group", "name")
    assert code == 0, err
    items = [i for i in json.loads(out)["items"]
             if (i["arithmetic_intensity"] or 0) > 0 and (i["achieved_gflops"] or 0) > 0]
    points = [t for t in charts["chart-roofline"] if t["name"] and not t["name"].endswith(" roof")]
    assert sum(t["points"] for t in points) == len(items)
    drawn = sorted(x for t in points for x in t["x"])
    assert drawn == pytest.approx(sorted(i["arithmetic_intensity"] for i in items), rel=1e-12)
    roofs = [t for t in charts["chart-roofline"] if t["name"].endswith(" roof")]
    assert {"DRAM roof", "fp32 roof"} <= {t["name"] for t in roofs}
    # no timed GPU activity on an ncu page: the page says why there is no timeline
    assert "GPU busy over time: the trace has no timed kernels" in page.page.inner_text("main")
    assert len(findings_on_page(page)) == len(analyzed(str(NCU)))
    check_layout(page, tmp_path / "report_ncu_full.png")


def host_steps_ns(events: list[dict]) -> list[int]:
    """The host-side ProfilerStep#N durations of a torch trace (its GPU-side twins are left out)."""
    return [us_to_ns(e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
            and e["name"].startswith("ProfilerStep#")]


def raw_arrivals(run_dir: Path, ranks: int) -> list[dict[int, int]]:
    """Each collective of a gloo run from the raw JSON: {rank: arrival ns}, the n-th ``c10d::*`` call of each
    rank being the n-th collective (the runs have no sequence numbers), in the order the last rank arrives."""
    calls = {}
    for rank in range(ranks):
        calls[rank] = sorted(us_to_ns(e["ts"]) for e in raw_torch(run_dir / f"rank{rank}.json.gz")
                             if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["name"].startswith("c10d::"))
    assert len({len(c) for c in calls.values()}) == 1
    instances = [{rank: calls[rank][i] for rank in calls} for i in range(len(calls[0]))]
    return sorted(instances, key=max)


def check_straggler_charts(charts: dict, run_dir: Path, straggler: int) -> None:
    """The run's collectives chart and step time per rank against the raw JSON: each rank's lateness at each
    collective, the wait caused there by the rank that arrived last, and each rank's mean step; the straggler
    is the line far above the others and the rank the others wait for."""
    instances = raw_arrivals(run_dir, 4)
    lines = {t["name"]: t["y"] for t in charts["chart-collectives"] if t["type"] == "scatter"}
    assert sorted(lines) == [f"rank {r}" for r in range(4)]
    for rank in range(4):
        expected = [(i[rank] - min(i.values())) / 1e6 for i in instances]
        assert lines[f"rank {rank}"] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    bars = {t["name"]: t["y"] for t in charts["chart-collectives"] if t["type"] == "bar"}
    # each rank's waiting counted once (gloo keeps two collectives in flight), at the collective it waited for
    # first, and only inside its ProfilerStep#N windows
    steps_of = {r: [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
                    for e in raw_torch(run_dir / f"rank{r}.json.gz")
                    if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("ProfilerStep#")] for r in range(4)}
    counted = [dict.fromkeys(range(4), 0) for _ in instances]
    for r in range(4):
        held = 0
        for n in sorted(range(len(instances)), key=lambda n: (instances[n][r], max(instances[n].values()))):
            a, b = instances[n][r], max(instances[n].values())
            start = max(a, held)
            held = max(held, b)
            counted[n][r] = sum(max(0, min(b, e) - max(start, s)) for s, e in steps_of[r]) if b > start else 0
    caused: dict[int, float] = defaultdict(float)
    for n, inst in enumerate(instances):
        last = max(inst, key=lambda r: (inst[r], -r))
        wait = sum(counted[n].values()) / 1e6
        caused[last] += wait
        assert bars[f"rank {last} last"][n] == pytest.approx(wait, rel=1e-9)
    assert sum(bars[f"rank {straggler} last"]) == pytest.approx(caused[straggler], rel=1e-9)
    assert caused[straggler] > 0.8 * sum(caused.values())  # most of the waiting is for the straggler
    lateness = {r: max(lines[f"rank {r}"]) for r in range(4)}
    assert all(lateness[straggler] > 10 * lateness[r] for r in range(4) if r != straggler)
    parts = {t["name"]: t for t in charts["chart-ranks"]}
    assert list(parts) == ["waited at collectives for the last to arrive", "rest of the step"]
    waited, rest = parts["waited at collectives for the last to arrive"], parts["rest of the step"]
    assert waited["y"] == [f"rank {r}" for r in range(4)]
    for i, rank in enumerate(range(4)):  # each rank's bar is its mean step, from its ProfilerStep#N annotations
        steps = host_steps_ns(raw_torch(run_dir / f"rank{rank}.json.gz"))
        assert waited["x"][i] + rest["x"][i] == pytest.approx(sum(steps) / len(steps) / 1e6, rel=1e-9)
        assert 0 <= waited["x"][i] <= waited["x"][i] + rest["x"][i]
    assert min(range(4), key=lambda i: waited["x"][i]) == straggler  # the one the others wait for


RUN_CHARTS = {"chart-collectives", "chart-ranks", "chart-critical-path", "chart-timeline", "chart-steps", "chart-categories", "chart-names",
              "chart-copies"}


def test_run_report(browser, store, tmp_path, samples_dir):
    run_dir = samples_dir / "multirank" / "gloo4_resnet18_bs16_slow_rank2"
    page = open_report(browser, report(tmp_path, os.path.relpath(run_dir)), tmp_path / "report_run.png")
    charts = check_drawn(page, RUN_CHARTS | {"chart-roofline"})  # ResNet18's operators placed from their shapes
    per_rank = {}
    for rank in range(4):
        busy, _, _ = torch_gpu_figures(raw_torch(run_dir / f"rank{rank}.json.gz"))
        per_rank[rank] = busy
    # four members: a heatmap, a row per rank's GPU
    assert [t["type"] for t in charts["chart-timeline"]] == ["heatmap"]
    assert timeline_busy_ns(charts["chart-timeline"]) == {f"rank {r} GPU 0": pytest.approx(busy, rel=1e-4)
                                                          for r, busy in per_rank.items()}
    check_straggler_charts(charts, run_dir, straggler=2)
    assert "world size 4" in page.page.inner_text("main")
    on_page = findings_on_page(page)
    assert len(on_page) == len(analyzed(str(run_dir)))
    assert tuple(on_page[0]) == ("critical", "stragglers", "Straggler: rank 2")
    check_layout(page, tmp_path / "report_run_full.png")


def test_the_slow_rank_run_shows_its_straggler_first(browser, store, tmp_path):
    """The bundled slow-rank run (always present): the run's charts come first and show rank 2 standing out,
    figures from the raw JSON; the straggler's finding opens the findings and the worst findings, and the
    summary names it; at 1400 px nothing overlaps and the page does not scroll sideways (screenshot)."""
    run_dir = FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2"
    page = open_report(browser, report(tmp_path, shown(run_dir)), tmp_path / "report_slow_rank.png", publish=False)
    charts = check_drawn(page, RUN_CHARTS)
    order = page.page.evaluate("Array.from(document.querySelectorAll('div.chart')).map(d => d.id)")
    assert order[:2] == ["chart-collectives", "chart-ranks"]
    check_straggler_charts(charts, run_dir, straggler=2)
    on_page = findings_on_page(page)
    assert tuple(on_page[0]) == ("critical", "stragglers", "Straggler: rank 2")
    worst = page.page.inner_text("ul.worst").splitlines()
    assert worst[0].startswith("CRITICAL stragglers: Straggler: rank 2")
    summary = page.page.inner_text("#summary")
    assert "STRAGGLER" in summary and "rank 2: the others wait" in summary
    check_layout(page, tmp_path / "report_slow_rank_full.png")


def check_critical_path_chart(traces: list[dict], run_dir: Path, slow: int | None) -> None:
    """The critical-path chart against the raw JSON: the grey bars are every rank's ProfilerStep#N windows (ms
    from the first step's start); per step, the path drawn is that of the rank whose step took longest: its
    segments tile that step up to its end, without overlapping; with ``slow``, every step's path holds the slow
    rank's sleep (a host op of at least 55 ms on its row) and moves to that rank."""
    windows = {}
    for rank in range(4):
        for e in raw_torch(run_dir / f"rank{rank}.json.gz"):
            if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"):
                windows[(rank, int(e["name"].split("#")[1]))] = (us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
    t0 = min(a for a, _ in windows.values())
    step = next(t for t in traces if t["name"] == "step")
    drawn = sorted(zip(step["y"], step["base"], step["x"]))
    want = sorted((f"rank {r}", (a - t0) / 1e6, (b - a) / 1e6) for (r, _), (a, b) in windows.items())
    assert [d[0] for d in drawn] == [w[0] for w in want]
    assert [v for d in drawn for v in d[1:]] == pytest.approx([v for w in want for v in w[1:]], rel=1e-9, abs=1e-6)
    bars = sorted((b, b + x, y, t["name"], c[2]) for t in traces if t["type"] == "bar" and t["name"] != "step"
                  for y, b, x, c in zip(t["y"], t["base"], t["x"], t["customdata"]))
    for n in sorted({n for _, n in windows}):
        holder = max(range(4), key=lambda r: (windows[(r, n)][1] - windows[(r, n)][0], -r))
        a, b = ((v - t0) / 1e6 for v in windows[(holder, n)])
        mine = [s for s in bars if s[4] == n]
        assert mine and a - 1e-6 <= mine[0][0] and mine[-1][1] == pytest.approx(b, abs=1e-6)
        assert all(p[1] == pytest.approx(q[0], abs=1e-6) for p, q in zip(mine, mine[1:]))  # tiled, no overlap
        if slow is not None:
            assert any(s[2] == f"rank {slow}" and s[3] == "host op" and s[1] - s[0] >= 55 for s in mine)
    if slow is not None:
        line = next(t for t in traces if t["name"] == "to another rank")
        assert f"rank {slow}" in line["y"]


def test_the_critical_path_chart(browser, store, tmp_path, samples_dir):
    """The trimmed slow-rank run (always here) and the whole one (a shared sample): the critical path of each
    step over the ranks' steps, against the raw JSON (:func:`check_critical_path_chart`)."""
    runs = [(FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2", None),
            (samples_dir / "multirank" / "gloo4_resnet18_bs16_slow_rank2", 2)]
    for run_dir, slow in runs:
        if not run_dir.exists():
            continue
        page = open_report(browser, report(tmp_path, shown(run_dir)), tmp_path / f"report_cp_{run_dir.name}.png",
                           publish=False)
        shapes = {"chart-roofline"} if slow else set()  # the whole run's operators placed from their shapes
        charts = check_drawn(page, RUN_CHARTS | shapes)
        check_critical_path_chart(charts["chart-critical-path"], run_dir, slow)
        note = page.page.inner_text("#chart-critical-path-card .chart-note")
        assert note.startswith("Per step (3), the critical path of the rank whose step took longest")


def test_a_chart_without_data_is_left_out(browser, store, tmp_path):
    """A TAU profile's copies have time but no bytes: the copies chart draws the time only (no empty bytes
    panel on a −1…1 axis) and says why; every drawn bar has data."""
    path = FIXTURES / "tau" / "real" / "apex-cuda"
    page = open_report(browser, report(tmp_path, shown(path)), tmp_path / "report_tau.png", publish=False)
    charts = check_drawn(page, {"chart-categories", "chart-names", "chart-copies"})
    assert [t["name"] for t in charts["chart-copies"]] == ["time"]
    assert all(any(v for v in t["y"] or t["x"] or t["values"] or []) for ts in charts.values() for t in ts
               if t["type"] in ("bar", "pie"))
    titles = page.page.evaluate("Array.from(document.querySelectorAll('#chart-copies .annotation')).map(a => "
                                "a.textContent)")
    assert titles == ["time (ms)"]
    assert "The trace gives no bytes for its copies" in page.page.inner_text("#chart-copies-card .chart-note")
    check_layout(page, tmp_path / "report_tau_full.png")


# -- untrusted names ---------------------------------------------------------------------------------------
HOSTILE_KERNEL = '<img src=x onerror="alert(1)">'
HOSTILE_OP = "</script><script>alert(2)</script>"


def hostile_trace(path: Path) -> Path:
    """A small torch trace whose kernel and operator names are HTML and script."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": 100}]
    for i in range(3):
        events.append({"ph": "X", "cat": "cpu_op", "name": HOSTILE_OP, "pid": 1, "tid": 1, "ts": 10 + 20 * i,
                       "dur": 5, "args": {"External id": i}})
        events.append({"ph": "X", "cat": "kernel", "name": HOSTILE_KERNEL, "pid": 0, "tid": 7, "ts": 12 + 20 * i,
                       "dur": 8, "args": {"device": 0, "stream": 7, "correlation": 100 + i, "External id": i}})
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [], "traceEvents": events}))
    return path


def test_hostile_names_are_text(browser, store, tmp_path):
    trace = hostile_trace(tmp_path / "hostile.json")
    code, _, err = run_cli("ingest", str(trace), "--tag", "note=<b>bold</b>", "-q")
    assert code == 0, err
    out = report(tmp_path)  # no TRACE: the last ingested
    text = out.read_text()
    assert HOSTILE_KERNEL not in text and HOSTILE_OP not in text and "<b>bold</b>" not in text
    page = open_report(browser, out, tmp_path / "report_hostile.png", publish=False)
    charts = check_drawn(page, {"chart-critical-path", "chart-timeline", "chart-steps", "chart-categories",
                                "chart-names"})
    main = page.page.text_content("main")  # closed findings (info) included
    assert HOSTILE_KERNEL in main and HOSTILE_OP in main and "note=<b>bold</b>" in main
    assert page.page.evaluate("document.querySelectorAll('img, main script, b').length") == 0
    # plotly shows the escaped name as written, on the axis and in the data
    assert charts["chart-names"][0]["y"] == ['&lt;img src=x onerror="alert(1)"&gt;']
    ticks = page.page.evaluate("Array.from(document.querySelectorAll('#chart-names .ytick text'))"
                               ".map(t => t.textContent)")
    assert ticks == [HOSTILE_KERNEL]


# -- without a browser -------------------------------------------------------------------------------------
def test_missing_plotly_is_one_line(store, tmp_path, monkeypatch):
    for name in ("plotly", "plotly.graph_objects", "plotly.io", "plotly.offline", "plotly.subplots"):
        monkeypatch.setitem(sys.modules, name, None)
    code, out, err = run_cli("report", str(TORCH), "--html", str(tmp_path / "r.html"))
    assert (code, out) == (2, "")
    assert err == ("traceparse: error: report --html needs plotly, which is not installed: "
                   "pip install 'traceparse[html]'\n")
    assert not (tmp_path / "r.html").exists()


def test_bad_arguments(store, tmp_path):
    code, _, err = run_cli("report", str(TORCH), "--html", str(tmp_path / "r.txt"))
    assert (code, err) == (2, f"traceparse: error: --html {tmp_path / 'r.txt'}: expected a .html file name\n")
    code, _, err = run_cli("report", str(TORCH), str(NCU), "--html", str(tmp_path / "r.html"))
    assert (code, err) == (2, "traceparse: error: report takes one trace or run; these 2 paths make 2 traces: "
                              "report each one\n")
    code, _, err = run_cli("report", str(TORCH), "--html", str(tmp_path / "r.html"), "--bins", "0")
    assert (code, err) == (2, "traceparse: error: --bins 0: expected a positive number of bins\n")


def test_the_csv_reports_of_one_capture_make_one_report(store, tmp_path):
    pytest.importorskip("plotly")
    paths = sorted(str(p) for p in (FIXTURES / "nsys").glob("resnet18_bs8_*.csv"))
    assert len(paths) > 1
    out = report(tmp_path, *paths)
    assert "resnet18_bs8_" in out.read_text()


def test_summary_figures_against_the_raw_json(store):
    """The summary's GPU busy % and step time, from the torch fixture's raw JSON."""
    from traceparse_plugins.commands.report.summary import summarize

    from traceparse.ingest import read_paths

    trace = read_paths([TORCH])[0]
    summary = summarize(trace, [])
    events = raw_torch(TORCH)
    busy, _, steps = torch_gpu_figures(events)
    gpu = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in events
           if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    span = max(end for _, end in gpu) - min(start for start, _ in gpu)
    assert summary["gpu_busy_pct"] == pytest.approx(100.0 * busy / span, abs=5e-5)  # rounded to 4 decimals
    durations = [us_to_ns(e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                 and e["name"].startswith("ProfilerStep#")]
    assert summary["steps"] == len(steps) == len(durations)
    assert summary["step_time_ns"] == pytest.approx(sum(durations) / len(durations), abs=0.5)  # whole ns
    assert (summary["step_min_ns"], summary["step_max_ns"]) == (min(durations), max(durations))
    assert summary["bottleneck"] is None and summary["worst"] == []  # no findings given


def test_binned_busy_time_adds_up_to_the_union():
    """Any split of the time into windows gives back exactly the union's length (B(b) - B(a) per window)."""
    import numpy as np

    from traceparse_plugins.commands.report.data import busy_until

    rng = np.random.default_rng(7)
    raw = sorted((int(s), int(s + d)) for s, d in zip(rng.integers(0, 10_000, 300), rng.integers(1, 200, 300)))
    merged: list[list[int]] = []
    for s, e in raw:
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    starts = np.array([m[0] for m in merged], dtype=np.int64)
    ends = np.array([m[1] for m in merged], dtype=np.int64)
    edges = np.array(sorted({0, 10_300, *rng.integers(0, 10_300, 50).tolist()}), dtype=np.int64)
    per_window = np.diff(busy_until(starts, ends, edges))
    assert int(per_window.sum()) == union_length(raw)
    for a, b, got in zip(edges[:-1], edges[1:], per_window):  # each window against a direct clip
        assert got == sum(max(0, min(e, b) - max(s, a)) for s, e in merged)


def test_a_long_run_draws_its_slowest_steps_paths(monkeypatch):
    """A chart of millions of bars opens in no browser (the 1 GB trace's 420 steps: 3.2 million segments, a
    290 MB page): beyond MAX_PATH_SEGMENTS the slowest steps' paths are drawn, as many as fit, and the note says so."""
    from collections import Counter

    import plotly.graph_objects as go

    from helpers import read_torch
    from traceparse_plugins.commands.report import charts, data

    events = read_torch(FIXTURES / "torch" / "mlp_no_profilerstep_60.json.gz").events
    events = events.with_columns(trace_id=pl.lit("t"))  # as stored: the paths are keyed by trace
    whole = data.critical_path(events)
    assert whole["paths_drawn"] == whole["paths"] == 60
    assert "slowest" not in charts.critical_path_chart(go, whole).note
    count = Counter(s["step"] for s in whole["segments"])
    length = {s["step"]: s["end_ns"] - s["start_ns"] for s in whole["steps"]}
    slowest = sorted(length, key=lambda step: (-length[step], step))
    monkeypatch.setattr(data, "MAX_PATH_SEGMENTS", sum(count[step] for step in slowest[:5]))
    cut = data.critical_path(events)
    assert cut["paths_drawn"] == 5 and cut["paths"] == 60
    assert {s["step"] for s in cut["segments"]} == set(slowest[:5])
    assert len(cut["segments"]) == sum(count[step] for step in slowest[:5])
    assert {s["step"] for s in cut["steps"]} == set(length)  # every step's own bar is still drawn
    assert "Only the 5 slowest steps' paths of 60 are drawn" in charts.critical_path_chart(go, cut).note
    monkeypatch.setattr(data, "MAX_PATH_SEGMENTS", 1)
    assert data.critical_path(events)["paths_drawn"] == 1  # the slowest, whatever its size


def test_control_and_direction_characters_are_shown_not_written(tmp_path):
    """Hand-made mutant of a real trace: a kernel named with ESC, BEL, NUL, a carriage return and a right-to-left
    override, in a file whose name holds the override too. The page wrote them raw (NUL and C0 characters are
    HTML parse errors; U+202E reverses what follows it), and a carriage return became a line break. They are
    written as the terminal shows them (``\\x1b``, ``\\u202e``), outside the charting library's own script."""
    import gzip
    import json
    import re

    doc = json.load(gzip.open(FIXTURES / "torch" / "alexnet_bs4.json.gz"))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    hostile = "evil\x1b[2J\x07bell\x00nul\rcr\u202egol.exe\u200bzw"
    first = kernels[0]["name"]
    for e in kernels:
        if e["name"] == first:
            e["name"] = hostile
    path = tmp_path / "run\u202egol.json"
    path.write_text(json.dumps(doc))
    page = tmp_path / "r.html"
    code, out, err = run_cli("--store", str(tmp_path / "s"), "-q", "report", str(path), "--html", str(page))
    assert code == 0, err
    text = page.read_text(encoding="utf-8")
    ours = re.sub(r"<script\b.*?</script>", "", text, flags=re.S)  # plotly.js carries binary magic numbers
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f\u200b\u202a-\u202e]", ours)
    assert "evil\\x1b[2J\\x07bell\\x00nul\\rcr\\u202egol.exe\\u200bzw" in ours
    assert "run\\u202egol.json" in re.search(r"<title>(.*?)</title>", ours).group(1)
    charts = "".join(re.findall(r'<script type="application/json"[^>]*>(.*?)</script>', text, flags=re.S))
    # chart labels: the escapes shown (a JSON string's backslash, doubled), not the characters
    assert '"evil\\\\x1b[2J\\\\x07bell\\\\x00nul\\\\rcr\\\\u202egol.exe\\\\u200bzw"' in charts
    assert "\u202e" not in charts


def test_the_findings_heading_counts_what_the_terminal_counts(store, tmp_path):
    """The page's "Findings (N: ...)" is the terminal's "N findings: ...": rules with nothing to report are named
    after the tally, not counted in N (the page said 15 where the terminal said 11 on this fixture, the 11 being
    1 critical + 1 warning + 9 info, and 4 more rules with nothing to report)."""
    pytest.importorskip("plotly")
    import re

    out = report(tmp_path, str(TORCH))
    heading = re.search(r'<h2>Findings <span class="muted">\((.*?)\)</span></h2>', out.read_text()).group(1)
    code, text, err = run_cli("--width", "200", "analyze", str(TORCH))
    assert code == 0, err
    last = text.strip().splitlines()[-1]  # "11 findings: 1 critical, 1 warning, 9 info; 4 rules with nothing ..."
    n, counts = re.fullmatch(r"(\d+) findings: (.*)", last).groups()
    said = re.match(r"(\d+) critical, (\d+) warnings?, (\d+) info;", counts).groups()
    assert int(n) == sum(int(x) for x in said)
    assert heading == f"{n}: {counts}"


def test_gpu_busy_says_of_what_as_the_terminal_does(store, tmp_path, samples_dir):
    """GPU busy on the page is a share of the same whole as in the terminal's summary: "of the GPU's span" of one
    GPU, "of the mean GPU's span" of two (the page said "of the devices' GPU span" of both). The two-GPU figure is
    recomputed from the raw JSON: 100 × Σ busy (union per device) / Σ span (first to last activity per device)."""
    pytest.importorskip("plotly")
    import re

    def card(path: Path) -> tuple[str, str]:
        page = report(tmp_path, str(path)).read_text()
        return re.search(r'<div class="label">GPU busy</div><div class="big">([^<]*)</div>'
                         r'<div class="muted">([^<]*)</div>', page).groups()

    assert card(TORCH)[1] == "of the GPU&#39;s span (first to last activity)"
    dp2 = samples_dir / "torch" / "dp2_resnet18_bs16.json.gz"
    events = raw_torch(dp2)
    spans: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            start = us_to_ns(e["ts"])
            args = e["args"]  # a peer copy names its device inDevice, not device
            spans[args.get("device", args.get("inDevice"))].append((start, start + us_to_ns(e["dur"])))
    assert len(spans) == 2
    busy = sum(union_length(s) for s in spans.values())
    whole = sum(max(b for _, b in s) - min(a for a, _ in s) for s in spans.values())
    value, said = card(dp2)
    assert value == f"{100 * busy / whole:.1f}%" == "7.5%"
    assert said == "of the mean GPU&#39;s span (first to last activity)"
    code, out, err = run_cli("--width", "200", "analyze", str(dp2), "--rule", "gpu-idle")
    assert code == 0, err
    assert "GPU busy     7.5% of the mean GPU's span (first to last activity)" in out
