"""The built-in GPU catalog: spec-sheet figures of NVIDIA and AMD GPUs, as data (``gpus.toml``).

This plugin only loads the data file and hands its entries to the core
(hook ``traceparse_gpu_specs``); :mod:`traceparse.catalog` matches device
names against them. Fields and units: docs/gpu_catalog.md. A source value
naming a key of the file's ``[pcie]`` table (``"pcie.gen3"``) is replaced by
that table's text, so the PCIe arithmetic is written once.
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources

from traceparse.catalog import PRECISIONS  # noqa: F401 - the precisions ``peak_tflops`` may list (one list)
from traceparse.plugins import hookimpl

DATA_FILE = "gpus.toml"


@lru_cache(maxsize=1)
def load_catalog() -> tuple[dict, ...]:
    """The entries of ``gpus.toml`` (read once), with shared source texts filled in."""
    text = resources.files(__package__).joinpath(DATA_FILE).read_text(encoding="utf-8")
    data = tomllib.loads(text)
    shared = {f"pcie.{key}": value for key, value in data.get("pcie", {}).items()}
    entries = []
    for entry in data.get("gpu", []):
        entry = dict(entry)
        entry["sources"] = {key: shared.get(value, value) for key, value in entry.get("sources", {}).items()}
        entries.append(entry)
    return tuple(entries)


@hookimpl
def traceparse_gpu_specs():
    """Every entry of the built-in catalog (copies, so callers cannot alter the cache)."""
    return [_copy(entry) for entry in load_catalog()]


def _copy(entry: dict) -> dict:
    return {key: (dict(value) if isinstance(value, dict) else list(value) if isinstance(value, list) else value)
            for key, value in entry.items()}
