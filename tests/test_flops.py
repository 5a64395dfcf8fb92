"""``traceparse flops``: per-layer FLOPs against torch.utils.flop_counter.FlopCounterMode, and against ncu.

Parameter counts are torchvision's published ones; the VGG11 convolution's
FLOPs are also compared with the tensor ops ncu measured for that layer's
forward kernel on an H100 (fixtures/ncu).
"""

from __future__ import annotations

import csv
import json
import sys

import pytest

from helpers import FIXTURES, run_cli

#: torchvision's parameter counts (torchvision.models documentation, "Params" column)
PARAMS = {"vgg11": 132_863_336, "vgg13": 133_047_848, "vgg16": 138_357_544, "vgg19": 143_667_240,
          "alexnet": 61_100_840, "resnet18": 11_689_512, "resnet34": 21_797_672, "resnet50": 25_557_032}


def test_without_torch_the_command_says_which_extra(monkeypatch, store):
    monkeypatch.setitem(sys.modules, "torch", None)
    code, _, err = run_cli("flops", "vgg11")
    assert code == 2
    assert err == ("traceparse: error: traceparse flops needs PyTorch, which is not installed: install the torch "
                   "extra: pip install 'traceparse[torch]'\n")


def test_a_torchvision_that_does_not_import_falls_back_to_the_own_definitions(monkeypatch, store):
    """torchvision built for another torch raises RuntimeError ("operator torchvision::nms does not exist") on
    import, not ImportError: the command ended in "internal error". It counts with its own definitions."""
    pytest.importorskip("torch")
    import builtins

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name.startswith("torchvision"):
            raise RuntimeError("operator torchvision::nms does not exist")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    code, out, err = run_cli("flops", "resnet18", "--json")
    assert code == 0, err
    assert sum(layer["params"] for layer in json.loads(out)["layers"]) == PARAMS["resnet18"]


def test_bad_input_shape(store):
    code, _, err = run_cli("flops", "vgg11", "--input", "3x224")
    assert code == 2
    assert err == "traceparse: error: --input '3x224': expected CxHxW with positive sizes, e.g. 3x224x224\n"


@pytest.mark.parametrize("model", sorted(PARAMS))
def test_parameters_and_total_flops_match_flop_counter_mode(model):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from traceparse_plugins.commands.flops import layer_table, load_model

    rows = layer_table(model, batch=2)
    assert sum(r.params for r in rows) == PARAMS[model]
    net = load_model(model)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        net(torch.empty((2, 3, 224, 224), device="meta"))
    assert sum(r.flops for r in rows) == counter.get_total_flops() > 0


def test_per_layer_flops_match_flop_counter_mode_per_module():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from traceparse_plugins.commands.flops import layer_table, load_model

    rows = layer_table("resnet18", batch=1)
    net = load_model("resnet18")
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        net(torch.empty((1, 3, 224, 224), device="meta"))
    counts = counter.get_flop_counts()
    matched = 0
    for row in rows:
        if row.type not in ("Conv2d", "Linear"):
            assert row.flops == 0
            continue
        key = next(k for k in counts if k.endswith(row.layer) and k.split(".", 1)[-1] == row.layer)
        assert row.flops == sum(counts[key].values()), row.layer
        matched += 1
    assert matched == 21  # 20 convolutions (17 + 3 downsample) + fc


def test_vgg11_convolution_equals_the_tensor_ops_ncu_measured():
    pytest.importorskip("torch")
    from traceparse_plugins.commands.flops import layer_table

    rows = {r.layer: r for r in layer_table("vgg11", batch=16)}
    conv = rows["features.3"]  # 64 -> 128 channels at 112x112, the step's kernel ID 6 in the fixture
    assert conv.output_shape == [16, 128, 112, 112] and conv.params == 73_856
    with open(FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv", newline="") as f:
        table = [r for r in csv.reader(f) if len(r) > 1]
    header = table[0]
    row = next(r for r in table[2:] if r[0] == "6")
    assert row[header.index("Kernel Name")].startswith("sm80_xmma_fprop_implicit_gemm_tf32")
    measured = int(row[header.index("sm__ops_path_tensor_src_tf32_dst_fp32.sum")].replace(",", ""))
    assert conv.flops == measured == 2 * 16 * 112 * 112 * 128 * 64 * 3 * 3


def test_cli_json_and_table(store):
    pytest.importorskip("torch")
    code, out, err = run_cli("flops", "vgg11", "--batch", "16", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["total"]["params"] == PARAMS["vgg11"]
    assert data["total"]["train_step_flops"] == 3 * data["total"]["flops"]
    first = data["layers"][0]
    assert first == {"index": 1, "layer": "features.0", "type": "Conv2d", "output_shape": [16, 64, 224, 224],
                     "params": 1792, "flops": 2 * 16 * 224 * 224 * 64 * 3 * 9,
                     "bytes_moved": 4 * (16 * 3 * 224 * 224 + 16 * 64 * 224 * 224 + 1792)}
    code, out, _ = run_cli("flops", "resnet18")
    assert code == 0 and "forward: 3,628,146,688 FLOPs" in out
    code, _, err = run_cli("flops", "lenet")
    assert code == 2 and err.startswith("traceparse: error: unknown model 'lenet'; known: vgg11, vgg13")


def test_roofline_takes_the_model_flops_for_uncounted_tensor_work(samples_dir, store):
    pytest.importorskip("torch")
    from traceparse_plugins.commands.flops import model_flops

    path = samples_dir / "ncu" / "ncu_raw_resnet18_bs16.csv"
    code, out, err = run_cli("roofline", str(path), "--model", "resnet18", "--batch", "16", "--json")
    assert code == 0, err
    data = json.loads(out)
    train = 3 * model_flops("resnet18", 16)
    assert data["model_note"] == f"model FLOPs: resnet18 batch 16, 3 x forward (backward ~ 2 x forward) = {train / 1e9:.2f} GFLOP"
    assert data["flops_estimated"] == pytest.approx(train - data["flops_measured"], rel=1e-9)
    assert data["total"]["flops"] == pytest.approx(train, rel=1e-9)
    assert data["lower_bound_kernels"] == 0
