"""Bad input: one line naming the file and what is wrong, exit code 2, no traceback, nothing in the store."""

from __future__ import annotations



from helpers import refused as assert_refused, run_cli


def test_missing_path(store, tmp_path):
    p = tmp_path / "nope.json"
    assert_refused(["ingest", str(p)], f"{p}: no such file or directory", store)


def test_empty_file(store, tmp_path):
    p = tmp_path / "empty.json"
    p.write_bytes(b"")
    assert_refused(["ingest", str(p)], f"{p}: the file is empty", store)


def test_git_lfs_pointer(store, tmp_path):
    """A clone without git-lfs holds a pointer where a published report was (an nsys ``report1.sqlite`` of 552,960
    bytes, seen in a public repository): named as such, with the size it points at, not "not a format"."""
    p = tmp_path / "report1.sqlite"
    p.write_text("version https://git-lfs.github.com/spec/v1\n"
                 "oid sha256:a1c2af0d6058114d6a1c2a21e86fbe5812197ea2d6e4293dcf997dd24db63123\nsize 552960\n")
    assert_refused(["ingest", str(p)], f"{p}: a Git LFS pointer, not the file itself (a 552,960-byte object git-lfs "
                   "did not fetch: `git lfs pull` in its repository brings it)", store)


def test_binary_file(store, tmp_path):
    p = tmp_path / "blob.bin"
    p.write_bytes(bytes(range(256)) * 10)
    code, _, err = run_cli("ingest", str(p))
    assert code == 2 and err.startswith(f"traceparse: error: {p}: not a format traceparse recognises (tried: ")
    assert "torch" in err and err.count("\n") == 1
    assert err.endswith("; `traceparse formats` lists the forms each reads)\n")  # where to look next


def test_valid_json_not_a_trace(store, tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"model": "resnet18", "lr": 0.1}')
    code, _, err = run_cli("ingest", str(p))
    assert code == 2 and err.startswith(f"traceparse: error: {p}: not a format traceparse recognises")
    assert_refused(["ingest", "--format", "torch", str(p)],
                   f'{p}: not a torch.profiler trace: no "traceEvents" array found', store)


def test_truncated_json_keeps_complete_events_and_warns(store, tmp_path):
    p = tmp_path / "cut.json"
    p.write_text('{"schemaVersion": 1, "traceEvents": [\n'
                 '{"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "tid": 7, "ts": 1, "dur": 2, "args": {"device": 0, "stream": 7}},\n'
                 '{"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "tid": 7, "ts": 5, "dur": 2, "args": {"device": 0, "stre')
    code, out, err = run_cli("ingest", str(p), "--json")
    assert code == 0
    assert err == f"traceparse: warning: {p}: the file ends early (truncated JSON); kept the 1 complete events\n"
    import json

    assert json.loads(out)["traces"][0]["event_count"] == 1


def test_truncated_before_any_event(store, tmp_path):
    p = tmp_path / "cut.json"
    p.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "ker')
    assert_refused(["ingest", str(p)], f"{p}: the trace ends before its first complete event (truncated file?)", store)


def test_truncated_gzip(store, tmp_path, samples_dir):
    data = (samples_dir / "torch" / "torch_resnet18_bs4.json.gz").read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(data[: len(data) // 2])
    code, out, err = run_cli("ingest", str(p))
    assert code == 0 and "the file ends early (truncated gzip stream)" in err


def test_wrong_type_in_event_names_the_record(store, tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "dur": 2},'
                 '{"ph": "X", "cat": "kernel", "name": "b", "ts": 3, "dur": 2, "args": {"grid": {"x": 7}}}]}')
    assert_refused(["ingest", str(p)],
                   f"{p}: traceEvents[1].args.grid: unexpected value in a trace event: "
                   "Expected `int | float | str | array | null`, got `object`", store)


def test_integer_argument_as_text_is_coerced_with_one_warning(store, tmp_path):
    """ROCm builds write some integer arguments as text (issue 17): read them, or leave them empty, and say so once."""
    p = tmp_path / "text_ids.json"
    p.write_text('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "dur": 2},'
                 '{"ph": "X", "cat": "kernel", "name": "b", "ts": 3, "dur": 2, "args": {"stream": "seven"}},'
                 '{"ph": "X", "cat": "kernel", "name": "c", "ts": 5, "dur": 2, "args": {"stream": "0x7"}}]}')
    code, _, err = run_cli("ingest", "-q", str(p))
    assert code == 0
    assert err == (f"traceparse: warning: {p}: 2 argument values not written as JSON integers (as ROCm and some "
                   "other PyTorch builds write them): args.stream 1× not an integer, left empty; "
                   "args.stream 1× text read as an integer\n")


def test_unknown_format_rule_and_bad_set(store, samples_dir):
    sample = str(samples_dir / "torch" / "torch_resnet18_bs4.json.gz")
    code, _, err = run_cli("ingest", "--format", "nope", sample)
    assert code == 2 and err.startswith("traceparse: error: unknown --format 'nope'; known formats: auto, ")
    assert "--json" not in err
    # --format names the input's format; a user asking for JSON output is told the flag that writes it
    code, _, err = run_cli("analyze", "--format", "json", sample)
    assert code == 2 and err.startswith("traceparse: error: unknown --format 'json'; known formats: auto, ")
    assert err.endswith("; --format names the input's format, --json writes the output as JSON\n")
    code, _, err = run_cli("analyze", sample, "--rule", "nope")
    assert code == 2 and err.startswith("traceparse: error: unknown rule 'nope'; known rules: ")
    assert_refused(["analyze", sample, "--set", "nodots"],
                   "--set 'nodots': expected RULE.PARAM=VALUE, e.g. low-memcpy-overlap.warning_below_pct=30", store)
    assert_refused(["analyze", sample, "--set", "kernel-share.top=many"],
                   "--set 'kernel-share.top=many': 'many' is not a valid int", store)
    assert_refused(["analyze", sample, "--set", "kernel-share.nothing=1"],
                   "--set 'kernel-share.nothing=1': rule kernel-share has no parameter 'nothing' "
                   "(it has: dominant_kernel_pct, top)", store)


def test_bad_tag(store, samples_dir):
    sample = str(samples_dir / "torch" / "torch_resnet18_bs4.json.gz")
    assert_refused(["ingest", sample, "--tag", "batch"], "--tag 'batch': expected KEY=VALUE, e.g. --tag batch=16", store)


def _cut_before_gpu_work(tmp_path):
    """The real resnet18_bs16 trace (H100) cut where its first kernel, copy or memset event begins: its header's
    deviceProperties and the host's events before that survive, none of its GPU work."""
    import gzip
    import json
    import re

    from helpers import FIXTURES

    data = gzip.decompress((FIXTURES / "torch" / "resnet18_bs16.json.gz").read_bytes())
    first = re.search(rb'"cat": ?"(kernel|gpu_memcpy|gpu_memset)"', data).start()
    p = tmp_path / "cut.json"
    p.write_bytes(data[:first])
    return p, [d["name"] for d in json.loads(data)["deviceProperties"]]


def test_a_trace_cut_before_its_gpu_work_does_not_say_it_recorded_none(store, tmp_path, monkeypatch):
    """The summary said "the trace recorded no GPU activity" of a trace cut before its GPU events, beside a header
    naming the H100 it ran on; it now says the work was not read. A whole trace whose GPU rows are gone (hand-made
    from the same file) says it recorded none, and names the GPUs listed."""
    import json

    p, names = _cut_before_gpu_work(tmp_path)
    assert names == ["NVIDIA H100 80GB HBM3"]
    code, out, err = run_cli("analyze", "--json", str(p))
    assert code == 0 and "the file ends early" in err
    [summary] = json.loads(out)["summary"]
    assert summary["gpu_busy_pct"] is None and summary["gpus_listed"] == names
    monkeypatch.setenv("COLUMNS", "300")
    code, out, _ = run_cli("analyze", str(p))
    assert ("GPU busy      - (no GPU activity read: the file ends early, and what was read holds none of the work "
            "of the 1 GPU (NVIDIA H100 80GB HBM3) its header lists)") in out
    assert "recorded no GPU activity" not in out

    whole = json.loads(p.read_bytes().rsplit(b"},", 1)[0] + b"}]}")  # the same events, closed: a whole file
    q = tmp_path / "cpu_only.json"
    q.write_text(json.dumps(whole))
    code, out, err = run_cli("analyze", str(q))
    assert code == 0 and err == ""
    assert ("GPU busy      - (the trace recorded no GPU activity, though its header lists 1 GPU (NVIDIA H100 80GB "
            "HBM3))") in out
