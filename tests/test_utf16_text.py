"""Profiler text written as UTF-16 with a byte-order mark, as Windows PowerShell's ``>`` redirect writes it
(a public ncu log of Nsight Compute 2025.4.1 was so; refused as "not a format traceparse recognises"): every text
reader reads it as the same text in UTF-8. Made here from real fixtures, re-encoded with CRLF line ends."""

from __future__ import annotations

import gzip
import json

import pytest

from helpers import FIXTURES, run_cli

TEXTS = [FIXTURES / "ncu" / "ncu_sol_vgg11_bs16.txt", FIXTURES / "nvprof" / "real" / "cudajl_gpu_trace.log",
         FIXTURES / "nvprof" / "real" / "pytorch_wavelets_summary.log", FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv",
         FIXTURES / "nvprof" / "real" / "rlscope_gpu_trace.csv"]


def _analysis(store, path) -> tuple[list, list]:
    code, out, err = run_cli("--store", str(store), "analyze", str(path), "--json", "--all")
    assert code == 0, err
    doc = json.loads(out)
    return ([(f["rule"], f["severity"], f["message"], f["metrics"]) for f in doc["findings"]],
            [t["format"] for t in doc["traces"]])


@pytest.mark.parametrize("path", TEXTS, ids=[p.name for p in TEXTS])
@pytest.mark.parametrize("endian", ["utf-16-le", "utf-16-be"])
def test_utf16_text_reads_as_its_utf8(tmp_path, path, endian):
    text = path.read_text(encoding="utf-8").replace("\r\n", "\n").replace("\n", "\r\n")
    bom = b"\xff\xfe" if endian == "utf-16-le" else b"\xfe\xff"
    wide = tmp_path / path.name
    wide.write_bytes(bom + text.encode(endian))
    plain = tmp_path / "plain" / path.name
    plain.parent.mkdir()
    plain.write_text(text, encoding="utf-8", newline="")
    expected = _analysis(tmp_path / "a", plain)
    assert _analysis(tmp_path / "b", wide) == expected
    packed = tmp_path / (path.name + ".gz")  # gzipped too
    packed.write_bytes(gzip.compress(wide.read_bytes()))
    assert _analysis(tmp_path / "c", packed) == expected
