"""Check: two checkouts of traceparse give the same ``analyze --json`` document on a set of traces.

A speed change must not change any output. This runs ``python -m traceparse analyze --json`` with the old
checkout and with the new one on each input (a path, ingested into a fresh store of each side's own, or
``STORE:ID``, a trace already stored) and compares the two documents, key by key; fields that time the run
(keys named in :data:`TIMING_KEYS`) are left out of the comparison. Each checkout is given as ``ROOT`` (its
``traceparse`` package) and ``PLUGINS`` (a folder holding a ``traceparse_plugins`` link to its ``plugins/``).

Usage::

    python benchmarks/check_same_findings.py --old ROOT:PLUGINS --new ROOT:PLUGINS [INPUT ...]

With no INPUT, the fixtures of :data:`DEFAULT_INPUTS` (relative to the new checkout). Exit status 1 when any
document differs; the first differences of each are printed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

#: Keys whose values time the run (not its findings): not compared.
TIMING_KEYS = {"elapsed_s", "elapsed", "seconds", "wall_s", "cpu_s"}
#: The fixtures checked by default (globs, relative to the new checkout's root).
DEFAULT_INPUTS = ["fixtures/torch/resnet18_bs16.json.gz", "fixtures/torch/multirank/nccl2_slow_rank1",
                  "fixtures/nsys/resnet18_bs8.sqlite.gz", "fixtures/jax/jax_gpt", "fixtures/torch/sweep18/*.json.gz",
                  "fixtures/ncu/ncu_raw_vgg11_bs16.csv"]


def analyze(side: str, target: str, workdir: str) -> dict:
    """``analyze --json`` of ``target`` with the checkout ``side`` (``ROOT:PLUGINS``): the parsed document."""
    root, plugins = side.split(":", 1)
    env = dict(os.environ, PYTHONPATH=f"{root}:{plugins}")
    if ":" in target and not os.path.exists(target):  # STORE:ID, a trace stored already
        store, ref = target.split(":", 1)
    else:  # a path: ingested into a store of this side's own
        store, ref = tempfile.mkdtemp(dir=workdir), target
    out = subprocess.run([sys.executable, "-m", "traceparse", "analyze", "--store", store, "--json", ref],
                         cwd=root, env=env, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"{side} on {target} failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def differences(old, new, path: str = "") -> list[str]:
    """Where two JSON values differ (paths into them), timing keys left out."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new)):
            if key in TIMING_KEYS:
                continue
            if key not in old or key not in new:
                found.append(f"{path}/{key}: only in {'new' if key in new else 'old'}")
            else:
                found += differences(old[key], new[key], f"{path}/{key}")
        return found
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: {len(old)} items old, {len(new)} new"]
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{path}[{i}]")]
    if old != new or type(old) is not type(new):
        return [f"{path}: old {old!r:.200} new {new!r:.200}"]
    return []


def main(argv: list[str] | None = None) -> int:
    """Compare the documents of every input; print one line per input, and the differences found."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="ROOT:PLUGINS of the old checkout")
    parser.add_argument("--new", required=True, help="ROOT:PLUGINS of the new checkout")
    parser.add_argument("inputs", nargs="*", help="paths, or STORE:ID of a stored trace")
    args = parser.parse_args(argv)
    new_root = args.new.split(":", 1)[0]
    inputs = args.inputs or [p for g in DEFAULT_INPUTS for p in sorted(glob.glob(os.path.join(new_root, g)))]
    failed = 0
    with tempfile.TemporaryDirectory() as workdir:
        for target in inputs:
            old, new = analyze(args.old, target, workdir), analyze(args.new, target, workdir)
            found = differences(old, new)
            findings = len(old.get("findings", []))
            print(f"{'SAME' if not found else 'DIFFERENT'}  {target}  ({findings} findings)", flush=True)
            for line in found[:20]:
                print("    " + line)
            failed += bool(found)
    print(f"{len(inputs) - failed} of {len(inputs)} inputs give the same document")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
