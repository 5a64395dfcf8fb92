"""A JAX trace's roofline: kernel FLOPs from the compiled modules, against an independent computation (issue 26).

Two oracles, neither using the reader's code:

* **the models' shapes**, read from fixtures/make_jax_fixtures.py (the GPT's ``vocab``, ``dim``, ``layers``,
  ``heads``, ``seq``, ``batch_size`` defaults; the MLP's ``sizes`` and batch) and the step count from
  fixtures/jax/jax_versions.json: the matmul FLOPs of a training step written out by hand;
* **the HLO**, decoded here from the wire format (``xla/service/hlo.proto`` and ``xla/xla_data.proto`` field
  numbers: HloProto 1 hlo_module; HloModuleProto 1 name, 3 computations, 5 id; HloComputationProto 2
  instructions; HloInstructionProto 1 name, 2 opcode, 3 shape, 16 convolution_dimension_numbers (3 kernel
  input feature, 6 kernel spatial), 28 custom_call_target, 30 dot_dimension_numbers (1 lhs contracting),
  35 id, 36 operand_ids, 38 called_computation_ids, 43 backend_config; ShapeProto 2 element_type, 3
  dimensions, 4 tuple_shapes), and kernel durations from the XPlane oracle of test_jax_xplane.py.
"""

from __future__ import annotations

import json
import math
import re

import polars as pl
import pytest

from helpers import FIXTURES, wire_fields, wire_varint
from test_jax_xplane import _ns, decode, gpu_work
from traceparse.ingest import read_paths
from traceparse.rule import RuleOptions
from traceparse_plugins.rules.arithmetic_intensity import ArithmeticIntensity

JAX = FIXTURES / "jax"
RUNS = {name: next((JAX / name / "plugins" / "profile").iterdir()) for name in ("jax_mlp", "jax_gpt")}
SCRIPT = (FIXTURES / "make_jax_fixtures.py").read_text()
VERSIONS = json.loads((JAX / "jax_versions.json").read_text())
CONV = JAX / "public" / "tracelens_jax_conv_minimal_legacy" / "chi-mi300x-013.ord.vultr.cpe.ice.amd.com.xplane.pb"


# -- the HLO oracle: a hand-written wire decoder ---------------------------------------------------------------
def _ints(value) -> list[int]:
    """A repeated integer field's values (packed bytes, or one varint)."""
    if isinstance(value, int):
        return [value]
    out, i = [], 0
    while i < len(value):
        v, i = wire_varint(value, i)
        out.append(v)
    return out


def _shape(b: bytes) -> dict:
    fields = list(wire_fields(b))
    return {"type": next((v for f, v in fields if f == 2), 0),
            "dims": [d for f, v in fields if f == 3 for d in _ints(v)],
            "tuple": [_shape(v) for f, v in fields if f == 4]}


def _instruction(b: bytes) -> dict:
    fields = list(wire_fields(b))
    one = lambda n, default=None: next((v for f, v in fields if f == n), default)  # noqa: E731
    dot = list(wire_fields(one(30, b"")))
    conv = list(wire_fields(one(16, b"")))
    return {"name": one(1, b"").decode(), "opcode": one(2, b"").decode(), "shape": _shape(one(3, b"")),
            "id": one(35, 0), "operands": [x for f, v in fields if f == 36 for x in _ints(v)],
            "called": [x for f, v in fields if f == 38 for x in _ints(v)], "target": one(28, b"").decode(),
            "config": one(43, b""), "lhs_contracting": [x for f, v in dot if f == 1 for x in _ints(v)],
            "kernel_in_feature": next((v for f, v in conv if f == 3), 0),
            "kernel_spatial": [x for f, v in conv if f == 6 for x in _ints(v)]}


def hlo_modules(path) -> dict[int, dict]:
    """{module id: {"name", "by_name", "by_id", "computations": {id: [instruction]}}} of an XPlane."""
    modules = {}
    for f, plane in wire_fields(path.read_bytes()):
        fields = list(wire_fields(plane)) if f == 1 else []
        if next((v for g, v in fields if g == 2), b"") != b"/host:metadata":
            continue
        stat_names = {}
        for g, entry in fields:
            if g == 5:
                key, value = [v for _, v in wire_fields(entry)]
                stat_names[key] = next(v.decode() for h, v in wire_fields(value) if h == 2)
        for g, entry in fields:
            if g != 4:
                continue
            value = [v for h, v in wire_fields(entry) if h == 2][0]
            for h, stat in wire_fields(value):
                stat_fields = dict(wire_fields(stat)) if h == 5 else {}
                if stat_names.get(stat_fields.get(1)) != "Hlo Proto":
                    continue
                module = dict(wire_fields(stat_fields[6]))[1]
                mfields = list(wire_fields(module))
                computations = {}
                for k, comp in mfields:
                    if k == 3:
                        cf = list(wire_fields(comp))
                        computations[next((v for x, v in cf if x == 5), 0)] = [_instruction(v) for x, v in cf if x == 2]
                by_id = {i["id"]: i for insts in computations.values() for i in insts}
                module_id = next((v for k, v in mfields if k == 5), 0)
                modules[module_id] = {"name": next(v for k, v in mfields if k == 1).decode(), "by_id": by_id,
                                      "by_name": {i["name"]: i for i in by_id.values()},
                                      "computations": computations}
    return modules


def _dot_flops(dot: dict, module: dict) -> int:
    """2 × ∏(result dims) × ∏(lhs contracting dims), from the decoded HLO."""
    lhs = module["by_id"][dot["operands"][0]]["shape"]["dims"]
    return 2 * math.prod(dot["shape"]["dims"]) * math.prod(lhs[d] for d in dot["lhs_contracting"])


def _operand_dims(inst: dict, module: dict) -> list[list[int]]:
    return [module["by_id"][o]["shape"]["dims"] for o in inst["operands"]]


# -- the models' oracle ----------------------------------------------------------------------------------------
def _gpt_shapes() -> dict[str, int]:
    signature = re.search(r"def gpt_workload\(key, (.*?)\):", SCRIPT).group(1)
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", signature)}


def gpt_step_matmul_flops() -> int:
    """One training step's matmul FLOPs: forward (qkv, QKᵀ, AV, proj, up, down per layer; LM head), and a
    backward of twice that (each matmul's input and weight gradients; the embedding is a gather)."""
    g = _gpt_shapes()
    tokens, d, hd = g["batch_size"] * g["seq"], g["dim"], g["dim"] // g["heads"]
    per_layer = (2 * tokens * d * 3 * d                                  # qkv
                 + 2 * 2 * g["batch_size"] * g["heads"] * g["seq"] * g["seq"] * hd  # QKᵀ and AV
                 + 2 * tokens * d * d + 2 * 2 * tokens * d * 4 * d)         # proj, up, down
    forward = g["layers"] * per_layer + 2 * tokens * d * g["vocab"]
    return 3 * forward


def mlp_step_matmul_flops() -> int:
    """One training step of the MLP: forward, every weight gradient, the input gradient of every layer but the
    first (its input is data)."""
    sizes = [int(s) for s in re.search(r"sizes = \[([\d, ]+)\]", SCRIPT).group(1).split(",")]
    batch = int(re.search(r"jax\.random\.normal\(k1, \((\d+), ", SCRIPT).group(1))
    layers = list(zip([sizes[0]] + sizes[:-1], sizes))
    one = [2 * batch * a * b for a, b in layers]
    return 2 * sum(one) + sum(one[1:])


def _steps(workload: str) -> int:
    return len(VERSIONS["workloads"][workload]["step_ms"])


@pytest.fixture(scope="module")
def traces():
    return {w: read_paths([RUNS[w] / "vm.xplane.pb"])[0] for w in RUNS} | {"conv": read_paths([CONV])[0]}


def _kernels(trace) -> pl.DataFrame:
    return trace.events.filter(pl.col("kind") == "kernel")


# -- tests -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("workload, per_step", [("jax_gpt", gpt_step_matmul_flops),
                                                ("jax_mlp", mlp_step_matmul_flops)])
def test_kernel_flops_add_up_to_the_models_matmuls(workload, per_step, traces):
    flops = _kernels(traces[workload])["flops"]
    assert flops.sum() == _steps(workload) * per_step() > 0
    assert flops.drop_nulls().min() > 0


def test_the_gpt_qkv_gemm_against_its_hlo(traces):
    """gemm_fusion_dot_17: XLA's Triton GEMM of block 0's qkv projection, replayed by the CUDA graph."""
    module = next(m for m in hlo_modules(RUNS["jax_gpt"] / "vm.xplane.pb").values() if m["name"] == "jit_step")
    fusion = module["by_name"]["gemm_fusion_dot.17"]
    (dot,) = [i for c in fusion["called"] for i in module["computations"][c] if i["opcode"] == "dot"]
    g = _gpt_shapes()
    tokens, d = g["batch_size"] * g["seq"], g["dim"]
    assert _operand_dims(dot, module) == [[tokens, d], [d, 3 * d]]   # x @ W_qkv, as the model says
    flops = _dot_flops(dot, module)
    assert flops == 2 * tokens * d * 3 * d
    tensors = _operand_dims(fusion, module) + [fusion["shape"]["dims"]]
    size = 2 * sum(math.prod(t) for t in tensors)                      # bf16 operands and result

    kernels = _kernels(traces["jax_gpt"]).filter(pl.col("name") == "gemm_fusion_dot_17")
    assert kernels.height == g["layers"] * _steps("jax_gpt")          # one per block: XLA reuses the kernel
    assert kernels["flops"].to_list() == [flops] * kernels.height
    assert kernels["bytes"].to_list() == [size] * kernels.height
    assert kernels["input_dims"].unique().to_list() == [json.dumps([[tokens, d], [d, 3 * d]])]

    raw_ns = sum(_ns(e["duration_ps"]) for e in gpu_work(decode(RUNS["jax_gpt"] / "vm.xplane.pb"))
                 if e["name"] == "gemm_fusion_dot_17")
    finding = ArithmeticIntensity().check(traces["jax_gpt"], RuleOptions(thresholds={"top": 0}))[0]
    (item,) = [i for i in finding.items if i["name"] == f"gemm_fusion_dot_17 [{tokens}x{d}, {d}x{3 * d}]"]
    assert item["flops"] == kernels.height * flops and item["time_ns"] == raw_ns
    assert item["dram_bytes"] == kernels.height * size
    assert item["achieved_gflops"] == pytest.approx(kernels.height * flops / raw_ns, abs=1e-4)
    assert item["precision"] == "bf16_tensor"


def test_the_gpt_lm_head_cublas_kernel_matched_by_the_schedule(traces):
    """The LM head's forward is a cuBLAS call (custom-call); its nvjet kernel names no instruction."""
    module = next(m for m in hlo_modules(RUNS["jax_gpt"] / "vm.xplane.pb").values() if m["name"] == "jit_step")
    g = _gpt_shapes()
    tokens, d = g["batch_size"] * g["seq"], g["dim"]
    (call,) = [i for i in module["by_id"].values() if i["target"].startswith("__cublas")
               and _operand_dims(i, module) == [[tokens, d], [d, g["vocab"]]]]
    config = json.loads(call["config"])["gemm_backend_config"]["dot_dimension_numbers"]
    result = call["shape"]["tuple"][0]["dims"]                      # (result, workspace)
    lhs = _operand_dims(call, module)[0]
    flops = 2 * math.prod(result) * math.prod(lhs[int(c)] for c in config["lhs_contracting_dimensions"])
    assert flops == 2 * tokens * d * g["vocab"]

    kernels = _kernels(traces["jax_gpt"]).filter(
        pl.col("concrete_inputs").str.json_path_match("$.instruction") == call["name"])
    assert kernels.height == _steps("jax_gpt") and kernels["name"].str.starts_with("nvjet_").all()
    assert kernels["flops"].to_list() == [flops] * kernels.height
    facts = json.loads(kernels["concrete_inputs"][0])
    assert facts["matched"] == "schedule" and facts["op"] == "dot"
    (name,) = kernels["name"].unique().to_list()
    raw_ns = sum(_ns(e["duration_ps"]) for e in gpu_work(decode(RUNS["jax_gpt"] / "vm.xplane.pb"))
                 if e["name"] == name)
    finding = ArithmeticIntensity().check(traces["jax_gpt"], RuleOptions(thresholds={"top": 0}))[0]
    (item,) = [i for i in finding.items if i["name"] == f"{name} [{tokens}x{d}, {d}x{g['vocab']}]"]
    assert item["flops"] == kernels.height * flops and item["time_ns"] == raw_ns
    assert item["achieved_gflops"] == pytest.approx(kernels.height * flops / raw_ns, abs=1e-4)


def test_f32_dots_are_held_to_tf32_and_say_so(traces):
    finding = ArithmeticIntensity().check(traces["jax_mlp"], RuleOptions(thresholds={"top": 0}))[0]
    assert finding.items and {i["precision"] for i in finding.items} == {"tf32_tensor"}
    assert all("TF32 tensor cores assumed" in i["assumed"] for i in finding.items)
    calls = sum(i["calls"] for i in finding.items)
    assert f"{calls} kernels run f32 dots at XLA's DEFAULT precision, held to the TF32 tensor-core peak" \
        in finding.message
    assert finding.metrics["flops"] == _steps("jax_mlp") * mlp_step_matmul_flops()


def test_a_convolution_run_as_two_kernels_shares_its_flops(traces):
    """MIOpen runs the MI300X capture's 3D convolution as Im3d2Col then a GEMM, both named by hlo_op."""
    module = next(m for m in hlo_modules(CONV).values() if m["name"] == "jit_forward_3d_conv")
    conv = module["by_name"]["cudnn-conv.1.0"]
    assert conv["target"] == "__cudnn$convForward"
    output = conv["shape"]["tuple"][0]["dims"]
    kernel = _operand_dims(conv, module)[1]
    flops = 2 * math.prod(output) * kernel[conv["kernel_in_feature"]] * math.prod(kernel[s] for s in conv["kernel_spatial"])

    kernels = _kernels(traces["conv"]).filter(pl.col("hlo_op") == "cudnn-conv.1.0").sort("start_ns")
    assert kernels["name"].to_list()[:2] == ["Im3d2Col", kernels["name"][1]] and kernels.height == 10
    assert kernels["flops"].sum() == pytest.approx(5 * flops, rel=1e-12)   # 5 executions
    rates = (kernels["flops"] / kernels["duration_ns"]).to_list()
    for a, b in zip(rates[::2], rates[1::2]):  # the two kernels of an execution share its rate
        assert a == pytest.approx(b, rel=1e-9)


ACCEPTANCE = (FIXTURES / "make_acceptance_captures.py").read_text()
CONVNET = next((JAX / "jax_convnet" / "plugins" / "profile").iterdir()) / "vm.xplane.pb"


def convnet_step_flops() -> tuple[int, int]:
    """One step of make_acceptance_captures.py's convnet: (its 3x3 'SAME' convolutions, each followed by a 2x2
    max pool; forward, every weight gradient, the input gradient of all but the first), (the first convolution's
    forward alone)."""
    chans = [int(c) for c in re.search(r"chans = \[([\d, ]+)\]", ACCEPTANCE).group(1).split(",")]
    n, h, w, _ = (int(v) for v in re.search(r"x = jax\.random\.normal\(key, \(([\d, ]+)\)\)", ACCEPTANCE)
                  .group(1).split(","))
    convs = []
    for a, b in zip(chans, chans[1:]):
        convs.append(2 * n * h * w * b * a * 9)
        h, w = h // 2, w // 2
    classes = int(re.search(r"\(256, (\d+)\)\) \* 0\.01", ACCEPTANCE).group(1))
    dense = 2 * n * chans[-1] * classes
    return 2 * sum(convs) + sum(convs[1:]) + 3 * dense, convs[0]


def test_the_convnet_convolutions_through_cudnn(traces):
    """cuDNN runs the first convolution as three kernels (two convertTensor, then the GEMM): one execution."""
    steps = len({e["stats"]["step_num"] for p in decode(CONVNET) for e in p["events"] if "step_num" in e["stats"]})
    trace = read_paths([CONVNET])[0]
    kernels = _kernels(trace)
    per_step, first = convnet_step_flops()
    assert steps == 3 and kernels["flops"].sum() == pytest.approx(steps * per_step, rel=1e-12)
    first_conv = kernels.filter(pl.col("hlo_op") == "cudnn-conv.3")
    assert first_conv.height == 3 * steps
    assert first_conv["flops"].sum() == pytest.approx(steps * first, rel=1e-12)
    assert first_conv["concrete_inputs"].str.json_path_match("$.op").unique().to_list() == ["convolution"]


def test_the_json_timeline_says_why_it_has_no_roofline():
    trace = read_paths([RUNS["jax_gpt"] / "vm.trace.json.gz"])[0]
    assert _kernels(trace)["flops"].null_count() == _kernels(trace).height
    finding = ArithmeticIntensity().check(trace, RuleOptions(thresholds={"top": 0}))[0]
    assert finding.message.endswith(
        "nothing to place on a roofline. A JAX JSON timeline carries no HLO: the FLOPs of XLA's kernels come from "
        "the compiled modules in the <host>.xplane.pb beside it (give that file, or the profile directory that "
        "holds it).")


def test_a_module_that_does_not_decode_is_left_out_with_a_warning(tmp_path):
    from traceparse_plugins.readers.jax.xspace_schema import message_class

    space = message_class("XSpace")()
    meta = space.planes.add(id=1, name="/host:metadata")
    meta.stat_metadata[1].name = "Hlo Proto"
    meta.event_metadata[1].name = "jit_f(7)"
    meta.event_metadata[1].stats.add(metadata_id=1, bytes_value=b"\x0a\xff")  # a module cut short
    gpu = space.planes.add(id=2, name="/device:GPU:0")
    for key, name in enumerate(("hlo_module", "hlo_op", "program_id", "correlation_id"), start=1):
        gpu.stat_metadata[key].name = name
    gpu.event_metadata[1].name = "gemm_fusion_dot_1"
    line = gpu.lines.add(id=1, name="Stream #1(Compute)", timestamp_ns=1000)
    event = line.events.add(metadata_id=1, offset_ps=0, duration_ps=5000)
    event.stats.add(metadata_id=1, str_value="jit_f")
    event.stats.add(metadata_id=2, str_value="gemm_fusion_dot.1")
    event.stats.add(metadata_id=3, uint64_value=7)
    event.stats.add(metadata_id=4, uint64_value=1)
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(space.SerializeToString())
    trace = read_paths([path])[0]
    assert f"{path}: 1 compiled module (Hlo Proto) that does not decode, left out (their kernels get no FLOPs): " \
           "jit_f(7)" in trace.meta.warnings
    kernels = _kernels(trace)
    assert kernels.height == 1 and kernels["flops"].null_count() == 1
    assert trace.meta.summary["kernels_unmatched"] == 1
