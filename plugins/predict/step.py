"""Step time from both sides: a host model, a device model and their overlap, per network (and GPU).

* **Host model** (per network): the host's own time per step (step − time waiting
  in blocking calls, :mod:`.timeline`) of every profiled step of the fitted
  traces: its median, and its 25th and 75th percentiles for the interval. Host
  time is launch and framework overhead: it does not grow with the batch, and
  its noise (other work on the machine, the profiler) only ever adds time,
  so a median of steps, not a mean of traces, and no slope.
* **Device model** (per network): the per-layer models t = b0 + b1 × ops of
  :mod:`.model`, fitted per (layer type, pass) on that network's traces
  (the models fitted on every network fill any gap). A reference trace's
  measured GPU activities are scaled, per layer call, by the model's ratio
  t(ops at the new batch) / t(ops at the reference batch): the model supplies
  the growth, the reference the absolute time (a layer's intercept errors
  cancel). The ratio is kept between 1 and the call's growth in ops: a
  call's time grows no faster than its work, and does not shrink with it.
* **Combination**: the reference trace's steps are replayed
  (:func:`.timeline.replay`) with the scaled GPU durations and the host model's
  time: the GPU waits for launches, the host waits in its synchronisations.
  The step is therefore never shorter than its GPU time nor than the host's
  time. Without a timeline (a flops table) the closed form
  step = max(H, D) + κ × min(H, D) is used, κ being the share of the shorter
  side that was *not* hidden under the longer one on the fitted traces
  (median over them; 0 = perfect overlap, 1 = none).
* **Crossover batch**: the device time per step is affine in the batch
  (every pass but the update scales its ops with it): D(b) = D0 + D1 × b. The
  run turns GPU-bound where D(b) reaches the host time H: b* = (H − D0) / D1.
* **Interval**: the replay again with the host at its 25th / 75th percentile
  and every GPU duration × (1 ∓ δ), δ being the network's device-model error
  (the largest APE of its GPU time per step when each fitted trace is predicted
  from its nearest neighbour by models fitted without it; at least 2%).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from traceparse_plugins.predict import model as layer_model
from traceparse_plugins.predict.model import LayerModel, Sample
from traceparse_plugins.predict.timeline import replay

MIN_DEVICE_ERROR_PCT = 2.0


@dataclass
class HostModel:
    median_ns: float
    p25_ns: float
    p75_ns: float
    steps: int


@dataclass
class NetworkModel:
    network: str
    batches: list[float]
    host: HostModel
    kappa: float
    device_error_pct: float
    layer_models: dict[tuple[str, str], LayerModel] = field(default_factory=dict)
    #: device time per step at batch b: d0 + d1 × b (from the largest fitted batch's trace)
    d0_ns: float | None = None
    d1_ns_per_sample: float | None = None
    crossover_batch: float | None = None
    reference: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        order = {t: i for i, t in enumerate(layer_model.layers.TYPE_ORDER)}
        models = sorted(self.layer_models.values(), key=lambda m: (order.get(m.layer_type, 99), m.pass_))
        return {"network": self.network, "batches": self.batches,
                "host": {"median_ns": self.host.median_ns, "p25_ns": self.host.p25_ns, "p75_ns": self.host.p75_ns,
                         "steps": self.host.steps},
                "kappa": self.kappa, "device_error_pct": self.device_error_pct,
                "device_per_step": {"d0_ns": self.d0_ns, "d1_ns_per_sample": self.d1_ns_per_sample},
                "crossover_batch": self.crossover_batch, "reference": self.reference,
                "layer_models": [layer_model.layer_model_json(m) for m in models]}


def measured(sample: Sample) -> dict[str, float]:
    """Mean per step of the sample's timeline: step, host, device, wait, hidden (ns)."""
    per = sample.timeline.per_step()
    return {k: float(per[f"{k}_ns"].mean()) for k in ("step", "host", "device", "wait", "hidden")}


def fit_host(samples: list[Sample]) -> HostModel:
    host = np.concatenate([s.timeline.per_step()["host_ns"].to_numpy() for s in samples])
    return HostModel(float(np.median(host)), float(np.percentile(host, 25)), float(np.percentile(host, 75)),
                     int(host.size))


def fit_kappa(samples: list[Sample]) -> float:
    """Median over traces of (step − max(H, D)) / min(H, D), clipped to [0, 1]."""
    values = []
    for s in samples:
        m = measured(s)
        shorter = min(m["host"], m["device"])
        if shorter > 0:
            values.append(min(1.0, max(0.0, (m["step"] - max(m["host"], m["device"])) / shorter)))
    return float(np.median(values)) if values else 0.0


def call_ratios(models: dict, fallback: dict, sample: Sample, batch: float) -> tuple[dict[int, float], float]:
    """Per layer call (top_id): predicted GPU time at ``batch`` / predicted at the sample's batch; and the
    ratio for GPU work of no modelled call (the ratio of the sample's whole GPU time)."""
    scale = batch / sample.batch
    ratios: dict[int, float] = {}
    before = after = 0.0
    for r in sample.profile.calls.iter_rows(named=True):
        m = models.get((r["layer_type"], r["pass"])) or fallback.get((r["layer_type"], r["pass"]))
        if m is None or r["ops"] is None:
            continue
        ops = r["ops"]
        new_ops = ops if r["pass"] == "update" else ops * scale
        t0 = m.b0_ns + m.b1_ns_per_op * ops
        t1 = m.b0_ns + m.b1_ns_per_op * new_ops
        growth = new_ops / ops if ops > 0 else 1.0
        if t0 > 0 and t1 > 0:
            # a call's time grows no faster than its work and does not shrink as its work grows (a model with a
            # negative intercept can give a call of little work a tiny t0, hence an absurd ratio)
            ratio = min(max(t1 / t0, min(1.0, growth)), max(1.0, growth))
            ratios[r["top_id"]] = ratio
            before += r["gpu_ns"]
            after += r["gpu_ns"] * ratio
    default = after / before if before > 0 else scale
    return ratios, default


def scaled_durations(sample: Sample, ratios: dict[int, float], default: float) -> np.ndarray:
    tl = sample.timeline
    factor = np.array([ratios.get(int(k), default) for k in tl.top_id], dtype=float)
    return tl.duration.astype(float) * factor


def device_per_step(nm_models: dict, fallback: dict, sample: Sample, batch: float) -> float:
    ratios, default = call_ratios(nm_models, fallback, sample, batch)
    return float(scaled_durations(sample, ratios, default).sum()) / sample.timeline.steps


def predict(nm: NetworkModel, fallback: dict, sample: Sample, batch: float) -> dict[str, Any]:
    """The step time at ``batch`` from the reference ``sample``'s timeline and the network model ``nm``."""
    ratios, default = call_ratios(nm.layer_models, fallback, sample, batch)
    durations = scaled_durations(sample, ratios, default)
    ref = measured(sample)
    scale = (lambda h: h / ref["host"]) if ref["host"] > 0 else (lambda h: 1.0)
    delta = nm.device_error_pct / 100.0
    point = replay(sample.timeline, durations, scale(nm.host.median_ns))
    low = replay(sample.timeline, durations * (1 - delta), scale(nm.host.p25_ns))
    high = replay(sample.timeline, durations * (1 + delta), scale(nm.host.p75_ns))
    device = float(point["device_ns"].mean())
    step = float(point["step_ns"].mean())
    lo, hi = float(low["step_ns"].mean()), float(high["step_ns"].mean())
    # the network's crossover batch, as its fit says it (None: never), whichever trace the step is replayed from
    # (through this trace's own device line it moved with the trace: 99.5, 82.1 and 76.4 for one fit of 76.45)
    cross = nm.crossover_batch
    return {"reference_batch": sample.batch, "reference_trace": sample.profile.trace_id,
            "step_ns": step, "low_ns": min(lo, step), "high_ns": max(hi, step),
            "device_ns": device, "host_ns": nm.host.median_ns,
            "bound": "GPU" if device >= nm.host.median_ns else "host",
            "crossover_batch": cross}


def device_line(models: dict, fallback: dict, sample: Sample) -> tuple[float, float]:
    """(D0, D1): device time per step = D0 + D1 × batch, through the sample's batch and twice it."""
    b = sample.batch
    d_b = device_per_step(models, fallback, sample, b)
    d_2b = device_per_step(models, fallback, sample, 2 * b)
    d1 = (d_2b - d_b) / b
    return d_b - d1 * b, d1


def crossover(host_ns: float, d0: float, d1: float) -> float | None:
    """The batch where the device time per step reaches the host's: None if it never grows."""
    if d1 <= 0:
        return None
    return max(0.0, (host_ns - d0) / d1)


def nearest(samples: list[Sample], batch: float) -> Sample:
    """The sample whose batch is nearest ``batch`` (the larger one on a tie; the first trace of that batch)."""
    return min(samples, key=lambda s: (abs(s.batch - batch), -s.batch))


def fit_network(samples: list[Sample], fallback: dict, inner: bool = True) -> NetworkModel:
    """A network's model from its traces (two batch sizes at least); ``inner``: estimate δ by an inner
    leave-one-trace-out (each trace predicted from its nearest neighbour by models fitted without it)."""
    network = samples[0].network
    batches = sorted({s.batch for s in samples})
    models = layer_model.fit_layers(samples)
    nm = NetworkModel(network, batches, fit_host(samples), fit_kappa(samples), MIN_DEVICE_ERROR_PCT, models)
    if inner and len(batches) >= 3:
        errors = []
        for i, held in enumerate(samples):
            rest = [s for j, s in enumerate(samples) if j != i and s.batch != held.batch]
            if len({s.batch for s in rest}) < 2:
                continue
            ref = nearest(rest, held.batch)
            pred = device_per_step(layer_model.fit_layers(rest), fallback, ref, held.batch)
            actual = measured(held)["device"]
            if actual > 0:
                errors.append(100.0 * abs(pred - actual) / actual)
        if errors:
            nm.device_error_pct = max(MIN_DEVICE_ERROR_PCT, float(max(errors)))
    ref = max(samples, key=lambda s: s.batch)
    nm.d0_ns, nm.d1_ns_per_sample = device_line(models, fallback, ref)
    nm.crossover_batch = crossover(nm.host.median_ns, nm.d0_ns, nm.d1_ns_per_sample)
    m = measured(ref)
    nm.reference = {"trace": ref.profile.trace_id, "batch": ref.batch, "step_ns": m["step"], "host_ns": m["host"],
                    "device_ns": m["device"]}
    return nm


def closed_form(host: HostModel, kappa: float, device_ns: float, delta_pct: float) -> dict[str, float]:
    """Step = max(H, D) + κ min(H, D), with the interval of the host's quartiles and D × (1 ∓ δ)."""
    def f(h: float, d: float) -> float:
        return max(h, d) + kappa * min(h, d)

    delta = delta_pct / 100.0
    step = f(host.median_ns, device_ns)
    return {"step_ns": step, "low_ns": min(step, f(host.p25_ns, device_ns * (1 - delta))),
            "high_ns": max(step, f(host.p75_ns, device_ns * (1 + delta)))}
