"""Build N synthetic rank traces from one real torch.profiler rank trace, with clock skew and one slow rank.

Each output rank is the base trace with:

- ``distributedInfo.rank`` = r, ``world_size`` = N, and every process group
  of ``pg_config`` widened to all N ranks;
- every timestamp shifted by a skew drawn uniformly from ``[0, --skew-us]``
  (seeded, so the same arguments give the same files);
- on the slow rank (``--slow-rank``), ``--delay-ms`` of extra compute before
  every collective: each collective call (a host op named ``c10d::*``,
  ``record_param_comms``, ``gloo:*``/``nccl:*``, or an NCCL kernel) and
  everything after it start that much later per collective passed, and the
  events that span the insertion point (the step, the backward pass) last
  that much longer;
- with ``--others-wait``, the other ranks wait for it at each collective, as
  they would on one clock: their collective calls last ``--delay-ms`` longer
  and everything after them starts that much later per collective passed, so
  every rank leaves a collective together (without it, the others never wait
  and leave each collective ``--delay-ms`` per collective before the slow rank
  does, which ranks on one clock cannot).

Usage::

    python benchmarks/make_ranks.py BASE.json.gz OUTDIR --ranks 64 [--skew-us 200] [--slow-rank 5]
        [--delay-ms 20] [--others-wait] [--seed 0]

Files are written as ``OUTDIR/rank{r}.json.gz`` (gzip level 1, no time stamp: the same arguments give the
same bytes). Generated
data belongs under benchmarks/data/ (git-ignored).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import io
import json
import random
import re
from pathlib import Path

#: Names of collective calls (host ops, annotations, kernels) before which the slow rank is delayed.
COLLECTIVE = re.compile(r"^(c10d::|record_param_comms|gloo:|nccl:|ncclKernel|ncclDevKernel)")


def collective_starts(events: list[dict]) -> list[float]:
    """Start times (µs) of the collective calls of a trace's CPU side (else its NCCL kernels), sorted."""
    starts = sorted(float(e["ts"]) for e in events
                    if e.get("ph") == "X" and COLLECTIVE.match(str(e.get("name", ""))) and "ts" in e
                    and e.get("cat") in ("cpu_op", "user_annotation", "kernel"))
    # one insertion point per distinct call (an op and its annotation start within a microsecond)
    points: list[float] = []
    for ts in starts:
        if not points or ts - points[-1] > 1.0:
            points.append(ts)
    return points


def make_rank(base: dict, rank: int, world_size: int, skew_us: float, delay_us: float, points: list[float],
              waits: bool = False) -> dict:
    """One synthetic rank from the base document: ``delay_us`` before each collective (the slow rank), or with
    ``waits`` that long inside each (a rank waiting for the slow one: what starts within 1 us of the call is the
    call, and is not moved)."""
    doc = dict(base)
    info = dict(base.get("distributedInfo") or {})
    info.update(rank=rank, world_size=world_size)
    if info.get("pg_config"):
        info["pg_config"] = [dict(g, pg_size=world_size, ranks=list(range(world_size))) for g in info["pg_config"]]
    doc["distributedInfo"] = info
    events = []
    for e in base["traceEvents"]:
        if "ts" not in e:
            events.append(e)
            continue
        e = dict(e)
        ts = float(e["ts"])
        shift = skew_us
        if delay_us:
            # collectives at or before ts (waiting: those it is past, a call and its annotation at its start not)
            passed = bisect.bisect_left(points, ts - 1.0) if waits else bisect.bisect_right(points, ts)
            shift += passed * delay_us
            if "dur" in e:  # spans an insertion point: it lasts longer
                end = ts + float(e["dur"])
                spanned = bisect.bisect_right(points, end) - passed
                if spanned > 0 and e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
                    e["dur"] = round(float(e["dur"]) + spanned * delay_us, 3)
        e["ts"] = round(ts + shift, 3)
        events.append(e)
    doc["traceEvents"] = events
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("base", type=Path, help="a real torch.profiler rank trace (.json or .json.gz)")
    parser.add_argument("out", type=Path, help="directory to write rank{r}.json.gz into")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--skew-us", type=float, default=200.0, help="largest clock skew between ranks (µs)")
    parser.add_argument("--slow-rank", type=int, default=None, help="the rank that computes longer (default: none)")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="extra compute of the slow rank per collective")
    parser.add_argument("--others-wait", action="store_true",
                        help="the other ranks wait for the slow rank at each collective (one clock, as in a real run)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    opener = gzip.open if args.base.suffix == ".gz" else open
    with opener(args.base, "rt") as f:
        base = json.load(f)
    points = collective_starts(base["traceEvents"])
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for rank in range(args.ranks):
        skew = round(rng.uniform(0, args.skew_us), 3)
        slow = rank == args.slow_rank
        waits = args.others_wait and args.slow_rank is not None and not slow
        delay = args.delay_ms * 1000 if slow or waits else 0.0
        doc = make_rank(base, rank, args.ranks, skew, delay, points, waits)
        # no time stamp in the gzip header: the same arguments give the same bytes, so the same store ids
        with open(args.out / f"rank{rank}.json.gz", "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=raw, mtime=0) as packed, \
                io.TextIOWrapper(packed, encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
    print(f"wrote {args.ranks} ranks to {args.out} ({len(points)} collectives per rank; "
          f"slow rank {args.slow_rank}, +{args.delay_ms} ms before each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
