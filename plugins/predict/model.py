"""Per-layer-type linear models, end-to-end affine models in batch size, their validation, and model.json.

* Layer models (the seed study's per-layer models), one per (layer type,
  pass): t = b0 + b1 × ops, where one point is one layer call (its GPU time
  and ops) of a training trace; least squares (numpy). When a type's ops take
  a single value in the training data (the optimizer step of one network, whose
  ops are its parameter count at every batch size) the model is proportional,
  t = b1 × ops (b0 = 0), so it still scales to another network. A trace's
  predicted GPU time per step for a type = Σ over its passes of
  calls × b0 + b1 × ops (per-step calls and ops), never below 0.
* End-to-end models, one per network (the ``--network-tag`` tag, default
  ``model``): step time = a0 + a1 × batch, least squares over that network's
  traces (at least two batch sizes).
* Leave-one-trace-out (LOTO): each trace in turn is left out, the models are
  fitted on the others (layer models on every other trace, the end-to-end
  model on the other traces of the same network) and the left-out trace is
  predicted; APE = |predicted − measured| / measured; MAPE = the mean APE
  in %. Per layer type (its GPU time per step), for the layers' total (GPU
  time attributed to layer calls, per step) and end to end (step time).
* Extrapolation: per network with at least three batch sizes, its largest
  batch is left out and predicted from the other traces (the layer models see
  no trace at or above that network's largest batch of any network left out).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from traceparse.errors import InputError, bad_input
from traceparse_plugins.predict import layers
from traceparse_plugins.predict.attribution import TraceProfile
from traceparse_plugins.predict.timeline import Timeline

MODEL_FORMAT = "traceparse-predict-model"
MODEL_VERSION = 2


@dataclass
class Sample:
    """A training trace: its profile, network and batch size."""

    profile: TraceProfile
    network: str
    batch: float
    #: host events and GPU activities (:mod:`.timeline`); None: the step model cannot use this trace
    timeline: Timeline | None = None


@dataclass
class LayerModel:
    layer_type: str
    pass_: str
    b0_ns: float
    b1_ns_per_op: float
    r2: float | None
    points: int
    proportional: bool = False


@dataclass
class EndToEndModel:
    network: str
    a0_ns: float
    a1_ns_per_sample: float
    r2: float | None
    batches: list[float] = field(default_factory=list)

    def predict(self, batch: float) -> float:
        return self.a0_ns + self.a1_ns_per_sample * batch


def _r2(y: np.ndarray, fitted: np.ndarray) -> float | None:
    total = float(((y - y.mean()) ** 2).sum())
    if total == 0:
        return None
    return 1.0 - float(((y - fitted) ** 2).sum()) / total


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float | None, bool]:
    """Least squares y = b0 + b1·x; (b0, b1, R², proportional). One distinct x: y = b1·x through 0."""
    x = x.astype(float)
    y = y.astype(float)
    if len(np.unique(x)) < 2:
        if x.size and x.mean() != 0:
            b1 = float(y.mean() / x.mean())
            return 0.0, b1, _r2(y, b1 * x), True
        return float(y.mean()) if y.size else 0.0, 0.0, None, True
    scale = float(np.abs(x).max()) or 1.0  # keep the design matrix well conditioned
    design = np.column_stack([np.ones_like(x), x / scale])
    (b0, b1s), *_ = np.linalg.lstsq(design, y, rcond=None)
    b1 = float(b1s) / scale
    return float(b0), b1, _r2(y, b0 + b1 * x), False


def fit_layers(samples: list[Sample]) -> dict[tuple[str, str], LayerModel]:
    """One layer model per (layer type, pass) over the layer calls of ``samples`` that have ops."""
    calls = pl.concat([s.profile.calls.select("layer_type", "pass", "gpu_ns", "ops") for s in samples])
    calls = calls.filter(pl.col("ops").is_not_null())
    models = {}
    for (kind, pass_), group in calls.group_by("layer_type", "pass"):
        b0, b1, r2, prop = fit_line(group["ops"].to_numpy(), group["gpu_ns"].to_numpy())
        models[(kind, pass_)] = LayerModel(kind, pass_, b0, b1, r2, group.height, prop)
    return models


def fit_end_to_end(samples: list[Sample]) -> dict[str, EndToEndModel]:
    """Step time = a0 + a1 × batch per network, for networks with two batch sizes or more."""
    models = {}
    for network in sorted({s.network for s in samples}):
        mine = [s for s in samples if s.network == network]
        batches = np.array([s.batch for s in mine])
        if len(np.unique(batches)) < 2:
            continue
        a0, a1, r2, _ = fit_line(batches, np.array([s.profile.step_ns for s in mine]))
        models[network] = EndToEndModel(network, a0, a1, r2, sorted(float(b) for b in np.unique(batches)))
    return models


def predict_layers(models: dict[tuple[str, str], LayerModel], per_type: pl.DataFrame) -> pl.DataFrame:
    """Predicted GPU time per step for each (layer_type, pass) row of ``per_type`` (calls, ops per step)."""
    out = []
    for row in per_type.iter_rows(named=True):
        model = models.get((row["layer_type"], row["pass"]))
        if model is None or row["ops"] is None:
            predicted = None
        else:
            predicted = max(0.0, row["calls"] * model.b0_ns + model.b1_ns_per_op * row["ops"])
        out.append(predicted)
    return per_type.with_columns(predicted_ns=pl.Series(out, dtype=pl.Float64))


def by_type(table: pl.DataFrame) -> dict[str, dict[str, float | None]]:
    """Sum the passes of each layer type: {type: {measured_ns, predicted_ns}} (keys present in ``table``)."""
    out: dict[str, dict[str, float | None]] = {}
    for kind in layers.TYPE_ORDER:
        rows = table.filter(pl.col("layer_type") == kind)
        if rows.height == 0:
            continue
        entry: dict[str, float | None] = {}
        if "gpu_ns" in rows.columns:
            entry["measured_ns"] = float(rows["gpu_ns"].sum())
        predicted = rows["predicted_ns"]
        entry["predicted_ns"] = None if predicted.null_count() else float(predicted.sum())
        out[kind] = entry
    return out


def ape(predicted: float | None, measured: float | None) -> float | None:
    """Absolute percentage error in %, or None."""
    if predicted is None or not measured:
        return None
    return 100.0 * abs(predicted - measured) / measured


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _trace_prediction(models, e2e: EndToEndModel | None, sample: Sample,
                      network_samples: list[Sample] | None = None) -> dict[str, Any]:
    """Predict ``sample`` from models it was not fitted on: the layers' GPU time by the layer models (absolute,
    the seed study's sum), the step by the affine baseline ``e2e`` and by the two-sided step model fitted on
    ``network_samples`` (other traces of the same network; its nearest batch is the reference)."""
    from traceparse_plugins.predict import step as step_model

    table = predict_layers(models, sample.profile.per_type())
    types = by_type(table)
    for entry in types.values():
        entry["ape_pct"] = ape(entry["predicted_ns"], entry["measured_ns"])
    layer_sum = None if any(e["predicted_ns"] is None for e in types.values()) else \
        sum(e["predicted_ns"] for e in types.values())
    measured_layers = sum(e["measured_ns"] for e in types.values())
    affine = e2e.predict(sample.batch) if e2e is not None else None
    result = {"trace": sample.profile.trace_id, "network": sample.network, "batch": sample.batch,
              "types": types,
              "layers": {"measured_ns": measured_layers, "predicted_ns": layer_sum,
                         "ape_pct": ape(layer_sum, measured_layers)},
              "affine": {"measured_ns": sample.profile.step_ns, "predicted_ns": affine,
                         "ape_pct": ape(affine, sample.profile.step_ns)},
              "step": {"measured_ns": sample.profile.step_ns, "predicted_ns": None, "ape_pct": None}}
    usable = [s for s in network_samples or [] if s.timeline is not None and s.batch != sample.batch]
    if sample.timeline is None or len({s.batch for s in usable}) < 2:
        return result
    nm = step_model.fit_network(usable, models)
    pred = step_model.predict(nm, models, step_model.nearest(usable, sample.batch), sample.batch)
    m = step_model.measured(sample)
    step = sample.profile.step_ns
    result["step"] = {"measured_ns": step, "predicted_ns": pred["step_ns"], "low_ns": pred["low_ns"],
                      "high_ns": pred["high_ns"], "ape_pct": ape(pred["step_ns"], step),
                      "inside": pred["low_ns"] <= step <= pred["high_ns"],
                      "reference_batch": pred["reference_batch"]}
    result["device"] = {"measured_ns": m["device"], "predicted_ns": pred["device_ns"],
                        "ape_pct": ape(pred["device_ns"], m["device"])}
    result["host"] = {"measured_ns": m["host"], "predicted_ns": pred["host_ns"],
                      "ape_pct": ape(pred["host_ns"], m["host"])}
    result["bound"] = {"measured": "GPU" if m["device"] >= m["host"] else "host", "predicted": pred["bound"]}
    result["crossover_batch"] = pred["crossover_batch"]
    return result


def leave_one_out(samples: list[Sample]) -> dict[str, Any]:
    """LOTO predictions of every trace and the MAPE per layer type, for the layers' total and end to end."""
    results = []
    for i, held in enumerate(samples):
        rest = samples[:i] + samples[i + 1:]
        mine = [s for s in rest if s.network == held.network]
        e2e = fit_end_to_end(mine).get(held.network)
        results.append(_trace_prediction(fit_layers(rest), e2e, held, mine))
    return {"traces": results, **_mape(results)}


def extrapolation(samples: list[Sample]) -> dict[str, Any]:
    """Each network's largest batch predicted from its smaller ones (and every other network's)."""
    held = {}
    for network in sorted({s.network for s in samples}):
        mine = [s for s in samples if s.network == network]
        if len({s.batch for s in mine}) >= 3:
            largest = max(s.batch for s in mine)
            held[network] = [s for s in mine if s.batch == largest]
    if not held:
        return {"traces": [], "note": "needs a network with at least 3 batch sizes", **_mape([])}
    held_ids = {id(s) for group in held.values() for s in group}
    train = [s for s in samples if id(s) not in held_ids]
    models = fit_layers(train)
    e2e = fit_end_to_end(train)
    results = []
    for network, group in held.items():
        mine = [s for s in train if s.network == network]
        for s in group:
            r = _trace_prediction(models, e2e.get(network), s, mine)
            r["fitted_batches"] = sorted({t.batch for t in mine})
            results.append(r)
    return {"traces": results, **_mape(results)}


def _mape(results: list[dict]) -> dict[str, Any]:
    types = {}
    for kind in layers.TYPE_ORDER:
        values = [r["types"][kind]["ape_pct"] for r in results if kind in r["types"]]
        if values:
            types[kind] = _mean(values)
    inside = [r["step"]["inside"] for r in results if "inside" in r["step"]]
    return {"mape_pct": {"types": types, "layers": _mean(r["layers"]["ape_pct"] for r in results),
                         "step": _mean(r["step"]["ape_pct"] for r in results),
                         "affine": _mean(r["affine"]["ape_pct"] for r in results),
                         "device": _mean(r["device"]["ape_pct"] for r in results if "device" in r),
                         "host": _mean(r["host"]["ape_pct"] for r in results if "host" in r)},
            "inside_interval": f"{sum(inside)}/{len(inside)}"}


# -- model.json -----------------------------------------------------------------
def layer_model_json(m: LayerModel) -> dict[str, Any]:
    return {**{k: v for k, v in asdict(m).items() if k != "pass_"}, "pass": m.pass_}


def to_json(models: dict[tuple[str, str], LayerModel], e2e: dict[str, EndToEndModel], networks: dict,
            meta: dict) -> dict:
    """The model file's content (``networks``: the step models of :mod:`.step`, by network)."""
    order = {t: i for i, t in enumerate(layers.TYPE_ORDER)}
    layer_list = sorted(models.values(), key=lambda m: (order.get(m.layer_type, 99), m.pass_))
    return {"format": MODEL_FORMAT, "version": MODEL_VERSION, **meta,
            "layer_models": [layer_model_json(m) for m in layer_list],
            "networks": {n: m.to_json() for n, m in sorted(networks.items())},
            "end_to_end": {n: asdict(m) for n, m in sorted(e2e.items())}}


def _layer_models(entries) -> dict[tuple[str, str], LayerModel]:
    models = {}
    for m in entries:
        model = LayerModel(str(m["layer_type"]), str(m["pass"]), _num(m["b0_ns"]), _num(m["b1_ns_per_op"]),
                           m.get("r2"), int(m.get("points", 0)), bool(m.get("proportional", False)))
        models[(model.layer_type, model.pass_)] = model
    return models


def load(path: Path):
    """Read a model file: (layer models, end-to-end models, network step models, the document); a one-line
    error for anything else, including another format version."""
    from traceparse_plugins.predict.step import HostModel, NetworkModel

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise bad_input(path, None, f"not a traceparse predict model (not JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != MODEL_FORMAT:
        raise bad_input(path, None, f'not a traceparse predict model (expected "format": "{MODEL_FORMAT}")')
    if data.get("version") != MODEL_VERSION:
        raise bad_input(path, "version", f"model format version {data.get('version')!r}; this traceparse reads "
                                         f"version {MODEL_VERSION} (fit the model again with `traceparse predict fit`)")
    try:
        models = _layer_models(data["layer_models"])
        e2e = {str(n): EndToEndModel(str(n), _num(m["a0_ns"]), _num(m["a1_ns_per_sample"]), m.get("r2"),
                                     list(m.get("batches", [])))
               for n, m in data.get("end_to_end", {}).items()}
        networks = {}
        for n, m in data.get("networks", {}).items():
            h = m["host"]
            d = m.get("device_per_step") or {}
            networks[str(n)] = NetworkModel(
                str(n), [float(b) for b in m["batches"]],
                HostModel(_num(h["median_ns"]), _num(h["p25_ns"]), _num(h["p75_ns"]), int(h.get("steps", 0))),
                _num(m["kappa"]), _num(m["device_error_pct"]), _layer_models(m["layer_models"]),
                d.get("d0_ns"), d.get("d1_ns_per_sample"), m.get("crossover_batch"), dict(m.get("reference") or {}))
    except (KeyError, TypeError, ValueError) as exc:
        raise bad_input(path, "layer_models / networks / end_to_end", f"malformed model entry ({exc!r})") from None
    return models, e2e, networks, data


def _num(value) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number
