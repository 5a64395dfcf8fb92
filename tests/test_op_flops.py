"""FLOPs and bytes from recorded shapes (issue 26, item 5): the formula table, and the roofline of plain torch
traces checked against FLOPs computed here by hand from the raw JSON (Input Dims, Concrete Inputs) and the
kernels' durations summed here from the raw events."""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from decimal import Decimal

import polars as pl
import pytest

from helpers import FIXTURES, REPO, run_cli, us_to_ns
from traceparse.measures import op_flops
from traceparse.measures.op_work import owners

ALEXNET = FIXTURES / "torch" / "alexnet_bs16.json.gz"
RESNET = FIXTURES / "torch" / "resnet18_bs16.json.gz"
DOC = REPO / "docs" / "flops.md"


# -- the table and its documentation ----------------------------------------------------------------------
def test_the_documented_table_is_the_module_table():
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| ") and "`aten::" in line]
    documented = {line.split(" | ")[0][2:]: re.findall(r"`(aten::[^`]+)`", line.split(" | ")[1]) for line in rows}
    assert documented == {f.family: list(f.ops) for f in op_flops.FORMULAS}
    for f in op_flops.FORMULAS:
        assert f.source in DOC.read_text()
    assert len(op_flops.FAMILY) == sum(len(f.ops) for f in op_flops.FORMULAS)  # no operator in two families


# -- formulas on hand-made arguments ------------------------------------------------------------------------
def test_convolution_output_size_from_stride_padding_dilation():
    # 1x3x224x224 through 64x3x7x7, stride 2, padding 3: 112x112 (ResNet's stem)
    cost = op_flops.cost("aten::conv2d", [[1, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], []],
                         ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
                         ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "1"])
    assert cost.flops == 2 * 64 * 112 * 112 * 3 * 7 * 7 and cost.assumed is None
    assert cost.bytes == 4 * (3 * 224 * 224 + 64 * 3 * 7 * 7 + 64 * 112 * 112)
    # dilation 2, no padding: 32 - 2·(3-1) = 28
    cost = op_flops.cost("aten::convolution", [[2, 8, 32, 32], [16, 8, 3, 3]], ["c10::BFloat16", "c10::BFloat16"],
                         ["", "", "", "[1]", "[0]", "[2]", "False", "[0]", "1"])
    assert cost.flops == 2 * 2 * 16 * 28 * 28 * 8 * 9 and cost.dtype == "bf16"
    assert cost.bytes == 2 * (2 * 8 * 32 * 32 + 16 * 8 * 9 + 2 * 16 * 28 * 28)
    # transposed (conv_transpose2d: input, weight, bias, stride, padding, output_padding, groups, dilation):
    # 16 -> (16-1)·2 - 2 + 2 + 1 + 1 = 32; the work is 2 × N × ∏weight × input spatial
    cost = op_flops.cost("aten::conv_transpose2d", [[1, 4, 16, 16], [4, 2, 3, 3]], ["float", "float"],
                         ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1", "[1, 1]"])
    assert cost.flops == 2 * 1 * (4 * 2 * 9) * 16 * 16
    assert cost.bytes == 4 * (4 * 16 * 16 + 4 * 2 * 9 + 2 * 32 * 32)
    # no concrete inputs: output size = input size, and it says so
    cost = op_flops.cost("aten::conv2d", [[1, 3, 8, 8], [4, 3, 3, 3]])
    assert cost.flops == 2 * 4 * 8 * 8 * 27 and cost.bytes is None and "stride 1" in cost.assumed


def test_convolution_backward_counts_the_gradients_its_mask_asks_for():
    dims = [[16, 64, 55, 55], [16, 3, 224, 224], [64, 3, 11, 11], [], [], [], [], [], [], [], []]
    types = ["float"] * 3 + ["ScalarList"] * 4 + ["Scalar", "ScalarList", "Scalar", "ScalarList"]
    forward = 2 * 16 * 64 * 55 * 55 * 3 * 11 * 11
    concrete = ["", "", "", "[64]", "[4, 4]", "[2, 2]", "[1, 1]", "False", "[0, 0]", "1", "[False, True, True]"]
    cost = op_flops.cost("aten::convolution_backward", dims, types, concrete)
    assert cost.flops == forward  # the first layer computes no input gradient
    assert cost.bytes == 4 * (16 * 64 * 55 * 55 + 16 * 3 * 224 * 224 + 64 * 3 * 121 + 64 * 3 * 121 + 64)
    concrete[-1] = "[True, True, False]"
    assert op_flops.cost("aten::convolution_backward", dims, types, concrete).flops == 2 * forward
    assert op_flops.cost("aten::convolution_backward", dims, types, None).assumed.startswith("both")


@pytest.mark.parametrize("name", sorted(op_flops.SELF_FIRST_CONV_BACKWARD))
def test_a_pytorch_1_10_convolution_backward_takes_its_input_first(name):
    """Before 1.11, ``aten::cudnn_convolution_backward`` (and miopen's, mkldnn's) took ``(self, grad_output,
    weight)``; read as ``(grad_output, input, weight)``, a stride-2 layer got 4× its FLOPs. By hand, ResNet50's
    stride-2 3×3 layer on 512 channels, batch 32: 2 × 32 × (512·512·3·3) × (7·7) per gradient, two gradients."""
    dims = [[32, 512, 14, 14], [32, 512, 7, 7], [512, 512, 3, 3], [], [], [], [], [], [], [], []]
    forward = 2 * 32 * (512 * 512 * 3 * 3) * (7 * 7)
    assert op_flops.cost(name, dims).flops == 2 * forward == 14_797_504_512
    assert op_flops.cost("aten::convolution_backward", [dims[1], dims[0], *dims[2:]]).flops == 2 * forward


def test_a_forward_convolutions_output_is_taken_only_from_one_backward_shape():
    """Without concrete inputs a forward convolution takes its output shape from the backward calls of the same
    input and weight; where two give two outputs (one weight at stride 1 and 2), neither is taken, whatever
    order the calls come in (the order was polars' unique(), and the FLOPs changed from run to run)."""
    from traceparse.measures.op_work import _conv_outputs

    x, w = [8, 64, 56, 56], [64, 64, 3, 3]
    rows = [("aten::convolution_backward", json.dumps([[8, 64, 56, 56], x, w])),
            ("aten::cudnn_convolution_backward", json.dumps([x, [8, 64, 28, 28], w])),
            ("aten::convolution_backward", json.dumps([[8, 128, 28, 28], [8, 64, 56, 56], [128, 64, 1, 1]]))]
    for order in (rows, rows[::-1], rows[1:] + rows[:1]):
        keys = pl.DataFrame(order, schema=["name", "input_dims"], orient="row")
        assert _conv_outputs(keys, []) == {(None, (8, 64, 56, 56), (128, 64, 1, 1)): (8, 128, 28, 28)}
    # two ranks of a run (a _trace column), each with one of the two shapes: each rank's forward call takes its own
    ranks = pl.DataFrame([(0, *rows[0]), (1, *rows[1])], schema=["_trace", "name", "input_dims"], orient="row")
    assert _conv_outputs(ranks, ["_trace"]) == {(0, tuple(x), tuple(w)): (8, 64, 56, 56),
                                                (1, tuple(x), tuple(w)): (8, 64, 28, 28)}


def test_gemm_shapes():
    assert op_flops.cost("aten::addmm", [[4096], [16, 9216], [9216, 4096], [], []],
                         ["float", "float", "float", "Scalar", "Scalar"], ["", "", "", "1", "1"]).flops \
        == 2 * 16 * 9216 * 4096
    bmm = op_flops.cost("aten::bmm", [[8, 128, 64], [8, 64, 256]], ["c10::Half", "c10::Half"])
    assert (bmm.flops, bmm.bytes, bmm.dtype) == (2 * 8 * 128 * 256 * 64, 2 * 8 * (128 * 64 + 64 * 256 + 128 * 256),
                                                 "fp16")
    # matmul broadcasts a 2-D left operand over the right one's batch
    assert op_flops.cost("aten::matmul", [[32, 64], [4, 64, 16]]).flops == 2 * 4 * 32 * 16 * 64
    assert op_flops.cost("aten::linear", [[2, 10, 512], [1000, 512], [1000]]).flops == 2 * 20 * 512 * 1000
    assert op_flops.cost("aten::mm", [[16, 1000], [999, 4096]]) is None  # inner sizes differ: no figure
    # _addmm_activation(bias, mat1, mat2, beta, alpha, use_gelu): addmm's operands, the activation not counted; its
    # bytes: bias, mat1, mat2 read and the M × N output written, in fp16
    fused = op_flops.cost("aten::_addmm_activation", [[2048], [2656, 512], [512, 2048], [], [], []],
                          ["c10::Half"] * 3 + ["Scalar"] * 3, ["", "", "", "1", "1", "False"])
    assert (fused.flops, fused.bytes, fused.family, fused.dtype) == (
        2 * 2656 * 512 * 2048, 2 * (2048 + 2656 * 512 + 512 * 2048 + 2656 * 2048), "gemm", "fp16")


def test_attention_causal_and_backward():
    q = [8, 16, 1024, 64]
    fwd = ["", "", "", "", "0.1", "True", "", "False"]  # scaled_dot_product_attention(q, k, v, mask, p, is_causal)
    cost = op_flops.cost("aten::scaled_dot_product_attention", [q, q, q, [], [], [], [], []],
                         ["c10::BFloat16"] * 3 + ["", "Scalar", "Scalar", "", "Scalar"], fwd)
    assert cost.flops == 4 * 8 * 16 * 1024 * 1024 * 64 / 2 and cost.dtype == "bf16"
    fwd[5] = "False"
    assert op_flops.cost("aten::scaled_dot_product_attention", [q, q, q], None, fwd).flops == 4 * 8 * 16 * 1024 ** 2 * 64
    # cuDNN backward: is_causal at position 14; 2·B·H·L·S·(3E + 2E) = 10·B·H·L·S·E, halved
    back = [""] * 11 + ["1024", "1024", "0.1", "True", ""]
    cost = op_flops.cost("aten::_scaled_dot_product_cudnn_attention_backward", [q] * 5, None, back)
    assert cost.flops == 10 * 8 * 16 * 1024 * 1024 * 64 / 2
    # causal with L_q != L_kv: not halved (the mask is not a triangle)
    kv = [8, 16, 512, 64]
    assert op_flops.cost("aten::_scaled_dot_product_flash_attention", [q, kv, kv], None,
                         ["", "", "", "0.", "True", "False", ""]).flops == 4 * 8 * 16 * 1024 * 512 * 64


def test_element_wise_and_normalization():
    binary = op_flops.cost("aten::add_", [[16, 64, 55, 55], [1, 64, 1, 1], []], ["float", "float", "Scalar"])
    assert binary.flops == 16 * 64 * 55 * 55
    assert binary.bytes == 4 * (2 * 16 * 64 * 55 * 55 + 64)
    norm = op_flops.cost("aten::native_layer_norm", [[8, 1024, 1024], [], [1024], [1024], []],
                         ["float", "ScalarList", "float", "float", "Scalar"], ["", "[1024]", "", "", "1e-05"])
    assert norm.flops == 5 * 8 * 1024 * 1024 and norm.bytes == 4 * (2 * 8 * 1024 * 1024 + 2 * 1024)
    bn = [[16, 64, 56, 56], [64], [64], [64], [64], [], [], []]
    types = ["float"] * 5 + ["Scalar"] * 3
    assert op_flops.cost("aten::cudnn_batch_norm", bn, types, ["", "", "", "", "", "True", "0.1", "1e-05"]).flops \
        == 5 * 16 * 64 * 56 * 56
    assert op_flops.cost("aten::cudnn_batch_norm", bn, types, ["", "", "", "", "", "False", "0.1", "1e-05"]).flops \
        == 2 * 16 * 64 * 56 * 56  # eval mode: normalize and scale only
    assert op_flops.cost("aten::_softmax", [[4, 1000], [], []], ["float", "Scalar", "Scalar"]).flops == 3 * 4000
    assert op_flops.cost("aten::relu_", [[4, 4]], ["TensorList"]) is None  # not a tensor we can size
    assert op_flops.cost("aten::relu_", [[4, 4]], ["c10::Float8_e4m3fn"]).bytes == 2 * 16
    assert op_flops.cost("aten::empty", [[4]]) is None  # no formula



def test_a_nested_tensors_unrecorded_input_is_not_replaced_by_a_later_tensor(tmp_path):
    """Sweep 18's inference capture (nn.TransformerEncoder on padded batches: the fast path's nested tensors):
    each ``aten::native_layer_norm``'s input is recorded as dims ``[]`` of type '' (not recorded), so the first
    tensor found was the weight ([512]): 5 × 512 FLOPs and 0.2 MB a call for a layer norm of 2656 × 512 halves,
    a roofline row at "0 GFLOP/s, 0.0% of roof". No figure where the input is not recorded."""
    path = FIXTURES / "torch" / "sweep18" / "infer.json.gz"
    with gzip.open(path, "rt") as f:
        raw = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    norms = [e["args"] for e in raw if e["name"] == "aten::native_layer_norm"]
    assert len(norms) == 60 and {json.dumps(a["Input Dims"]) for a in norms} == {"[[], [], [512], [512], []]"}
    assert op_flops.cost("aten::native_layer_norm", norms[0]["Input Dims"], norms[0]["Input type"],
                         norms[0]["Concrete Inputs"]) is None
    # the rule's total: the addmm GEMMs and the fast path's fused feed-forward GEMMs (_addmm_activation: bias,
    # mat1, mat2, as addmm; 2·M·N·K, the GELU/ReLU not counted), the add_ calls with recorded dims (one FLOP an
    # element) and the outer aten::abs of each step (its inner abs.out call belongs to it), from the raw JSON
    gemm = sum(2 * math.prod(a["Input Dims"][1]) * a["Input Dims"][2][1] for a in
               (e["args"] for e in raw if e["name"] in ("aten::addmm", "aten::_addmm_activation")))
    adds = sum(math.prod(e["args"]["Input Dims"][0]) for e in raw
               if e["name"] == "aten::add_" and e["args"]["Input Dims"][0])
    abs_calls = [e for e in raw if e["name"] == "aten::abs"]
    outer = [e for e in abs_calls if not any(o is not e and o["tid"] == e["tid"] and o["ts"] <= e["ts"]
                                             and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in abs_calls)]
    expected = gemm + adds + sum(math.prod(e["args"]["Input Dims"][0]) for e in outer)
    fused = [e["args"]["Input Dims"] for e in raw if e["name"] == "aten::_addmm_activation"]
    assert len(fused) == 30 and {json.dumps(d) for d in fused} == {"[[2048], [2656, 512], [512, 2048], [], [], []]"}
    assert (gemm, adds, len(outer)) == (334_202_142_720 + 30 * 2 * 2656 * 512 * 2048, 81_592_320, 5)
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "arithmetic-intensity",
                             "--json")
    assert code == 0, err
    finding = json.loads(out)["findings"][0]
    assert finding["metrics"]["flops"] == expected == 501_395_292_160
    assert not [i["name"] for i in finding["items"] if "layer_norm" in i["name"]]


def test_fp8_gemms_are_costed_with_their_output_dtype(tmp_path):
    """A real H200 capture of ``torch._scaled_mm`` (fixtures/make_fp8_trace.py: e4m3 operands, per-tensor scales,
    outputs in bf16, fp32 and e4m3, one layer with a bias): each call is 2·M·K·N FLOPs at fp8 (tensor cores) and
    its bytes are the operands, the scales (0-dimensional fp32 tensors), the bias and the output in the
    ``out_dtype`` the script asked for (its record, not the trace's ScalarType numbers); they had no formula, so
    an FP8 model's GEMMs were missing from the roofline."""
    path = FIXTURES / "torch" / "fp8" / "fp8_scaled_mm.json.gz"
    made = json.loads((path.parent / "fp8_scaled_mm_made.json").read_text())
    size = {"bfloat16": 2, "float32": 4, "float8_e4m3fn": 1}
    with gzip.open(path, "rt") as f:
        calls = [e["args"] for e in json.load(f)["traceEvents"] if e.get("name") == "aten::_scaled_mm"]
    assert len(calls) == 3 * len(made["layers"])  # three profiled steps of four layers
    total_flops = total_bytes = 0
    for i, args in enumerate(calls):
        layer = made["layers"][i % len(made["layers"])]
        m, k, n = layer["m"], layer["k"], layer["n"]
        assert args["Input Dims"][:2] == [[m, k], [k, n]]
        flops = 2 * m * k * n
        nbytes = m * k + k * n + 2 * 4 + (2 * n if layer["bias"] else 0) + m * n * size[layer["out_dtype"]]
        cost = op_flops.cost("aten::_scaled_mm", args["Input Dims"], args["Input type"], args["Concrete Inputs"])
        assert (cost.flops, cost.bytes, cost.family, cost.dtype) == (flops, nbytes, "gemm", "fp8")
        total_flops += flops
        total_bytes += nbytes
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "arithmetic-intensity",
                             "--json")
    assert code == 0, err
    metrics = json.loads(out)["findings"][0]["metrics"]
    assert metrics["flops_by_precision"]["fp8_tensor"] == total_flops == 283_467_841_536  # the GELUs: bf16
    assert metrics["peak_mix"]["fp8_tensor"] > 99.9
    rows = [i for i in json.loads(out)["findings"][0]["items"] if "_scaled_mm" in i["name"]]
    assert sum(i["dram_bytes"] for i in rows) == total_bytes


def test_grouped_gemms_of_a_mixture_of_experts_are_costed(tmp_path):
    """A real H200 capture of an MoE feed-forward (fixtures/make_grouped_mm_trace.py: 8 experts, tokens shared
    unevenly, bf16, forward and backward, and an FP8 ``_scaled_grouped_mm``): every grouped GEMM of the block
    — up and down projections, their input gradients (2-D × 3-D, grouped along the tokens) and weight gradients
    (2-D × 2-D, grouped along K) — is 2 × tokens × hidden × ffn FLOPs, whichever operand is grouped; the bytes are
    the operands, the offsets and the output (one per group for the weight gradients). They had no formula: the
    roofline placed 21.2% of the kernel time and counted 0.25 of its 661.7 GFLOP."""
    path = FIXTURES / "torch" / "grouped_mm" / "moe_grouped_mm.json.gz"
    made = json.loads((path.parent / "moe_grouped_mm_made.json").read_text())
    assert made["fp8"] == "ran"
    tokens, hidden, ffn = sum(made["tokens_per_expert"]), made["hidden"], made["ffn"]
    experts = len(made["tokens_per_expert"])
    with gzip.open(path, "rt") as f:
        calls = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op" and "grouped_mm" in e["name"]]
    assert len(calls) == 2 * 7  # two profiled steps: 2 forward, 4 backward, 1 FP8
    flops = 2 * tokens * hidden * ffn
    outputs = {  # (A, B) -> output elements, from the sizes the script used
        ((tokens, hidden), (experts, hidden, ffn)): tokens * ffn,
        ((tokens, ffn), (experts, ffn, hidden)): tokens * hidden,
        ((hidden, tokens), (tokens, ffn)): experts * hidden * ffn,
        ((ffn, tokens), (tokens, hidden)): experts * ffn * hidden,
    }
    total = 0
    for call in calls:
        args = call["args"]
        a, b = (tuple(d) for d in args["Input Dims"][:2])
        fp8 = call["name"] == "aten::_scaled_grouped_mm"
        element = 1 if fp8 else 2
        nbytes = (math.prod(a) + math.prod(b)) * element + experts * 4 + outputs[(a, b)] * 2  # bf16 output
        if fp8:  # row-wise fp32 scales of A's rows and of each expert's columns
            nbytes += (tokens + experts * ffn) * 4
        cost = op_flops.cost(call["name"], args["Input Dims"], args["Input type"], args["Concrete Inputs"])
        assert (cost.flops, cost.bytes, cost.family, cost.dtype) == (
            flops, nbytes, "grouped gemm", "fp8" if fp8 else "bf16"), args["Input Dims"]
        total += flops
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "arithmetic-intensity",
                             "--json")
    assert code == 0, err
    metrics = json.loads(out)["findings"][0]["metrics"]
    assert metrics["flops_by_precision"]["bf16_tensor"] == 12 * flops
    assert metrics["flops_by_precision"]["fp8_tensor"] == 2 * flops
    assert total == 14 * flops == 661_424_963_584


def test_cudnn_rnn_calls_are_costed_from_their_weights(tmp_path):
    """Sweep 18's LSTM/GRU capture (H200, cuDNN 9.19): each ``aten::_cudnn_rnn`` is 2 × tokens × the elements of
    its weight matrices (every layer's input-to-hidden and hidden-to-hidden GEMMs, the gates carried by the
    shapes), its backward the same for the gradient through the sequence and again for the weight gradient
    (output_mask [True, False, False, True]); computed here from the raw JSON. They had no formula: the roofline
    placed 22.1% of the trace's kernel time (93.8% now) and said nothing of the recurrent layers that own most of
    it."""
    path = FIXTURES / "torch" / "sweep18" / "lstm_gru.json.gz"
    with gzip.open(path, "rt") as f:
        raw = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op"]
    rnn = [e["args"] for e in raw if e["name"] in ("aten::_cudnn_rnn", "aten::_cudnn_rnn_backward")]
    assert len(rnn) == 12

    def forward(args):
        x, weights = args["Input Dims"][0], args["Input Dims"][1]
        return 2 * x[0] * x[1] * sum(w[0] * w[1] for w in weights if len(w) == 2)

    expected = {}
    for args in rnn:
        backward = args["Concrete Inputs"][-1] == "[True, False, False, True]"
        flops = forward(args) * (2 if backward else 1)
        cost = op_flops.cost("aten::_cudnn_rnn_backward" if backward else "aten::_cudnn_rnn", args["Input Dims"],
                             args["Input type"], args["Concrete Inputs"])
        assert cost.flops == flops and cost.dtype == "fp32" and cost.assumed is None
        expected[json.dumps(args["Input Dims"][0]), backward] = flops
    # the LSTM (two layers, 256 -> 512) and the GRU (512 -> 512) over 32 × 64 tokens, forward
    gru, lstm_fwd = 2 * 2048 * 2 * 1536 * 512, 2 * 2048 * 2048 * (256 + 3 * 512)
    assert set(expected.values()) == {gru, lstm_fwd, 2 * gru, 2 * lstm_fwd}
    lstm = next(a for a in rnn if len(a["Input Dims"][1]) == 8 and a["Concrete Inputs"][-1] == "")
    # its bytes: input, flat weights, hx, cx read; output (tokens × 512) and hy, cy written; fp32
    tokens, hx = 32 * 64, 2 * 32 * 512
    assert op_flops.cost("aten::_cudnn_rnn", lstm["Input Dims"], lstm["Input type"], lstm["Concrete Inputs"]).bytes \
        == 4 * (tokens * 256 + 3678208 + 2 * hx + tokens * 512 + 2 * hx)
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "arithmetic-intensity",
                             "--json")
    assert code == 0, err
    items = [i for i in json.loads(out)["findings"][0]["items"] if i["operator"].startswith("aten::_cudnn_rnn")]
    assert sum(i["flops"] for i in items) == 3 * sum(expected.values())  # 3 steps, each call once a step
    assert {i["precision"] for i in items} == {"tf32_tensor"}  # cuDNN ran them on TF32 tensor-op GEMMs


def test_rnn_arguments_without_sizes_give_what_they_can():
    """Hand-written arguments (edge cases): a bidirectional LSTM with projections writes tokens × proj × 2; a
    backward call without output_mask assumes the weight gradient and says so; a weight list without a matrix,
    or not a list, gives no figure."""
    weights = [[64, 16], [64, 8], [64], [64], [8, 16]] * 2  # two directions: w_ih, w_hh, biases, w_hr
    dims = [[5, 3, 16], weights, [], [], [2, 3, 8], [2, 3, 16]]
    concrete = [""] * 6 + ["2", "16", "8", "1", "False", "0.", "True", "True", "[]", ""]
    cost = op_flops.cost("aten::_cudnn_rnn", dims, ["float", "TensorList", "Scalar", "", "float", "float"],
                         concrete)
    assert cost.flops == 2 * 15 * 2 * (64 * 16 + 64 * 8 + 8 * 16)
    assert cost.bytes == 4 * (5 * 3 * 16 + 2 * 3 * 8 + 2 * 3 * 16 + 15 * 8 * 2 + 2 * 3 * 8 + 2 * 3 * 16)
    back = op_flops.cost("aten::_cudnn_rnn_backward", dims, None, None)
    assert back.flops == 2 * cost.flops and back.assumed == "the weight gradient too (output_mask not recorded)"
    assert op_flops.cost("aten::_cudnn_rnn", [[5, 3, 16], [[64], [64]]]) is None
    assert op_flops.cost("aten::_cudnn_rnn", [[5, 3, 16], "weights"]) is None
    assert op_flops.cost("aten::miopen_rnn", [[15, 16], [[48, 16], [48, 16]]]).flops == 2 * 15 * 2 * 48 * 16


def test_calls_on_sparse_tensors_are_left_out(tmp_path):
    """Sweep 18's sparse-embedding capture: each step adds the three tables' sparse gradients into their dense
    200,000 × 64 weights (``aten::add`` of a dense and a sparse tensor, Kineto recording the sparse one's dense
    shape and strides ``[]``); costed as a dense add it read as 205 MB a call, 5.5 of the roofline's 9.7 GB.
    A formula call with a sparse tensor's accessor (``aten::_values``, ``aten::_indices``, ...) inside it is left
    out and counted; found here from the raw JSON by containment on the thread."""
    path = FIXTURES / "torch" / "sweep18" / "embbag_sparse.json.gz"
    with gzip.open(path, "rt") as f:
        ops = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    accessors = [e for e in ops if e["name"] in ("aten::_values", "aten::_indices", "aten::_nnz")]
    formula = [e for e in ops if e["name"] in op_flops.FAMILY and e["args"].get("Input Dims")]

    def inside(inner, outer):
        return inner["tid"] == outer["tid"] and outer["ts"] <= inner["ts"] \
            and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]

    owning = [e for e in formula if any(inside(a, e) for a in accessors)]
    # those that would be placed: no other formula call inside them (SparseAdam's aten::mul of a dense and a
    # sparse tensor holds a dense aten::mul of the values; the aten::add_ around each add holds the add)
    innermost = [e for e in owning if not any(o is not e and inside(o, e) for o in formula)]
    assert {e["name"] for e in innermost} == {"aten::add"} and len(innermost) == 27
    assert all(e["args"]["Input Strides"][1] == [] and e["args"]["Input Dims"][1] == [200000, 64] for e in innermost)
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "arithmetic-intensity",
                             "--json")
    assert code == 0, err
    finding = json.loads(out)["findings"][0]
    assert finding["metrics"]["sparse_calls"] == 27
    assert not [i for i in finding["items"] if "200000" in i["input_dims"]]
    assert " 27 calls on sparse tensors are left out: their recorded shapes are the dense ones, which no formula " \
           "here fits." in finding["message"]


def test_arguments_that_fit_no_real_call_give_no_figure():
    """A damaged or hostile file: no figure rather than a wrong one, and never an exception."""
    huge = [2 ** 63, 2 ** 63]
    assert op_flops.cost("aten::mm", [huge, huge], ["float", "float"]) is None  # past torch's int64 sizes
    assert op_flops.cost("aten::conv2d", [[1, 3, 8, 8], [4, 3, 3, 3]], ["float"] * 2,
                         ["", "", "", "[0, 0]", "[1, 1]", "[1, 1]", "1"]) is None  # stride 0
    assert op_flops.cost("aten::conv2d", [[1, 3, 2, 2], [4, 3, 5, 5]], ["float"] * 2,
                         ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"]) is None  # kernel larger than the input
    assert op_flops.cost("aten::mm", [[-4, 2], [2, 3]]) is None  # negative size
    assert op_flops.cost("aten::mm", [["a", 2], [2, 3]]) is None
    assert op_flops.cost("aten::scaled_dot_product_attention", [[1, 2, 3], [1, 2, 3], [1, 2, 3]]) is None  # not 4-D
    # a stride written as text: the output size falls back to the same-size assumption, and says so
    cost = op_flops.cost("aten::conv2d", [[1, 3, 8, 8], [4, 3, 3, 3]], ["float"] * 2,
                         ["", "", "", "same", "[1, 1]", "[1, 1]", "1"])
    assert cost.flops == 2 * 4 * 64 * 27 and cost.assumed


# -- owners: the innermost formula operator around each operator ----------------------------------------------
def test_owner_is_the_innermost_enclosing_formula_operator():
    """Formula op 1 holds formula op 2 (which holds formula op 3, which holds plain op 4), then formula op 5, then
    plain op 6 (holding 7) after both: 6 and 7 belong to 1, the nearest formula op around them, though 5 is the
    last formula op before them. 8 is outside any; 10 has the same span as formula op 9 (listed first)."""
    spans = {1: (0, 100), 2: (10, 40), 3: (15, 30), 4: (20, 25), 5: (45, 60), 6: (70, 80), 7: (72, 75),
             8: (200, 210), 9: (300, 400), 10: (300, 400)}
    ops = pl.DataFrame({"event_id": list(spans), "pid": [1] * len(spans), "tid": [1] * len(spans),
                        "start": [s for s, _ in spans.values()], "end": [e for _, e in spans.values()]})
    got = owners(ops, pl.DataFrame({"event_id": [1, 2, 3, 5, 9]}))
    assert dict(got.select("event_id", "owner").iter_rows()) == {1: 1, 2: 2, 3: 3, 4: 3, 5: 5, 6: 1, 7: 1, 8: None,
                                                                  9: 9, 10: 9}
    assert set(got.filter(pl.col("leaf").fill_null(False))["event_id"]) == {3, 5, 9}  # 1 holds 2 and 5, 2 holds 3
    assert got.filter(pl.col("event_id").is_in([4, 6, 7, 8, 10]))["leaf"].null_count() == 5  # not formula ops


# -- real traces: the rule against a hand computation from the raw JSON ---------------------------------------
def raw_events(path):
    with gzip.open(path, "rt") as f:
        return json.load(f, parse_float=Decimal)["traceEvents"]


def hand_flops(e) -> int | None:
    """GEMM and convolution FLOPs of one raw cpu_op event, written out from its arguments."""
    a = e["args"]
    dims, concrete = a.get("Input Dims"), a.get("Concrete Inputs")
    if e["name"] == "aten::addmm":  # addmm(bias, mat1[M, K], mat2[K, N])
        (m, k), (_, n) = dims[1], dims[2]
        return 2 * m * k * n
    if e["name"] == "aten::mm":
        (m, k), (_, n) = dims[0], dims[1]
        return 2 * m * k * n
    if e["name"] == "aten::cudnn_convolution":  # (input, weight, padding, stride, dilation, groups, ...)
        (n, _, h, w), (k, c, r, s) = dims[0], dims[1]
        pad, stride, dil = (json.loads(concrete[i]) for i in (2, 3, 4))
        ho = (h + 2 * pad[0] - dil[0] * (r - 1) - 1) // stride[0] + 1
        wo = (w + 2 * pad[1] - dil[1] * (s - 1) - 1) // stride[1] + 1
        return 2 * n * k * ho * wo * c * r * s
    if e["name"] == "aten::convolution_backward":  # (grad_output, input, weight, ..., output_mask)
        gy, w = dims[0], dims[2]
        mask = [m.strip() == "True" for m in concrete[10].strip("[]").split(",")]
        return (mask[0] + mask[1]) * 2 * math.prod(gy) * math.prod(w[1:])
    return None


def hand_rates(path) -> dict[tuple[str, str], tuple[int, int]]:
    """Per (operator, Input Dims): Σ FLOPs by hand and Σ duration of the kernels launched by the call or by the
    operators nested in it on its thread (by External id), from the raw events alone."""
    events = raw_events(path)
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    kernel_ns = defaultdict(int)
    for e in events:
        if e.get("cat") == "kernel" and "External id" in e.get("args", {}):
            kernel_ns[e["args"]["External id"]] += us_to_ns(e["dur"])
    by_thread = defaultdict(list)
    for e in ops:
        by_thread[(e["pid"], e["tid"])].append(e)
    out = defaultdict(lambda: [0, 0])
    for e in ops:
        flops = hand_flops(e)
        if flops is None:
            continue
        start, end = us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])
        inside = [o for o in by_thread[(e["pid"], e["tid"])]
                  if start <= us_to_ns(o["ts"]) and us_to_ns(o["ts"]) + us_to_ns(o["dur"]) <= end]
        key = (e["name"], json.dumps(e["args"]["Input Dims"], separators=(",", ":")))
        out[key][0] += flops
        out[key][1] += sum(kernel_ns[o["args"]["External id"]] for o in inside)
    return {k: (f, t) for k, (f, t) in out.items()}


def rule_items(tmp_path, path) -> tuple[dict, dict]:
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", str(path), "--rule",
                             "arithmetic-intensity", "--json", "--set", "arithmetic-intensity.top=0")
    assert code == 0, err
    (finding,) = json.loads(out)["findings"]
    return finding, {(i["operator"], i["input_dims"]): i for i in finding["items"]}


@pytest.mark.parametrize("path", [ALEXNET, RESNET], ids=lambda p: p.name)
def test_gemm_and_convolution_tflops_match_a_hand_computation(tmp_path, path):
    hand = hand_rates(path)
    finding, items = rule_items(tmp_path, path)
    kinds = {name for name, _ in hand}
    assert {"aten::cudnn_convolution", "aten::convolution_backward", "aten::addmm"} <= kinds
    for key, (flops, ns) in hand.items():
        item = items[key]
        assert item["flops"] == flops, key
        assert ns > 0 and item["time_ns"] == ns, key
        assert item["achieved_gflops"] / 1e3 == pytest.approx(flops / ns / 1e3, rel=0.05), key  # TFLOP/s within 5%
    assert "Derived from recorded shapes, not measured" in finding["message"]


def test_alexnet_largest_addmm(tmp_path):
    """AlexNet's fc6 (16x9216 by 9216x4096, bias 4096): 2·16·9216·4096 FLOPs and 4·(4096 + 16·9216 + 9216·4096 +
    16·4096) bytes per call; its TFLOP/s over its own kernels."""
    _, items = rule_items(tmp_path, ALEXNET)
    item = items[("aten::addmm", "[[4096],[16,9216],[9216,4096],[],[]]")]
    assert item["calls"] == 2 and item["flops"] == 2 * 2 * 16 * 9216 * 4096
    assert item["dram_bytes"] == 2 * 4 * (4096 + 16 * 9216 + 9216 * 4096 + 16 * 4096)
    assert item["precision"] == "fp32" and item["tensor_core"] is False  # fp32 GEMMs run SIMT (sgemm) here


def test_the_whole_is_no_larger_than_the_trace(tmp_path):
    events = raw_events(RESNET)
    kernel_ns = sum(us_to_ns(e["dur"]) for e in events if e.get("cat") == "kernel")
    finding, items = rule_items(tmp_path, RESNET)
    m = finding["metrics"]
    assert m["kernel_time_ns"] == kernel_ns
    assert sum(i["time_ns"] for i in items.values()) == m["time_ns"] == m["placed_time_ns"] <= kernel_ns
    assert 0 < m["placed_time_pct"] <= 100
    assert m["placed_time_pct"] == round(100 * m["placed_time_ns"] / kernel_ns, 2)
    assert sum(i["calls"] for i in items.values()) == m["operator_calls"]


def test_shared_resnet18_sample(tmp_path, samples_dir):
    """The shared sample (made apart from the fixtures, with profile_memory): the same hand computation."""
    path = samples_dir / "torch" / "torch_resnet18_bs16.json.gz"
    hand = hand_rates(path)
    _, items = rule_items(tmp_path, path)
    assert len(hand) >= 20
    for key, (flops, ns) in hand.items():
        assert items[key]["flops"] == flops and items[key]["time_ns"] == ns, key
        assert items[key]["achieved_gflops"] == pytest.approx(flops / ns, rel=0.05), key


def test_causal_attention_of_the_bf16_transformer(tmp_path, samples_dir):
    """The GPT sample (bf16 autocast, cuDNN SDPA, is_causal=True): forward 4·B·H·L²·E / 2 and backward
    10·B·H·L²·E / 2 from the raw Input Dims, held to the bf16 tensor-core peak, timed by their own kernels."""
    path = samples_dir / "torch" / "gpt_1024d_8l_bs8_bf16.json.gz"
    events = raw_events(path)
    kernel_ns = defaultdict(int)
    for e in events:
        if e.get("cat") == "kernel" and "External id" in e.get("args", {}):
            kernel_ns[e["args"]["External id"]] += us_to_ns(e["dur"])
    want = {}
    for name, factor, causal_at, q_at in (("aten::_scaled_dot_product_cudnn_attention", 4, 6, 0),
                                          ("aten::_scaled_dot_product_cudnn_attention_backward", 10, 14, 1)):
        calls = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == name]
        assert calls and all(e["args"]["Concrete Inputs"][causal_at] == "True" for e in calls)
        b, h, seq, dim = calls[0]["args"]["Input Dims"][q_at]
        ops = [o for o in events if o.get("cat") == "cpu_op"]
        ns = 0
        for e in calls:  # its kernels: its own and those of the operators nested in it (aten::_cudnn_attention_*)
            start, end = us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])
            ns += sum(kernel_ns[o["args"]["External id"]] for o in ops if o["tid"] == e["tid"]
                      and start <= us_to_ns(o["ts"]) and us_to_ns(o["ts"]) + us_to_ns(o["dur"]) <= end)
        want[name] = (len(calls) * factor * b * h * seq * seq * dim // 2, ns)
    _, items = rule_items(tmp_path, path)
    for name, (flops, ns) in want.items():
        (item,) = [i for i in items.values() if i["operator"] == name]
        assert (item["flops"], item["time_ns"], item["precision"]) == (flops, ns, "bf16_tensor")


# -- against ncu's measured FLOPs ------------------------------------------------------------------------------
VGG11_CONVS = [(3, 64, 224), (64, 128, 112), (128, 256, 56), (256, 256, 56), (256, 512, 28), (512, 512, 28),
               (512, 512, 14), (512, 512, 14)]  # torchvision's vgg11 (configuration "A"): C_in, C_out, size; 3x3, pad 1


def ncu_kernel_flops(path) -> list[tuple[str, float, float]]:
    """(kernel name, TF32 tensor FLOPs, fp32 SASS FLOPs = fadd + fmul + 2·ffma) per kernel of an ncu raw page."""
    import csv

    rows = [r for r in csv.reader(path.read_text().splitlines()) if r and not r[0].startswith("==PROF==")]
    header, data = rows[0], rows[2:]  # the second row holds the units
    col = {name: i for i, name in enumerate(header)}
    num = (lambda r, name: float(r[col[name]].replace(",", "") or 0))  # noqa: E731
    sass = "sm__sass_thread_inst_executed_op_f{}_pred_on.sum"
    return [(r[col["Kernel Name"]], num(r, "sm__ops_path_tensor_src_tf32_dst_fp32.sum"),
             num(r, sass.format("add")) + num(r, sass.format("mul")) + 2 * num(r, sass.format("fma"))) for r in data]


def test_vgg11_convolutions_against_ncu():
    """ncu measured every kernel of one VGG11 batch-16 SGD step (fixtures/ncu/README.md). The formula table on
    the step's convolution shapes (forward; backward with both gradients, the first layer's weight gradient
    only) gives 715.83 GFLOP; ncu's convolution kernels (fprop, dgrad, wgrad) measured 724.09 GFLOP (TF32
    tensor ops 717.19 + SASS fp32 6.90, mostly the first layer's two SIMT kernels). Ratio 1.0115,
    held to 2%. The classifier's GEMMs are not compared here: ncu counts the padded tiles of SIMT sgemm with
    M = 16 (1.34× the formula), see docs/flops.md."""
    n = 16
    derived = 0.0
    for i, (c, k, size) in enumerate(VGG11_CONVS):
        x, w = [n, c, size, size], [k, c, 3, 3]
        types = ["float"] * 3 + ["ScalarList"] * 3 + ["Scalar"]
        derived += op_flops.cost("aten::conv2d", [x, w, [k], [], [], [], []], types,
                                 ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "1"]).flops
        mask = "[False, True, True]" if i == 0 else "[True, True, True]"  # no gradient for the input images
        derived += op_flops.cost("aten::convolution_backward", [[n, k, size, size], x, w] + [[]] * 8,
                                 ["float"] * 3 + ["ScalarList"] * 8,
                                 ["", "", "", f"[{k}]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", mask]).flops
    forward = [2 * n * k * size * size * c * 9 for c, k, size in VGG11_CONVS]
    assert derived == 3 * sum(forward) - forward[0]  # forward + two gradients, less the first layer's input gradient
    conv = [(t, s) for name, t, s in ncu_kernel_flops(FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv")
            if re.search(r"fprop|dgrad|wgrad", name)]
    measured = sum(t + s for t, s in conv)
    assert round(derived / 1e9, 2) == 715.83 and round(measured / 1e9, 2) == 724.09
    assert measured / derived == pytest.approx(1.0, abs=0.02)
