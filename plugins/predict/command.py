"""The ``traceparse predict`` command: ``fit``, ``run`` and ``table`` sub-commands."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import polars as pl

from traceparse import __version__
from traceparse.command import Command
from traceparse.errors import InputError, bad_input
from traceparse.figures import fmt_number, fmt_pct
from traceparse.report import fitted_table
from traceparse.text import literal
from traceparse.trace import Trace
from traceparse.verdict import Column
from traceparse_plugins.predict import layers
from traceparse_plugins.predict.attribution import profile

DEFAULT_NETWORK = "all"
TABLE_COLUMNS = ("layer_type", "pass", "calls", "ops")
GOAL_PCT = 10.0


def _number_tag(trace: Trace, tag: str) -> float:
    value = trace.meta.tags.get(tag)
    if value is None:
        raise InputError(f"trace {trace.id} ({trace.meta.path}) has no tag {tag!r}; ingest it with --tag {tag}=N "
                         f"(its tags: {', '.join(f'{k}={v}' for k, v in trace.meta.tags.items()) or 'none'})")
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise InputError(f"trace {trace.id} ({trace.meta.path}): tag {tag}={value!r} is not a positive number")
    return number


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def _pct(value: float | None) -> str:
    return fmt_pct(value)


def _batch(value: float | None) -> str:
    return "none (never GPU-bound)" if value is None else f"{value:.1f}"


class PredictCommand(Command):
    name = "predict"
    help = "fit per-layer and end-to-end time models on torch traces, and predict step time at other batch sizes"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="predict_command", metavar="fit|run|table")
        sub.required = True
        p = sub.add_parser("fit", help="fit models on traces of a batch-size sweep and validate them",
                           description="Fit per-layer-type models t = b0 + b1 × ops and end-to-end models "
                                       "step = a0 + a1 × batch; print coefficients, R² and leave-one-trace-out MAPE.")
        self.add_common_options(p, traces="+", json=True, fmt=True)
        p.add_argument("--by", default="batch", metavar="TAG", help="tag holding the batch size (default: batch)")
        p.add_argument("--network-tag", default="model", metavar="TAG",
                       help="tag naming the network, one end-to-end model per value (default: model)")
        p.add_argument("--model-out", required=True, metavar="FILE", help="where to write model.json")
        p = sub.add_parser("run", help="predict step time per layer type and in total",
                           description="Predict the step time of a trace (or a flops table) at another batch size.")
        self.add_common_options(p, traces="?", json=True, fmt=True,
                                trace_help="store id (or prefix) or path (or give --flops-table)")
        p.add_argument("--model", required=True, metavar="FILE", help="model.json written by `predict fit`")
        p.add_argument("--flops-table", metavar="FILE", help="CSV layer_type,pass,calls,ops (per step) instead of TRACE")
        p.add_argument("--batch", type=float, metavar="N", help="batch size to predict (default: the trace's)")
        p.add_argument("--by", metavar="TAG", help="tag holding the trace's batch size (default: the model's)")
        p.add_argument("--network", metavar="NAME", help="end-to-end model to use (default: the trace's tag)")
        p = sub.add_parser("table", help="write a trace's flops table (calls and ops per step per layer type)",
                           description="Write the CSV that `predict run --flops-table` reads, from a trace, "
                                       "optionally scaled to another batch size.")
        self.add_common_options(p, traces="1", json=False, fmt=True)
        p.add_argument("--batch", type=float, metavar="N", help="scale to this batch size")
        p.add_argument("--by", default="batch", metavar="TAG", help="tag holding the trace's batch size")
        p.add_argument("--out", metavar="FILE", help="write the CSV here (default: stdout)")

    def run(self, args: argparse.Namespace, session) -> int:
        batch = getattr(args, "batch", None)
        if batch is not None and not (math.isfinite(batch) and batch > 0):
            raise InputError(f"--batch {batch:g}: expected a positive batch size")
        return {"fit": self._fit, "run": self._run, "table": self._table}[args.predict_command](args, session)

    # -- fit ----------------------------------------------------------------------
    def _fit(self, args, session) -> int:
        from traceparse_plugins.predict import model  # numpy: loaded only when predicting
        from traceparse_plugins.predict import step as step_model
        from traceparse_plugins.predict.timeline import replay, timeline

        traces = _unique(session.resolve_all(args.traces, fmt=args.format))
        if len(traces) < 2:
            raise InputError(f"too few traces to fit: got {len(traces)}; predict fit needs at least 2 traces "
                             "of at least 2 batch sizes")
        samples = []
        for t in traces:
            batch = _number_tag(t, args.by)
            prof = profile(t)
            for w in prof.warnings:
                session.warn(w)
            samples.append(model.Sample(prof, t.meta.tags.get(args.network_tag, DEFAULT_NETWORK), batch,
                                        timeline(t, prof.activities)))
        if len({s.batch for s in samples}) < 2:
            raise InputError(f"too few traces to fit: all {len(samples)} traces have {args.by}="
                             f"{samples[0].batch:g}; need at least 2 batch sizes")
        layer_models = model.fit_layers(samples)
        e2e = model.fit_end_to_end(samples)
        networks = {}
        for network in sorted({s.network for s in samples}):
            mine = [s for s in samples if s.network == network]
            if len({s.batch for s in mine}) >= 2:
                networks[network] = step_model.fit_network(mine, layer_models)
        loto = model.leave_one_out(samples) if len(samples) >= 3 else None
        extra = model.extrapolation(samples)
        training = []
        for s in samples:
            m = step_model.measured(s)
            replayed = float(replay(s.timeline, s.timeline.duration.astype(float))["step_ns"].mean())
            training.append({
                "trace": s.profile.trace_id, "path": s.profile.path, "network": s.network, "batch": s.batch,
                "steps": s.profile.steps, "step_ns": s.profile.step_ns, "step_source": s.profile.step_source,
                "host_ns": m["host"], "device_ns": m["device"], "wait_ns": m["wait"], "hidden_ns": m["hidden"],
                "replay_ape_pct": model.ape(replayed, m["step"]),
                "gpu_ns_per_step": s.profile.gpu_ns / s.profile.steps,
                "attributed_pct": round(100.0 * s.profile.attributed_ns / s.profile.gpu_ns, 4)
                if s.profile.gpu_ns else None})
        validation = {"leave_one_trace_out": loto, "extrapolation_to_largest_batch": extra,
                      "goal_mape_pct": GOAL_PCT}
        doc = model.to_json(layer_models, e2e, networks,
                            {"created_by": f"traceparse {__version__}", "by": args.by,
                             "network_tag": args.network_tag, "training": training, "validation": validation})
        out = Path(args.model_out)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        tmp.replace(out)
        if args.json:
            self.print_json(doc, command=f"{self.name} fit")
            return 0
        self._print_fit(session.out, doc, loto, extra, out)
        return 0

    def _print_fit(self, console, doc: dict, loto: dict | None, extra: dict, out: Path) -> None:
        mape_types = (loto or {}).get("mape_pct", {}).get("types", {})
        rows, last = [], None
        for m in doc["layer_models"]:
            kind = m["layer_type"]
            rows.append({"type": kind if kind != last else "", "pass": m["pass"], "calls": m["points"],
                         "b0": m["b0_ns"], "b1": fmt_number(m["b1_ns_per_op"] * 1e6) + (" ∝" if m["proportional"]
                                                                                       else ""),
                         "r2": m["r2"], "mape": mape_types.get(kind) if kind != last else ""})
            last = kind
        _print_table(console, LAYER_COLUMNS, rows, "per-layer models  t = b0 + b1 × ops  (one point per layer call)")
        if any(m["proportional"] for m in doc["layer_models"]):
            console.print(literal("∝: one op count only, fitted through 0 (t = b1 × ops)", style="dim"))
        replay_err: dict[str, list[float]] = {}
        for t in doc["training"]:
            replay_err.setdefault(t["network"], []).append(t["replay_ape_pct"] or 0.0)
        host, device = [], []
        for name, m in doc["networks"].items():
            h, d = m["host"], m["device_per_step"]
            host.append({"network": name, "batches": _batches(m["batches"]), "median": h["median_ns"],
                         "iqr": _pair(h["p25_ns"], h["p75_ns"]), "kappa": m["kappa"],
                         "replay": max(replay_err.get(name, [0.0]))})
            device.append({"network": name, "d0": d["d0_ns"], "d1": d["d1_ns_per_sample"],
                           "error": m["device_error_pct"],
                           "crossover": "never" if m["crossover_batch"] is None else m["crossover_batch"]})
        _print_table(console, HOST_COLUMNS, host,
                     "step models: host time H, overlap κ; step = max(H, D) + κ·min(H, D)")
        _print_table(console, DEVICE_COLUMNS, device, "step models: device time per step D = D0 + D1 × batch")
        rows = [{"network": name, "batches": _batches(m["batches"]), "a0": m["a0_ns"], "a1": m["a1_ns_per_sample"],
                 "r2": m["r2"]} for name, m in doc["end_to_end"].items()]
        _print_table(console, AFFINE_COLUMNS, rows, "end-to-end affine baseline  step = a0 + a1 × batch")
        if loto:
            _prediction_tables(console, "leave-one-trace-out predictions", loto)
            m = loto["mape_pct"]
            console.print(f"LOTO MAPE: step time {_pct(m['step'])} (affine baseline {_pct(m['affine'])}), "
                          f"device time {_pct(m['device'])}, host time {_pct(m['host'])}, layers' GPU time "
                          f"{_pct(m['layers'])}; measured step inside the interval: {loto['inside_interval']}")
        else:
            console.print("LOTO: needs at least 3 traces")
        if extra["traces"]:
            _prediction_tables(console, "extrapolation to each network's largest batch", extra)
            m = extra["mape_pct"]
            verdict = "" if m["step"] is None else (" (goal ≤ 10%: met)" if m["step"] <= GOAL_PCT
                                                    else " (goal ≤ 10%: NOT met)")
            console.print(f"extrapolation MAPE: step time {_pct(m['step'])}{verdict}; affine baseline "
                          f"{_pct(m['affine'])}; device time {_pct(m['device'])}; layers' GPU time "
                          f"{_pct(m['layers'])}; measured step inside the interval: {extra['inside_interval']}")
        else:
            console.print(f"extrapolation: {extra.get('note', 'not possible')}")
        console.print(literal(f"wrote {out}"))

    # -- run ----------------------------------------------------------------------
    def _run(self, args, session) -> int:
        from traceparse_plugins.predict import model  # numpy: loaded only when predicting
        from traceparse_plugins.predict import step as step_model
        from traceparse_plugins.predict.timeline import timeline

        layer_models, _e2e, networks, data = model.load(Path(args.model))
        if (args.trace is None) == (args.flops_table is None):
            raise InputError("predict run: give either TRACE or --flops-table FILE")
        measured = None
        source_batch = None
        network = args.network
        sample = None
        if args.flops_table:
            per_type = read_flops_table(Path(args.flops_table))
            source = args.flops_table
        else:
            trace = session.resolve_one(args.trace, args.format, "predict run")
            prof = profile(trace)
            for w in prof.warnings:
                session.warn(w)
            per_type = prof.per_type()
            tag = args.by or data.get("by") or "batch"
            if args.batch is not None or tag in trace.meta.tags:
                source_batch = _number_tag(trace, tag)
            if args.batch is not None and args.batch != source_batch:
                per_type = scale(per_type, source_batch, args.batch)
            else:
                measured = {"step_ns": prof.step_ns}
            network = network or trace.meta.tags.get(data.get("network_tag") or "model")
            source = f"{trace.id} ({Path(trace.meta.path).name})" if trace.meta.path else str(trace.id)
            sample = model.Sample(prof, network or DEFAULT_NETWORK, source_batch or 1.0,
                                  timeline(trace, prof.activities))
        batch = args.batch if args.batch is not None else source_batch
        table = model.predict_layers(layer_models, per_type)
        types = model.by_type(table)
        missing = sorted({f"{r['layer_type']}/{r['pass']}" for r in table.iter_rows(named=True)
                          if r["predicted_ns"] is None})
        if missing:
            session.warn(f"no model for {', '.join(missing)}: left out of the total")
        total = sum(e["predicted_ns"] for e in types.values() if e["predicted_ns"] is not None)
        if network is None and len(networks) == 1:
            network = next(iter(networks))
        nm = networks.get(network)
        step = None
        if sample is not None:
            if sample.timeline is not None and sample.timeline.steps:
                if nm is None:
                    session.warn(f"no step model for network {network!r} in {args.model} (it has: "
                                 f"{', '.join(networks) or 'none'}): the host side is this trace's own and the "
                                 "device side the layer models of every network")
                    nm = step_model.fit_network([sample], layer_models, inner=False)
                step = step_model.predict(nm, layer_models, sample, batch or sample.batch)
        elif nm is not None:
            device = model.predict_layers(nm.layer_models, per_type)
            filled = [p if p is not None else f for p, f in zip(device["predicted_ns"].to_list(),
                                                                table["predicted_ns"].to_list())]
            device_ns = sum(v for v in filled if v is not None)
            step = {**step_model.closed_form(nm.host, nm.kappa, device_ns, nm.device_error_pct),
                    "device_ns": device_ns, "host_ns": nm.host.median_ns,
                    "bound": "GPU" if device_ns >= nm.host.median_ns else "host",
                    "crossover_batch": nm.crossover_batch}
        if step is not None:
            step = floor_step(step, total)
        warnings = []
        extrapolation = None
        fitted = fitted_batches(nm, data, network)
        if fitted and batch is not None:
            lo, hi = min(fitted), max(fitted)
            extrapolation = {"fitted_min": lo, "fitted_max": hi, "outside": not lo <= batch <= hi,
                             "factor": batch / hi if batch > hi else (batch / lo if batch < lo else 1.0)}
            if extrapolation["outside"]:
                where = "largest" if batch > hi else "smallest"
                warnings.append(f"extrapolating: batch {batch:g} is {extrapolation['factor']:.2f}× the {where} "
                                f"fitted batch of {network or 'the model'} ({hi if batch > hi else lo:g}; fitted "
                                f"{lo:g}–{hi:g}): the prediction is less certain than inside that range")
        for w in warnings:
            session.warn(w)
        result = {"source": source, "batch": batch, "network": network,
                  "types": {k: {"predicted_ns": v["predicted_ns"],
                                **({"measured_ns": v["measured_ns"]} if measured else {})} for k, v in types.items()},
                  "layers_predicted_ns": total,
                  "step_predicted_ns": None if step is None else step["step_ns"],
                  "step_interval_ns": None if step is None else [step["low_ns"], step["high_ns"]],
                  "device_predicted_ns": None if step is None else step["device_ns"],
                  "host_predicted_ns": None if step is None else step["host_ns"],
                  "bound": None if step is None else step["bound"],
                  "crossover_batch": None if step is None else step["crossover_batch"],
                  "extrapolation": extrapolation,
                  "step_floored_ns": None if step is None else step.get("floored_ns"),
                  "warnings": warnings,
                  **({"layers_measured_ns": sum(v["measured_ns"] for v in types.values()),
                      "step_measured_ns": measured["step_ns"]} if measured else {})}
        if args.json:
            self.print_json(result, command=f"{self.name} run")
            return 0
        out = session.out
        title = f"predicted GPU time per step by layer type, {source}" + (f", batch {batch:g}" if batch else "")
        per_kind = table.group_by("layer_type").agg(pl.col("calls").sum(), pl.col("ops").sum())
        info = {r["layer_type"]: r for r in per_kind.iter_rows(named=True)}
        rows = [{"type": kind, "calls": float(info[kind]["calls"]),
                 "ops": "-" if info[kind]["ops"] is None else fmt_number(info[kind]["ops"] / 1e6),
                 "predicted": v["predicted_ns"],
                 **({"measured": v["measured_ns"], "error": model.ape(v["predicted_ns"], v["measured_ns"])}
                    if measured else {})} for kind, v in types.items()]
        _print_table(out, RUN_COLUMNS if measured else RUN_COLUMNS[:4], rows, title)
        line = f"layers total (GPU time, layer models of every network): {_ms(total)} ms"
        if measured:
            line += f" (measured {_ms(result['layers_measured_ns'])} ms)"
        out.print(literal(line))
        if extrapolation is not None:
            if extrapolation["outside"]:  # the warning on stderr says it; this line keeps it beside the figures
                out.print(literal(f"EXTRAPOLATING: batch {batch:g} is outside the fitted range of {network or 'the model'} "
                          f"({extrapolation['fitted_min']:g}–{extrapolation['fitted_max']:g})"))
            else:
                out.print(literal(f"batch {batch:g} is inside the fitted range of {network} "
                          f"({extrapolation['fitted_min']:g}–{extrapolation['fitted_max']:g})"))
        if step is not None:
            how = "replay of this trace's timeline" if sample is not None else "max(H, D) + κ·min(H, D)"
            line = (f"step time ({network}, batch {batch:g}): {_ms(step['step_ns'])} ms, interval "
                    f"[{_ms(step['low_ns'])}, {_ms(step['high_ns'])}] ms ({how}); device {_ms(step['device_ns'])} ms, "
                    f"host {_ms(step['host_ns'])} ms: {step['bound']}-bound; crossover batch "
                    f"{_batch(step['crossover_batch'])}")
            if step.get("floored_ns"):
                what = ("the step" if "step_ns" in step.get("floored", ()) else "the interval's low end")
                line += (f"; {what} raised to the predicted GPU time per step, {_ms(step['floored_ns'])} ms: a step "
                         "is never shorter than its GPU work")
            if measured:
                line += (f" (measured {_ms(measured['step_ns'])} ms, error "
                         f"{_pct(model.ape(step['step_ns'], measured['step_ns']))})")
            out.print(literal(line))
        else:
            out.print(literal(f"step time: no prediction (no step model for network {network!r} in the file; it has "
                      f"{', '.join(networks) or 'none'}); pass --network NAME, or a trace"))
        return 0

    # -- table --------------------------------------------------------------------
    def _table(self, args, session) -> int:
        trace = session.resolve_one(args.trace, args.format, "predict table")
        prof = profile(trace)
        for w in prof.warnings:
            session.warn(w)
        per_type = prof.per_type()
        if args.batch is not None:
            per_type = scale(per_type, _number_tag(trace, args.by), args.batch)
        text = write_flops_table(per_type)
        if args.out:
            Path(args.out).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        return 0


def floor_step(step: dict, layers_ns: float) -> dict:
    """``step`` with its time and interval never below its GPU time per step: the larger of the step model's
    device time and the layer models' total (two estimates of the same GPU work; a step holds all of its GPU
    work, so it cannot take less). ``floored_ns`` is that floor when it raised a figure, else absent."""
    floor = max(step["device_ns"] or 0.0, layers_ns or 0.0)
    if min(step["step_ns"], step["low_ns"]) >= floor:
        return step
    # the floor is the device's time now: the side that binds is judged against it, not against the step model's
    # lower device estimate ("device 22.1 ms, host 22.8 ms: host-bound" beside a step raised to 28.8 ms of GPU work)
    device = max(step["device_ns"] or 0.0, floor)
    return dict(step, step_ns=max(step["step_ns"], floor), low_ns=max(step["low_ns"], floor),
                high_ns=max(step["high_ns"], floor), floored_ns=floor, device_ns=device,
                bound="GPU" if device >= (step["host_ns"] or 0.0) else "host",
                floored=[k for k in ("step_ns", "low_ns", "high_ns") if step[k] < floor])


def fitted_batches(nm, data: dict, network: str | None) -> list[float]:
    """The batches the prediction was fitted on: the network model's, else those of the model file's training
    traces of ``network`` (of every network when it has none)."""
    if nm is not None and nm.batches:
        return list(nm.batches)
    training = data.get("training") or []
    mine = [t["batch"] for t in training if t.get("network") == network]
    return sorted(set(mine or [t["batch"] for t in training if t.get("batch") is not None]))


def scale(per_type: pl.DataFrame, from_batch: float, to_batch: float) -> pl.DataFrame:
    """Ops per step at another batch size: every pass but ``update`` (optimizer) scales with the batch."""
    factor = to_batch / from_batch
    return per_type.with_columns(
        ops=pl.when(pl.col("pass") == "update").then(pl.col("ops")).otherwise(pl.col("ops") * factor))


def write_flops_table(per_type: pl.DataFrame) -> str:
    """The flops table CSV: layer_type, pass, calls, ops per step."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TABLE_COLUMNS)
    for r in per_type.iter_rows(named=True):
        writer.writerow([r["layer_type"], r["pass"], repr(float(r["calls"])),
                         "" if r["ops"] is None else repr(float(r["ops"]))])
    return buffer.getvalue()


def read_flops_table(path: Path) -> pl.DataFrame:
    """Read a flops table; a one-line error naming the line for anything malformed."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise bad_input(path, None, f"cannot be read as text: {exc}") from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or [h.strip() for h in header[:4]] != list(TABLE_COLUMNS):
        raise bad_input(path, 1, f"a header line {','.join(TABLE_COLUMNS)}")
    rows: list[dict[str, Any]] = []
    for line_no, row in enumerate(reader, start=2):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) < 4:
            raise bad_input(path, line_no, f"4 fields {','.join(TABLE_COLUMNS)}, got {len(row)}")
        kind, pass_ = row[0].strip(), row[1].strip()
        if pass_ not in layers.PASSES:
            raise bad_input(path, line_no, f"pass one of {', '.join(layers.PASSES)}, got {pass_!r}")
        values = []
        for column, text_value in zip(("calls", "ops"), row[2:4]):
            try:
                value = float(text_value) if text_value.strip() else None
            except ValueError:
                value = None
                text_value = f"{text_value!r} (not a number)"
            if value is None and column == "calls" or value is not None and (not math.isfinite(value) or value < 0):
                raise bad_input(path, line_no, f"{column} a number ≥ 0, got {text_value}")
            values.append(value)
        rows.append({"layer_type": kind, "pass": pass_, "calls": values[0], "ops": values[1]})
    if not rows:
        raise bad_input(path, None, "no rows after the header")
    return pl.DataFrame(rows, schema={"layer_type": pl.String, "pass": pl.String, "calls": pl.Float64,
                                      "ops": pl.Float64})


def _prediction_tables(console, title: str, result: dict) -> None:
    """The predictions of held-out traces, two tables that each fit the screen: step time (measured, predicted,
    interval, errors of the model and of the affine baseline) and its device and host parts."""
    rows = sorted(result["traces"], key=lambda r: (r["network"], r["batch"]))
    step, parts = [], []
    for r in rows:
        st, device, host, bound = r["step"], r.get("device", {}), r.get("host", {}), r.get("bound")
        label = f"{r['network']} {r['batch']:g}"
        step.append({"trace": label, "measured": st["measured_ns"], "predicted": st["predicted_ns"],
                     "interval": None if st["predicted_ns"] is None else _pair(st["low_ns"], st["high_ns"]),
                     "error": st["ape_pct"], "affine": r["affine"]["ape_pct"], "from": st.get("reference_batch")})
        parts.append({"trace": label, "device": device.get("measured_ns"), "device_pred": device.get("predicted_ns"),
                      "host": host.get("measured_ns"), "host_pred": host.get("predicted_ns"),
                      "bound": None if bound is None else f"{bound['measured']}/{bound['predicted']}"})
    _print_table(console, STEP_COLUMNS, step, f"{title}: step time")
    _print_table(console, PART_COLUMNS, parts, f"{title}: device and host time per step")


#: The tables of ``predict fit`` and ``predict run``, their columns in order of importance (the last are the
#: first left out on a narrow screen, :func:`traceparse.report.fitted_table`).
LAYER_COLUMNS = [Column("type", "layer type", "text"), Column("pass", "pass", "text"),
                 Column("calls", "calls", "count"), Column("b0", "b0", "ns"), Column("b1", "b1\n(ns/Mop)", "number"),
                 Column("r2", "R²", "number"), Column("mape", "LOTO\nMAPE", "pct")]
HOST_COLUMNS = [Column("network", "network", "text"), Column("median", "host\nmedian", "ns"),
                Column("iqr", "host\n[p25, p75]", "ns"), Column("kappa", "κ", "number"),
                Column("replay", "replay\nerror", "pct"), Column("batches", "batches", "text")]
DEVICE_COLUMNS = [Column("network", "network", "text"), Column("d0", "D0", "ns"),
                  Column("d1", "D1 per\nsample", "ns"), Column("error", "D error\n(δ)", "pct"),
                  Column("crossover", "GPU-bound\nfrom batch", "number")]
AFFINE_COLUMNS = [Column("network", "network", "text"), Column("a0", "a0", "ns"),
                  Column("a1", "a1 per\nsample", "ns"), Column("r2", "R²", "number"),
                  Column("batches", "batches", "text")]
STEP_COLUMNS = [Column("trace", "network\nbatch", "text"), Column("measured", "measured\nstep", "ns"),
                Column("predicted", "predicted\nstep", "ns"), Column("interval", "interval", "ns"),
                Column("error", "error", "pct"), Column("affine", "affine\nerror", "pct"),
                Column("from", "from\nbatch", "number")]
PART_COLUMNS = [Column("trace", "network\nbatch", "text"), Column("device", "measured\ndevice", "ns"),
                Column("device_pred", "predicted\ndevice", "ns"), Column("host", "measured\nhost", "ns"),
                Column("host_pred", "predicted\nhost", "ns"), Column("bound", "bound\nmeas./pred.", "text")]
RUN_COLUMNS = [Column("type", "layer type", "text"), Column("calls", "calls", "number"),
               Column("ops", "ops\n(M)", "number"), Column("predicted", "predicted", "ns"),
               Column("measured", "measured", "ns"), Column("error", "error", "pct")]


def _print_table(console, columns: list[Column], rows: list[dict], title: str) -> None:
    """One table laid out for the console's width (:func:`traceparse.report.fitted_table`)."""
    for part in fitted_table(columns, rows, console.width, title=title):
        console.print(part)


def _pair(low: float | None, high: float | None) -> tuple[float, float] | None:
    """An interval for a table cell (shown ``[low, high]`` in its column's unit), None when an end is unknown."""
    return None if low is None or high is None else (low, high)


def _batches(batches: list[float]) -> str:
    return " ".join(f"{b:g}" for b in batches)


def _unique(traces: list[Trace]) -> list[Trace]:
    seen, out = set(), []
    for t in traces:
        if t.id not in seen:
            seen.add(t.id)
            out.append(t)
    return out
