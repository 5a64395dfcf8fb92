"""``traceparse predict`` on the real ResNet18 / VGG16 / AlexNet batch sweep (fixtures/torch, 4..64).

Step times, FLOPs, parameter counts and the end-to-end fits are recomputed here from the raw JSON with the
json module and numpy, independently of the plugin; architecture facts (layers per network) are known."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from helpers import FIXTURES, run_cli, us_to_ns as _ns
from traceparse.schema import SCHEMA_VERSION
from traceparse.session import Session

TORCH = FIXTURES / "torch"
NETWORKS = ("resnet18", "vgg16", "alexnet")
BATCHES = (4, 8, 16, 32, 64)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [e for e in json.load(f, parse_float=Decimal)["traceEvents"] if e.get("ph") == "X"]


def _step_ns(path: Path) -> float:
    """Mean duration of the host-side ProfilerStep#N annotations."""
    steps = [_ns(e["dur"]) for e in _events(path)
             if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    assert len(steps) == 2
    return sum(steps) / len(steps)


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("predict") / "store"
    session = Session(store=root, quiet=True)
    for network in NETWORKS:
        for batch in BATCHES:
            session.ingest([str(TORCH / f"{network}_bs{batch}.json.gz")], tags={"batch": str(batch),
                                                                                "model": network})
    return str(root)


@pytest.fixture(scope="module")
def fitted(sweep_store, tmp_path_factory) -> tuple[dict, Path, str]:
    model_path = tmp_path_factory.mktemp("model") / "model.json"
    ids = [m.id for m in Session(store=sweep_store).store.all_meta()]
    code, out, err = run_cli("--store", sweep_store, "predict", "fit", *ids, "--model-out", str(model_path))
    assert code == 0, err
    return json.loads(model_path.read_text()), model_path, out


def _id(store: str, network: str, batch: int) -> str:
    for m in Session(store=store).store.all_meta():
        if m.tags == {"batch": str(batch), "model": network}:
            return m.id
    raise AssertionError((network, batch))


def test_extrapolation_to_the_largest_batch_matches_an_independent_fit(fitted):
    doc, _, out = fitted
    extra = doc["validation"]["extrapolation_to_largest_batch"]
    assert sorted(r["network"] for r in extra["traces"]) == sorted(NETWORKS)
    apes = []
    for r in extra["traces"]:
        assert r["batch"] == 64
        steps = {b: _step_ns(TORCH / f"{r['network']}_bs{b}.json.gz") for b in BATCHES}
        slope, intercept = np.polyfit([4, 8, 16, 32], [steps[b] for b in (4, 8, 16, 32)], 1)
        predicted = intercept + slope * 64
        assert r["affine"]["measured_ns"] == pytest.approx(steps[64], rel=1e-12)
        assert r["affine"]["predicted_ns"] == pytest.approx(predicted, rel=1e-9)
        ape = 100 * abs(predicted - steps[64]) / steps[64]
        assert r["affine"]["ape_pct"] == pytest.approx(ape, rel=1e-9)
        apes.append(ape)
    mape = extra["mape_pct"]["affine"]
    assert mape == pytest.approx(sum(apes) / 3, rel=1e-9)
    # the command prints the step model's figure, and says honestly whether the 10% goal is met
    step_mape = extra["mape_pct"]["step"]
    verdict = "met" if step_mape <= 10 else "NOT met"
    assert (f"extrapolation MAPE: step time {step_mape:.1f}% (goal ≤ 10%: {verdict}); affine baseline {mape:.1f}%"
            in " ".join(out.split()))
    # per-layer models extrapolate the GPU time of a step to batch 64 within 10% on this sweep
    assert extra["mape_pct"]["layers"] < 10


def test_leave_one_trace_out_end_to_end_matches_an_independent_fit(fitted):
    doc, _, _ = fitted
    loto = doc["validation"]["leave_one_trace_out"]
    assert len(loto["traces"]) == 15
    for r in loto["traces"]:
        others = [b for b in BATCHES if b != r["batch"]]
        steps = {b: _step_ns(TORCH / f"{r['network']}_bs{b}.json.gz") for b in BATCHES}
        slope, intercept = np.polyfit(others, [steps[b] for b in others], 1)
        assert r["affine"]["predicted_ns"] == pytest.approx(intercept + slope * r["batch"], rel=1e-9)
    for side in ("affine", "step"):
        apes = [r[side]["ape_pct"] for r in loto["traces"]]
        assert loto["mape_pct"][side] == pytest.approx(sum(apes) / len(apes), rel=1e-12)


def test_every_gpu_nanosecond_is_attributed_per_step(fitted):
    doc, _, _ = fitted
    for r in doc["validation"]["leave_one_trace_out"]["traces"]:
        path = TORCH / f"{r['network']}_bs{int(r['batch'])}.json.gz"
        gpu = sum(_ns(e["dur"]) for e in _events(path) if e.get("cat") in GPU_CATS)
        assert r["layers"]["measured_ns"] == pytest.approx(gpu / 2, rel=1e-12)  # 2 active steps
    assert all(t["attributed_pct"] == 100.0 and t["steps"] == 2 for t in doc["training"])


def _table(store: str, network: str, batch: int, *extra: str) -> dict[tuple[str, str], tuple[float, float]]:
    code, out, err = run_cli("--store", store, "predict", "table", _id(store, network, batch), *extra)
    assert code == 0, err
    return {(r["layer_type"], r["pass"]): (float(r["calls"]), float(r["ops"]) if r["ops"] else None)
            for r in csv.DictReader(io.StringIO(out))}


@pytest.mark.parametrize("network,conv,linear,relu,pool", [
    ("resnet18", 20, 1, 17, 2), ("vgg16", 13, 3, 15, 6), ("alexnet", 5, 3, 7, 4)])
def test_layer_calls_per_step_are_the_architecture(sweep_store, network, conv, linear, relu, pool):
    table = _table(sweep_store, network, 16)
    assert table[("convolution", "forward")][0] == conv and table[("convolution", "backward")][0] == conv
    assert table[("linear", "forward")][0] == linear
    assert table[("ReLU", "forward")][0] == relu
    assert table[("pooling", "forward")][0] == pool  # max pools + the adaptive average pool
    assert table[("loss", "forward")][0] == 1
    assert (("batch norm", "forward") in table) == (network == "resnet18")


def test_ops_are_the_documented_formulas(sweep_store):
    """Convolution FLOPs from the recorded shapes (output size from stride and padding, the backward's gradients
    from its output_mask), linear FLOPs, and the optimizer's parameter count (ResNet18 has 11,689,512
    parameters)."""
    path = TORCH / "resnet18_bs16.json.gz"
    ops = [e for e in _events(path) if e.get("cat") == "cpu_op"]
    fwd = bwd = 0
    for e in ops:
        dims = e["args"].get("Input Dims")
        concrete = e["args"].get("Concrete Inputs")
        if e["name"] == "aten::conv2d":  # conv2d(input, weight, bias, stride, padding, dilation, groups)
            x, w = dims[0], dims[1]
            stride, padding, dilation = (json.loads(concrete[i]) for i in (3, 4, 5))
            out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in (0, 1)]
            fwd += 2 * x[0] * w[0] * out[0] * out[1] * w[1] * w[2] * w[3]
        elif e["name"] == "aten::convolution_backward":  # (grad_output, input, weight, ..., output_mask)
            mask = [m.strip() == "True" for m in concrete[10].strip("[]").split(",")]
            bwd += (mask[0] + mask[1]) * 2 * math.prod(dims[0]) * math.prod(dims[2][1:])
    linear = sum(2 * math.prod(e["args"]["Input Dims"][0][:-1]) * math.prod(e["args"]["Input Dims"][1])
                 for e in ops if e["name"] == "aten::linear")
    table = _table(sweep_store, "resnet18", 16)
    assert table[("convolution", "forward")][1] == fwd / 2
    assert table[("convolution", "backward")][1] == bwd / 2
    assert table[("linear", "forward")][1] == linear / 2 == 2 * 16 * 512 * 1000
    calls, params = table[("optimizer step", "update")]
    assert params / calls == 11_689_512


def test_table_scales_every_pass_but_the_update_with_the_batch(sweep_store):
    at16 = _table(sweep_store, "resnet18", 16)
    at64 = _table(sweep_store, "resnet18", 16, "--batch", "64")
    for key, (calls, ops) in at16.items():
        assert at64[key][0] == calls
        assert at64[key][1] == (ops if key[1] == "update" else ops * 4)


def test_run_predicts_from_the_model_coefficients(sweep_store, fitted, tmp_path):
    doc, model_path, _ = fitted
    trace = _id(sweep_store, "vgg16", 32)
    code, out, err = run_cli("--store", sweep_store, "predict", "run", "--model", str(model_path), trace,
                             "--batch", "64", "--json")
    assert code == 0, err
    result = json.loads(out)
    coefficients = {(m["layer_type"], m["pass"]): m for m in doc["layer_models"]}
    expected: dict[str, float] = {}
    for (kind, pass_), (calls, ops) in _table(sweep_store, "vgg16", 32, "--batch", "64").items():
        m = coefficients[(kind, pass_)]
        expected[kind] = expected.get(kind, 0.0) + max(0.0, calls * m["b0_ns"] + m["b1_ns_per_op"] * ops)
    assert {k: v["predicted_ns"] for k, v in result["types"].items()} == pytest.approx(expected, rel=1e-9)
    assert result["layers_predicted_ns"] == pytest.approx(sum(expected.values()), rel=1e-9)
    # the step is the replay of the trace's timeline: never shorter than its own GPU time, inside its interval
    low, high = result["step_interval_ns"]
    assert low <= result["step_predicted_ns"] <= high
    assert result["step_predicted_ns"] >= result["device_predicted_ns"]
    assert result["extrapolation"] == {"fitted_min": 4.0, "fitted_max": 64.0, "outside": False, "factor": 1.0}
    # the same through a flops table
    table = tmp_path / "vgg16_bs64.csv"
    assert run_cli("--store", sweep_store, "predict", "table", trace, "--batch", "64", "--out", str(table))[0] == 0
    code, out, err = run_cli("predict", "run", "--model", str(model_path), "--flops-table", str(table),
                             "--network", "vgg16", "--batch", "64", "--json")
    assert code == 0, err
    again = json.loads(out)
    assert again["layers_predicted_ns"] == pytest.approx(result["layers_predicted_ns"], rel=1e-12)
    # no timeline: step = max(H, D) + κ min(H, D), D from the network's own layer models
    net = doc["networks"]["vgg16"]
    device = 0.0
    coefficients = {(m["layer_type"], m["pass"]): m for m in net["layer_models"]}
    for (kind, pass_), (calls, ops) in _table(sweep_store, "vgg16", 32, "--batch", "64").items():
        m = coefficients[(kind, pass_)]
        device += max(0.0, calls * m["b0_ns"] + m["b1_ns_per_op"] * ops)
    host = net["host"]["median_ns"]
    assert again["device_predicted_ns"] == pytest.approx(device, rel=1e-9)
    assert again["step_predicted_ns"] == pytest.approx(max(host, device) + net["kappa"] * min(host, device),
                                                       rel=1e-9)
    assert again["step_predicted_ns"] >= again["device_predicted_ns"]


def test_run_at_the_traces_own_batch_shows_measured_figures(sweep_store, fitted):
    _, model_path, _ = fitted
    code, out, err = run_cli("--store", sweep_store, "predict", "run", "--model", str(model_path),
                             _id(sweep_store, "alexnet", 64))
    assert code == 0, err
    text = " ".join(out.split())
    step = _step_ns(TORCH / "alexnet_bs64.json.gz")
    assert f"(measured {step / 1e6:.3f} ms, error" in text
    assert "measured (ms)" in out and "layers total (GPU time, layer models of every network)" in text


def test_model_of_another_version_is_a_one_line_error(fitted, tmp_path, store):
    doc, _, _ = fitted
    other = tmp_path / "model_v2.json"
    other.write_text(json.dumps({**doc, "version": 1}))
    code, out, err = run_cli("predict", "run", "--model", str(other), "--flops-table", str(other))
    assert code == 2 and out == ""
    assert err == (f"traceparse: error: {other}: version: model format version 1; this traceparse reads version 2 "
                   "(fit the model again with `traceparse predict fit`)\n")
    not_model = tmp_path / "x.json"
    not_model.write_text("{}")
    code, _, err = run_cli("predict", "run", "--model", str(not_model), "--flops-table", str(other))
    assert code == 2
    assert err == (f'traceparse: error: {not_model}: not a traceparse predict model (expected "format": '
                   '"traceparse-predict-model")\n')


def test_too_few_traces_and_missing_tags_are_errors(store, tmp_path):
    out_path = str(tmp_path / "m.json")
    one = str(TORCH / "resnet18_bs4.json.gz")
    code, _, ingest_err = run_cli("ingest", one, "--tag", "batch=4", "-q")
    assert code == 0, ingest_err
    code, out, err = run_cli("predict", "fit", one, "--model-out", out_path)
    assert code == 2 and out == ""
    assert err == ("traceparse: error: too few traces to fit: got 1; predict fit needs at least 2 traces of at "
                   "least 2 batch sizes\n")
    untagged = str(TORCH / "resnet18_bs8.json.gz")
    code, _, err = run_cli("predict", "fit", one, untagged, "--model-out", out_path)
    assert code == 2
    assert err.startswith("traceparse: error: trace ") and err.endswith(
        f"({untagged}) has no tag 'batch'; ingest it with --tag batch=N (its tags: none)\n")
    assert not Path(out_path).exists()


def test_traces_without_operators_cannot_be_modelled(store, tmp_path):
    nsys = str(FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz")
    assert run_cli("ingest", nsys, "--tag", "batch=8", "-q")[0] == 0
    assert run_cli("ingest", str(TORCH / "resnet18_bs4.json.gz"), "--tag", "batch=4", "-q")[0] == 0
    code, _, err = run_cli("predict", "fit", str(TORCH / "resnet18_bs4.json.gz"), nsys,
                           "--model-out", str(tmp_path / "m.json"))
    assert code == 2
    assert err.endswith(f"({nsys}) has no operator events: predict needs torch.profiler traces (cpu_op events "
                        "linked to kernels by External id)\n")


def test_bad_flops_table_names_the_line(fitted, tmp_path, store):
    _, model_path, _ = fitted
    table = tmp_path / "t.csv"
    table.write_text("layer_type,pass,calls,ops\nconvolution,forward,20,1e9\nReLU,sideways,17,1e6\n")
    code, out, err = run_cli("predict", "run", "--model", str(model_path), "--flops-table", str(table))
    assert code == 2 and out == ""
    assert err == f"traceparse: error: {table}:3: pass one of forward, backward, update, got 'sideways'\n"
    table.write_text("layer_type,pass,calls,ops\nconvolution,forward,twenty,1e9\n")
    code, _, err = run_cli("predict", "run", "--model", str(model_path), "--flops-table", str(table))
    assert err == f"traceparse: error: {table}:2: calls a number ≥ 0, got 'twenty' (not a number)\n"


def test_fit_on_the_three_shared_samples(samples_dir, store, tmp_path):
    paths = [str(samples_dir / "torch" / f"torch_resnet18_bs{b}.json.gz") for b in (4, 16, 64)]
    for b, p in zip((4, 16, 64), paths):
        assert run_cli("ingest", p, "--tag", f"batch={b}", "--tag", "model=resnet18", "-q")[0] == 0
    model_path = tmp_path / "m.json"
    code, out, err = run_cli("predict", "fit", *paths, "--model-out", str(model_path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc.pop("schema_version"), doc.pop("command")) == (SCHEMA_VERSION, "predict fit")  # the envelope of every --json
    assert doc == json.loads(model_path.read_text())
    assert doc["format"] == "traceparse-predict-model" and doc["version"] == 2
    steps = {b: _step_ns(Path(p)) for b, p in zip((4, 16, 64), paths)}
    slope, intercept = np.polyfit([4, 16], [steps[4], steps[16]], 1)
    (r,) = doc["validation"]["extrapolation_to_largest_batch"]["traces"]
    assert r["affine"]["predicted_ns"] == pytest.approx(intercept + slope * 64, rel=1e-9)


def test_recorded_flops_replace_the_formula():
    """Where torch recorded `flops` (with_flops=True) for an operator, that figure is its ops. The fixtures'
    torch version writes no flops, so a real trace gets them set here on its aten::conv2d calls."""
    import polars as pl

    from traceparse.ingest import read_paths
    from traceparse_plugins.predict.attribution import profile

    trace = read_paths([TORCH / "resnet18_bs16.json.gz"])[0]
    conv2d = (pl.col("kind") == "op") & (pl.col("name") == "aten::conv2d")
    trace.events = trace.events.with_columns(flops=pl.when(conv2d).then(pl.lit(1e9)).otherwise(pl.col("flops")))
    per_type = {(r["layer_type"], r["pass"]): r for r in profile(trace).per_type().iter_rows(named=True)}
    assert per_type[("convolution", "forward")]["ops"] == 20 * 1e9  # 20 convolutions per step, counted once each
    untouched = {(r["layer_type"], r["pass"]): r for r in
                 profile(read_paths([TORCH / "resnet18_bs16.json.gz"])[0]).per_type().iter_rows(named=True)}
    assert per_type[("convolution", "backward")]["ops"] == untouched[("convolution", "backward")]["ops"]


# -- issue 14: the two-sided step model on fixtures/torch_sweep2 (H100; ResNet18, VGG16, AlexNet, a small GPT) ------
SWEEP2 = FIXTURES / "torch_sweep2"
NETWORKS2 = ("resnet18", "vgg16", "alexnet", "gpt")
BATCHES2 = (4, 8, 16, 32, 64)


def _steps_of(path: Path) -> list[float]:
    return [_ns(e["dur"]) for e in _events(path)
            if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]


@pytest.fixture(scope="module")
def sweep2(tmp_path_factory) -> tuple[dict, str, str]:
    root = tmp_path_factory.mktemp("predict2") / "store"
    session = Session(store=root, quiet=True)
    paths = []
    for network in NETWORKS2:
        for batch in BATCHES2:
            path = str(SWEEP2 / f"{network}_bs{batch}.json.gz")
            session.ingest([path], tags={"batch": str(batch), "model": network})
            paths.append(path)
    model_path = tmp_path_factory.mktemp("model2") / "model.json"
    code, out, err = run_cli("--store", str(root), "predict", "fit", *paths, "--model-out", str(model_path))
    assert code == 0, err
    return json.loads(model_path.read_text()), str(root), out


def test_goal_step_time_at_batch_64_from_batches_4_to_32(sweep2):
    """Issue 14's goal: fitted on batch 4–32, each network's step at batch 64 within 10% MAPE. The measured step
    is recomputed from the raw JSON (mean ProfilerStep#N duration); the error from the model's prediction."""
    doc, _, out = sweep2
    extra = doc["validation"]["extrapolation_to_largest_batch"]
    assert sorted(r["network"] for r in extra["traces"]) == sorted(NETWORKS2)
    apes = {}
    for r in extra["traces"]:
        assert r["batch"] == 64 and r["fitted_batches"] == [4, 8, 16, 32] and r["step"]["reference_batch"] == 32
        steps = _steps_of(SWEEP2 / f"{r['network']}_bs64.json.gz")
        assert len(steps) == 5
        measured = sum(steps) / len(steps)
        assert r["step"]["measured_ns"] == pytest.approx(measured, rel=1e-12)
        predicted = r["step"]["predicted_ns"]
        # never shorter than its own GPU time; the interval holds the point
        assert predicted >= r["device"]["predicted_ns"]
        assert r["step"]["low_ns"] <= predicted <= r["step"]["high_ns"]
        apes[r["network"]] = 100 * abs(predicted - measured) / measured
    mape = sum(apes.values()) / len(apes)
    assert extra["mape_pct"]["step"] == pytest.approx(mape, rel=1e-9)
    assert mape <= 10, apes
    assert f"extrapolation MAPE: step time {mape:.1f}% (goal ≤ 10%: met)" in " ".join(out.split())
    # GPU-bound VGG16 and host-bound GPT are both within 10%; the per-network figures are in docs/predict.md
    assert apes["vgg16"] < 10 and apes["gpt"] < 10


def test_docs_step_model_table_is_what_fit_gives(sweep2):
    """docs/predict.md's table of the step models fitted on batch 4–64 (host median [p25, p75], κ, δ, D0, D1,
    crossover) is the fit's own figures, to the digits it shows: a change to the fit that moves them fails here,
    not in a reader's hands."""
    doc, _, _ = sweep2
    text = (FIXTURES.parent / "docs" / "predict.md").read_text()
    table = text[text.index("| network | host (ms) | κ | δ device |"):]
    names = {"AlexNet": "alexnet", "GPT": "gpt", "ResNet18": "resnet18", "VGG16": "vgg16"}
    row = re.compile(r"^\| (\w+) \| ([0-9.]+) \[([0-9.]+), ([0-9.]+)\] \| ([0-9.]+) \| ([0-9.]+)% \| ([0-9.]+) \| "
                     r"([0-9.]+) \| ([0-9.]+) \|$", re.M)
    seen = set()
    for m in row.finditer(table[:table.index("\n\n")]):
        net = doc["networks"][names[m.group(1)]]
        assert net["batches"] == [4.0, 8.0, 16.0, 32.0, 64.0]
        want = (f"{net['host']['median_ns'] / 1e6:.3f}", f"{net['host']['p25_ns'] / 1e6:.3f}",
                f"{net['host']['p75_ns'] / 1e6:.3f}", f"{net['kappa']:.2f}", f"{net['device_error_pct']:.1f}",
                f"{net['device_per_step']['d0_ns'] / 1e6:.3f}",
                f"{net['device_per_step']['d1_ns_per_sample'] / 1e6:.4f}", f"{net['crossover_batch']:.1f}")
        assert m.groups()[1:] == want, m.group(1)
        seen.add(m.group(1))
    assert seen == set(names)


def test_host_and_device_sides_add_up_and_replay_reproduces_the_steps(sweep2):
    """Per trace: device time = Σ GPU activity durations / steps (raw JSON), host = step − wait, and replaying a
    trace's timeline with its own durations gives back its measured steps."""
    doc, _, _ = sweep2
    for t in doc["training"]:
        path = SWEEP2 / f"{t['network']}_bs{int(t['batch'])}.json.gz"
        events = _events(path)
        gpu = sum(_ns(e["dur"]) for e in events if e.get("cat") in GPU_CATS)
        assert t["device_ns"] == pytest.approx(gpu / 5, rel=1e-12)
        assert t["host_ns"] + t["wait_ns"] == pytest.approx(t["step_ns"], rel=1e-12)
        assert t["hidden_ns"] == pytest.approx(max(0.0, t["device_ns"] - t["wait_ns"]), rel=1e-9, abs=1e3)
        assert t["replay_ape_pct"] < 0.5


def test_vgg16_waits_for_the_gpu_and_gpt_never_does(sweep2):
    doc, _, _ = sweep2
    by = {(t["network"], t["batch"]): t for t in doc["training"]}
    vgg = by[("vgg16", 64)]
    assert vgg["wait_ns"] > 0.7 * vgg["step_ns"] and vgg["device_ns"] > 0.95 * vgg["step_ns"]
    assert all(by[("gpt", b)]["wait_ns"] < 0.01 * by[("gpt", b)]["step_ns"] for b in BATCHES2)
    nets = doc["networks"]
    assert nets["vgg16"]["crossover_batch"] < 16 < 128 < nets["gpt"]["crossover_batch"]


def test_run_says_when_it_extrapolates_and_gives_an_interval(sweep2):
    doc, store, _ = sweep2
    trace = next(m.id for m in Session(store=store).store.all_meta() if m.tags == {"batch": "32", "model": "resnet18"})
    fitted = Path(store).parent / "m32.json"
    ids32 = [m.id for m in Session(store=store).store.all_meta() if int(m.tags["batch"]) <= 32]
    assert run_cli("--store", store, "predict", "fit", *ids32, "--model-out", str(fitted), "--json")[0] == 0
    code, out, err = run_cli("--store", store, "predict", "run", "--model", str(fitted), trace, "--batch", "128")
    assert code == 0, err
    text = " ".join(out.split())
    assert "EXTRAPOLATING: batch 128 is outside the fitted range of resnet18 (4–32)" in text
    assert err.count("traceparse: warning: extrapolating: batch 128 is 4.00× the largest fitted batch of "
                     "resnet18 (32; fitted 4–32)") == 1
    code, out, err = run_cli("--store", store, "predict", "run", "--model", str(fitted), trace, "--batch", "128",
                             "--json")
    result = json.loads(out)
    assert result["extrapolation"] == {"fitted_min": 4.0, "fitted_max": 32.0, "outside": True, "factor": 4.0}
    low, high = result["step_interval_ns"]
    assert low <= result["step_predicted_ns"] <= high
    assert result["step_predicted_ns"] >= result["device_predicted_ns"] > 0
    # measured at 128 (the raw JSON): inside the interval
    steps = _steps_of(SWEEP2 / "resnet18_bs128.json.gz")
    assert low <= sum(steps) / len(steps) <= high


def test_attention_ops_are_the_scaled_dot_product_flops():
    """2 × B × heads × L × S × (E_qk + E_v) per aten::scaled_dot_product_attention call, halved when is_causal
    (the GPT sweep: 4 causal blocks)."""
    from traceparse.ingest import read_paths
    from traceparse_plugins.predict.attribution import profile

    path = SWEEP2 / "gpt_bs16.json.gz"
    calls = [e for e in _events(path) if e.get("cat") == "cpu_op" and e["name"] == "aten::scaled_dot_product_attention"]
    # under autocast the operator dispatches to itself once more: count the calls no other one encloses
    outer = [e for e in calls if not any(o is not e and o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"]
                                         for o in calls)]
    assert len(calls) == 2 * len(outer) == 40
    expected = 0
    for e in outer:
        q, k, v = e["args"]["Input Dims"][:3]
        causal = e["args"]["Concrete Inputs"][5] == "True"  # scaled_dot_product_attention(q, k, v, mask, p, is_causal)
        assert causal
        expected += 2 * q[0] * q[1] * q[2] * k[2] * (q[3] + v[3]) // (2 if causal else 1)
    assert expected == 5 * 4 * 2 * 16 * 8 * 256 * 256 * 64  # 5 steps, 4 blocks, half of 4 × B·H·L·S·E
    per_type = {(r["layer_type"], r["pass"]): r for r in profile(read_paths([path])[0]).per_type().iter_rows(named=True)}
    assert per_type[("attention", "forward")]["ops"] == expected / 5
    assert per_type[("attention", "forward")]["calls"] == 4


def test_recurrent_layers_are_a_layer_type_with_their_gemm_flops():
    """Sweep 18's LSTM/GRU language model: the LSTM and the GRU are ``recurrent`` layers (they were ``other``, with
    the element count of their largest input as ops), each step's ops the FLOPs of their cuDNN calls from the raw
    JSON — 2 × tokens × the weight matrices' elements forward, twice that backward (the data and the weight
    gradients)."""
    from traceparse.ingest import read_paths
    from traceparse_plugins.predict.attribution import profile

    path = FIXTURES / "torch" / "sweep18" / "lstm_gru.json.gz"
    calls = [e["args"] for e in _events(path) if e.get("cat") == "cpu_op" and e["name"] == "aten::_cudnn_rnn"]
    assert len(calls) == 6  # the LSTM and the GRU, three steps
    forward = sum(2 * a["Input Dims"][0][0] * a["Input Dims"][0][1] * sum(w[0] * w[1] for w in a["Input Dims"][1]
                                                                           if len(w) == 2) for a in calls)
    per_type = {(r["layer_type"], r["pass"]): r
                for r in profile(read_paths([path])[0]).per_type().iter_rows(named=True)}
    assert per_type[("recurrent", "forward")]["ops"] == forward / 3 == 2 * 2048 * (2048 * 1792 + 1536 * 1024)
    assert per_type[("recurrent", "backward")]["ops"] == 2 * forward / 3
    assert per_type[("recurrent", "forward")]["calls"] == per_type[("recurrent", "backward")]["calls"] == 2


def test_grouped_gemms_of_experts_are_linear_layers_with_their_flops():
    """The MoE feed-forward of an H200 (fixtures/make_grouped_mm_trace.py): its ``aten::_grouped_mm`` calls (and the
    FP8 ``_scaled_grouped_mm``) are ``linear`` layers, each 2 × tokens × hidden × ffn ops from the script's sizes;
    forward the up and down projections and the FP8 one, backward (``GroupedMmBackward0``) the input and weight
    gradients of both. They were ``other``, with their largest input's elements as ops."""
    from traceparse.ingest import read_paths
    from traceparse_plugins.predict.attribution import profile

    path = FIXTURES / "torch" / "grouped_mm" / "moe_grouped_mm.json.gz"
    made = json.loads((path.parent / "moe_grouped_mm_made.json").read_text())
    one = 2 * sum(made["tokens_per_expert"]) * made["hidden"] * made["ffn"]
    per_type = {(r["layer_type"], r["pass"]): r
                for r in profile(read_paths([path])[0]).per_type().iter_rows(named=True)}
    assert (per_type[("linear", "forward")]["calls"], per_type[("linear", "forward")]["ops"]) == (3, 3 * one)
    assert (per_type[("linear", "backward")]["calls"], per_type[("linear", "backward")]["ops"]) == (2, 4 * one)


def test_run_never_prints_a_step_shorter_than_its_gpu_time_and_warns_outside_the_fit(sweep_store, tmp_path):
    """Fitted on ResNet18 at batches 4-32 and run from the batch-8 trace: at 128 the step model's replay would
    give a step shorter than the layer models' GPU time per step; it is raised to it, and it says so."""
    ids = [_id(sweep_store, "resnet18", b) for b in (4, 8, 16, 32)]
    model_path = tmp_path / "r18.json"
    assert run_cli("--store", sweep_store, "predict", "fit", *ids, "--model-out", str(model_path), "--json")[0] == 0
    trace = _id(sweep_store, "resnet18", 8)
    for batch, where, edge in (("128", "largest", "32"), ("1", "smallest", "4")):
        code, out, err = run_cli("--store", sweep_store, "predict", "run", "--model", str(model_path), trace,
                                 "--batch", batch, "--json")
        assert code == 0, err
        r = json.loads(out)
        factor = int(batch) / int(edge)
        expected = (f"extrapolating: batch {batch} is {factor:.2f}× the {where} fitted batch of resnet18 ({edge}; "
                    "fitted 4–32)")
        assert r["warnings"][0].startswith(expected)
        assert err.count(f"traceparse: warning: {expected}") == 1
        gpu = max(r["device_predicted_ns"], r["layers_predicted_ns"])
        low, high = r["step_interval_ns"]
        assert gpu <= low <= r["step_predicted_ns"] <= high
        if r["step_floored_ns"] is not None:
            assert r["step_floored_ns"] == gpu
            # the side that binds is judged against the raised GPU time: "device 22.1 ms, host 22.8 ms:
            # host-bound" beside a step raised to 28.8 ms of GPU work read both ways
            assert r["device_predicted_ns"] >= r["step_floored_ns"]
        assert r["bound"] == ("GPU" if r["device_predicted_ns"] >= r["host_predicted_ns"] else "host")
        code, text, err = run_cli("--store", sweep_store, "predict", "run", "--model", str(model_path), trace,
                                  "--batch", batch)
        assert code == 0 and err.count("traceparse: warning: extrapolating") == 1
        shown = [float(x) for x in re.findall(r"step time \(resnet18, batch \d+\): ([\d.]+) ms, interval "
                                              r"\[([\d.]+), ([\d.]+)\]", " ".join(text.split()))[0]]
        assert min(shown) >= round(gpu / 1e6, 3)
        if r["step_floored_ns"] is not None:  # it says which figure the floor raised
            said = "the step" if r["step_predicted_ns"] == r["step_floored_ns"] else "the interval's low end"
            assert f"; {said} raised to the predicted GPU time per step" in " ".join(text.split())
    # at 128 the floor is what raised it (the replay alone gives less than the layers' GPU time)
    code, out, _ = run_cli("--store", sweep_store, "predict", "run", "--model", str(model_path), trace,
                           "--batch", "128", "--json")
    assert json.loads(out)["step_floored_ns"] == json.loads(out)["layers_predicted_ns"]


def test_run_gives_the_networks_crossover_batch_whichever_trace_it_replays(sweep_store, tmp_path):
    """It worked the crossover out through the reference trace's own device line: one fit gave 99.5, 82.1 and 76.4
    from three traces while its fit table said 76.45. It is the fit's, from any trace."""
    ids = [_id(sweep_store, "resnet18", b) for b in (4, 8, 16, 32)]
    model_path = tmp_path / "r18.json"
    assert run_cli("--store", sweep_store, "predict", "fit", *ids, "--model-out", str(model_path), "--json")[0] == 0
    fitted = json.loads(model_path.read_text())
    networks = fitted.get("networks") or {}
    want = (networks.get("resnet18") or {}).get("crossover_batch")
    got = set()
    for trace in ids[:3]:
        code, out, err = run_cli("--store", sweep_store, "predict", "run", "--model", str(model_path), trace,
                                 "--batch", "64", "--json")
        assert code == 0, err
        got.add(json.loads(out)["crossover_batch"])
    assert want is not None and got == {want}
