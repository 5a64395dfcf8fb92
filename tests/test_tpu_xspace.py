"""A JAX inference XSpace of 4 TPUs (openxla/xprof, Apache-2.0: fixtures/jax/tpu/xprof_tpu_inference_2/SOURCE.md):
no streams, and a critical path that reaches no event taking time (the trace's last event is an instant
``MemoryDeallocation`` marker). ``report --html`` crashed on it (``min() arg is an empty sequence``) and the
critical path's sentence read "the critical path is 0 ns: ."."""

from __future__ import annotations

import json

from helpers import FIXTURES, run_cli

TPU = FIXTURES / "jax" / "tpu" / "xprof_tpu_inference_2" / "tpu_inference_2.xplane.pb"


def test_the_html_report_of_a_path_of_zero_length(tmp_path):
    page = tmp_path / "r.html"
    code, out, err = run_cli("--store", str(tmp_path / "s"), "report", str(TPU), "--html", str(page))
    assert code == 0, err
    assert page.stat().st_size > 10_000 and "critical path" in page.read_text().lower()


def test_the_critical_paths_sentence_when_it_reached_nothing(tmp_path):
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(TPU), "--rule", "critical-path", "--json")
    assert code == 0, err
    f = json.loads(out)["findings"][0]
    assert f["metrics"]["length_ns"] == 0
    assert "the critical path is 0 ns (it reached no event that takes time)." in f["message"]
    assert ": ." not in f["message"]
