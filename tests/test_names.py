"""Names on the screen: shortened, demangled, and never two different names alike (issue 23, item 1).

The names are every kernel name of the shared real torch traces and the
fixtures' nsys captures, read here straight from the raw files."""

from __future__ import annotations

import gzip
import os
import json
import re
import sqlite3
from pathlib import Path

import pytest
from rich.console import Console

from helpers import FIXTURES, REPO
from traceparse.names import cut_apart, demangle, key_entry, short_name, short_names
from traceparse.report import fitted_table
from traceparse.verdict import Column

#: The shared real samples where present (they hold more names); the committed fixtures always.
SHARED = Path(os.environ.get("TRACEPARSE_SAMPLES", REPO.parent / "shared" / "samples"))


def _torch_kernel_names() -> list[str]:
    names = set()
    for path in sorted((SHARED / "torch").glob("*.json.gz")) + sorted((FIXTURES / "torch").glob("*.json.gz")):
        try:
            events = json.load(gzip.open(path)).get("traceEvents", [])
        except (OSError, ValueError):
            continue
        names |= {e["name"] for e in events if e.get("cat") == "kernel" and isinstance(e.get("name"), str)}
    return sorted(names)


def _nsys_kernel_names() -> list[str]:
    names = set()
    for path in sorted((FIXTURES / "nsys").glob("*.sqlite.gz")):
        raw = gzip.decompress(path.read_bytes())
        db = sqlite3.connect(":memory:")
        db.deserialize(raw)
        try:
            names |= {r[0] for r in db.execute(
                "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName")}
        except sqlite3.Error:
            pass
    return sorted(names)


NAMES = _torch_kernel_names()


def test_the_samples_hold_names_that_shorten_alike():
    """The case this guards against is real: the old one-name-at-a-time shortening merged dozens of them."""
    shortened = [short_name(n, 60, cut=False) for n in NAMES]
    assert len(NAMES) > 50
    assert len(set(shortened)) < len(NAMES) - 5


@pytest.mark.parametrize("width", [30, 60, 120])
def test_different_names_never_shorten_alike(width):
    for names in (NAMES, _nsys_kernel_names()):
        out = short_names(names, width, compact=True)
        assert len(set(out)) == len(names)


def test_a_name_that_clashes_with_none_is_shortened_as_alone():
    out = dict(zip(NAMES, short_names(NAMES, 60)))
    alone = {}
    for n in NAMES:
        alone.setdefault(short_name(n, 60, cut=False), []).append(n)
    singles = [v[0] for v in alone.values() if len(v) == 1]
    assert singles and all(out[n] == short_name(n, 60, cut=False) for n in singles)


def test_cutlass_convolutions_keep_what_tells_them_apart():
    convs = [n for n in NAMES if "ImplicitGemmConvolution" in n]
    assert len(convs) >= 2
    out = short_names(convs, 60)
    assert len(set(out)) == len(convs)
    assert all(len(s) <= 120 for s in out)
    assert all(s.startswith("Kernel<ImplicitGemmConvolution<") for s in out)


def test_names_that_differ_only_in_parameters_are_numbered_when_nothing_else_differs():
    names = ["void k<int>(float)", "void k<int>(double)", "void k<int>(float)"]
    out = short_names(names, 5)
    assert out[0] == out[2] and len({out[0], out[1]}) == 2


def test_identical_declarations_get_a_number():
    out = short_names(["void f<1>()", "__global__ void f<1>()", "void f<1>()"], 60)
    assert out == ["f<1>", "f<1> #2", "f<1>"]


def test_a_mangled_name_is_demangled_before_it_is_shortened():
    mangled = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"
    assert demangle(mangled) == ("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<float>, "
                                 "std::array<char*, (unsigned long)1>>(int, at::native::FillFunctor<float>, "
                                 "std::array<char*, (unsigned long)1>)")
    assert short_name(mangled, 60) == "vectorized_elementwise_kernel<…>"
    assert short_name(mangled, 100) == ("at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<…>, "
                                        "std::array<…>>")


def test_a_key_entry_is_at_most_three_lines():
    long = max(NAMES, key=len)
    assert len(long) > 1500
    entry = key_entry(long, 76)
    assert len(entry) <= 3 * 76 and "…" in entry
    assert long.startswith("_Z") and entry.startswith(demangle(long).removeprefix("void ")[:40])


def test_cut_apart_keeps_the_differing_stretch():
    a = "sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_execute_segment_k_on_kernel__5x_cudnn"
    b = a.replace("tilesize128x128x32", "tilesize128x64x32")
    out = cut_apart([a, b, "short"], 40)
    assert out[2] == "short"
    assert out[0] != out[1] and all(len(s) <= 40 for s in out[:2])
    assert "128x128x32" in out[0] and "128x64x32" in out[1]


@pytest.mark.parametrize("width", [80, 240])
def test_a_table_never_prints_two_different_names_alike(width):
    rows = [{"name": n, "time_ns": 1000 * (i + 1)} for i, n in enumerate(NAMES)]
    columns = [Column("name", "kernel", "name"), Column("time_ns", "time", "ns")]
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    for part in fitted_table(columns, rows, width):
        console.print(part)
    text = console.export_text()
    cells = [line.split("│")[0].strip() for line in text.splitlines() if "│" in line]
    assert len(cells) == len(NAMES)
    assert len(set(cells)) == len(NAMES)
    assert max(len(line) for line in text.splitlines()) <= width


def _python_function_names() -> list[str]:
    """The Python frames of a real trace profiled with_stack=True (fixtures/torch/acceptance, an H200)."""
    path = FIXTURES / "torch" / "acceptance" / "amp_stack_loader_h200.json.gz"
    events = json.load(gzip.open(path))["traceEvents"]
    return sorted({e["name"] for e in events if e.get("cat") == "python_function"})


@pytest.mark.parametrize("width", [30, 60, 120])
def test_python_frames_in_angle_brackets_are_no_templates(width):
    # "<built-in method append of list object at 0x7f…>" is Python's repr, not a C++ template argument list:
    # it read "<…>" on the screen, every such frame alike
    names = _python_function_names()
    wrapped = [n for n in names if n.startswith("<") and n.endswith(">")]
    assert len(wrapped) >= 20 and "<built-in function isinstance>" in wrapped
    shown = dict(zip(wrapped, short_names(wrapped, width)))
    assert "<…>" not in shown.values()
    assert len(set(shown.values())) == len(wrapped)  # never two alike
    for name, text in shown.items():
        assert text.startswith("<") and text.endswith(">")
        if len(name) <= width:
            assert text == name  # short enough: shown whole
    assert short_name("<built-in function isinstance>", 60) == "<built-in function isinstance>"


def test_tau_routine_names_keep_the_routine_and_its_file():
    """TAU writes a routine's return type, parameters and source location (a real OpenMP profile's 90% routine,
    s1998/parallel-DBSCAN): the screen showed 'vector<…> const&,float const&) [{…KDTree.cpp} {307,0}]' (the
    qualified-name step cut at a '::' inside the parameters), the routine's own name gone."""
    name = ("std::vector<int, std::allocator<int> > KDTree::neighborhood_indices(std::vector<float, "
            "std::allocator<float> > const&,float const&) [{/home/u/parallel-DBSCAN/src/KDTree.cpp} {307,0}]")
    assert short_name(name, 240) == name
    assert short_name(name, 70) == "KDTree::neighborhood_indices [{KDTree.cpp} {307,0}]"
    assert short_name(name, 50) == "neighborhood_indices [{KDTree.cpp} {307,0}]"
    # narrower: the location's lines go, then its file, before the routine is cut (it read "do_nonbo…{517,1}]")
    assert short_name(name, 40) == "neighborhood_indices [{KDTree.cpp}]"
    assert short_name(name, 30) == "KDTree::neighborhood_indices"
    assert short_name(name, 12) == "neighb…dices"
    ranged = "merge_remainders(int, int) [{/src/classbd.c} {10,1}-{40,2}]"
    assert short_name(ranged, 45) == "merge_remainders [{classbd.c} {10,1}-{40,2}]"
    # two routines of one name in two files stay apart
    assert short_names(["a::f(int) [{/x/a.cpp} {1,0}]", "a::f(int) [{/x/b.cpp} {1,0}]"], 20) == [
        "a::f [{a.cpp} {1,0}]", "a::f [{b.cpp} {1,0}]"]
    # a return type goes only from C++ declarations; operators keep their word
    assert short_name("unsigned long long foo::bar(int)", 10) == "foo::bar"
    assert short_name("operator new(unsigned long)", 12) == "operator new"
    throttled = "std::vector<int> KDTree::range(std::vector<float> const&) [{/src/KDTree.cpp} {55,0}] [THROTTLED]"
    assert short_name(throttled, 50) == "KDTree::range [{KDTree.cpp} {55,0}] [THROTTLED]"


def test_tau_c_routine_names_keep_the_routine():
    """TAU's source instrumentor (PDT) writes a C routine as ``RET NAME(PARAMS) C [{file} {l,c}-{l,c}]`` (the
    ``C`` its language; tau2's examples/timerphase profile has ``int foo1(int) C [{foo.c} {22,1}-{29,1}] [3]``, a
    dynamic timer's number after it). The ``C`` after the parameter list kept them from being dropped, and the
    last-component step then left ``C [{foo.cpp} {120,1}-{180,2}]``: the routine's own name gone from every table."""
    name = ("void Foo::bar(std::map<std::string, double> const&, int) C "
            "[{/home/user/src/very/long/path/foo.cpp} {120,1}-{180,2}]")
    assert short_name(name, 70) == "Foo::bar [{foo.cpp} {120,1}-{180,2}]"
    assert short_name("void f(std::vector<int, std::allocator<int> > &) C", 40) == "f"
    flux = ("double compute_flux(double *, double *, int, int, const struct grid_t *) C "
            "[{/scratch/src/flux.c} {1,1}-{9,2}]")
    assert short_name(flux, 70) == "double compute_flux [{flux.c} {1,1}-{9,2}]"
    dynamic = "int foo1(int) C [{foo.c} {22,1}-{29,1}] [3]"
    assert short_name(dynamic, 70) == dynamic  # it fits: as written
    assert short_name(dynamic, 40) == "int foo1 [{foo.c} {22,1}-{29,1}] [3]"
    assert short_names([f"int foo1(int) C [{{foo.c}} {{22,1}}-{{29,1}}] [{k}]" for k in (1, 2)], 30) == [
        "int foo1 [{foo.c}] [1]", "int foo1 [{foo.c}] [2]"]  # the dynamic timer's number stays
    gromacs = ("void do_nonbonded(t_commrec *, t_forcerec *, rvec *, rvec *, t_mdatoms *, real *, real *, real *, "
               "t_nrnb *, real, real *, int, int, int, int) C [{nonbonded.c} {271,1}-{517,1}]")  # tau2's 8.ppk
    assert [short_name(gromacs, w) for w in (48, 30, 20)] == [
        "do_nonbonded [{nonbonded.c} {271,1}-{517,1}]", "do_nonbonded [{nonbonded.c}]", "do_nonbonded"]
    assert short_name("MPI C", 3) == "M…C"  # no parameter list: no language to drop


def test_an_annotations_bracket_is_part_of_its_name():
    """DeepSeek's training trace annotates dispatch(F), dispatch(B), attn(F), attn(B), attn(W): tables showed
    "dispatch", "attn" (names no event has, and ambiguous) while the sentence above said dispatch(F). A bracket
    with no parameter types in it is no C++ parameter list."""
    assert [short_name(n, 70) for n in ("dispatch(F)", "attn(W)", "combine(B)")] == ["dispatch(F)", "attn(W)",
                                                                                   "combine(B)"]
    assert short_names(["attn(F)", "attn(B)"], 70) == ["attn(F)", "attn(B)"]
    # a signature still loses its parameters
    assert short_name("vector_add_kernel(float const*, float const*, float*, int)", 70) == "vector_add_kernel"
    assert short_name("void at::native::kernel<float>(at::TensorIteratorBase&)", 70) == "at::native::kernel<float>"
    # a type as the one parameter is a parameter list; a label before a colon is no return type
    assert short_name("ncclBroadcastKernel_copy_i8(ncclColl)", 70) == "ncclBroadcastKernel_copy_i8"
    assert short_name("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 20) == "AccumulateGrad"


def test_a_plain_functions_empty_brackets_stay():
    """TAU writes "MPI_File_open()": the table showed "MPI_File_open" beside a message quoting "MPI_File_open()"."""
    assert short_name("MPI_File_open()") == "MPI_File_open()"
    assert short_names(["MPI_Init()", "void f<1>()"]) == ["MPI_Init()", "f<1>"]


def test_a_cell_too_narrow_for_a_readable_cut_shows_its_key_number_alone():
    """A thread label squeezed into a dozen cells read "ra…0) [11]": where fewer than MIN_CUT_CELLS are left
    beside the key number, the cell is the number, and the key below gives the label whole."""
    from traceparse.report import MIN_CUT_CELLS

    labels = [f"rank {r}: 467/496 (pt_autograd_0)" for r in range(12)]
    rows = [{"thread": t, "name": "aten::convolution_backward", "a_ns": 10**9, "b_ns": 10**9, "c_ns": 10**9,
             "d_ns": 10**9} for t in labels]
    columns = [Column("thread", "thread", "text"), Column("name", "name", "name"),
               *(Column(k, k, "ns") for k in ("a_ns", "b_ns", "c_ns", "d_ns"))]
    console = Console(width=60, record=True, file=open("/dev/null", "w"))
    for part in fitted_table(columns, rows, 60):
        console.print(part)
    text = console.export_text()
    cells = [line.split("│")[0].strip() for line in text.splitlines() if "│" in line]
    assert len(cells) == 12 and all(re.fullmatch(r"\[\d+\]", c) for c in cells), cells
    assert all(re.search(r"\[\d+\] +" + re.escape(label), text) for label in labels)  # each whole in the key
    assert MIN_CUT_CELLS > len("ran…_0)")


def test_fitted_names_tell_apart_names_that_differ_in_two_places():
    """Two kernels differing near the start (128 against 64), each spelled two ways that differ at the end: one cut
    cannot always show both differences (those still alike are numbered); none reads like another, none is too wide."""
    from traceparse.names import fitted_names

    body = "x" * 200
    names = [f"ns::Kernel<Shape<{n}>, {body}>({tail})" for n in (128, 64) for tail in ("ns::Params", "T1::Params")]
    out = fitted_names(names, 60)
    assert len(set(out)) == 4 and all(len(s) <= 60 for s in out)
    assert fitted_names(["Kernel<a>", "Kernel<b>"], 60) == ["Kernel<a>", "Kernel<b>"]


def test_the_key_below_a_table_tells_two_long_names_apart():
    """Two kernels whose long names differ only in the middle read alike in the key (each cut to three lines in
    its middle): the key keeps the stretch where they differ."""
    from traceparse.names import key_entries, key_entry

    head, tail = "cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_" + "x" * 200, "_" + "y" * 200 + ">(Params)"
    a, b = head + "128x128_32x3_nn_align4" + tail, head + "256x64_32x4_nn_align4" + tail
    assert key_entry(a, 60) == key_entry(b, 60)  # what the key showed
    ea, eb = key_entries([a, b], 60)
    assert ea != eb and "128x128" in ea and "256x64" in eb
    assert max(len(ea), len(eb)) <= 60 * 3 - 4
    assert key_entries(["aten::addmm", "aten::mm"], 60) == ["aten::addmm", "aten::mm"]


def test_a_finding_title_longer_than_the_border_ends_with_an_ellipsis(tmp_path):
    """At 60 columns, arithmetic-intensity's title was cut off by the border mid-word ("...attained per─╮"); it
    ends with "…" now, and no title runs past the panel."""
    from helpers import run_cli

    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(FIXTURES / "torch" / "resnet18_bs16.json.gz"),
                             "--width", "60")
    assert code == 0, err
    tops = [line for line in out.splitlines() if line.startswith("╭─ ")]
    assert len(tops) > 8 and all(len(line) == 60 and line.endswith("─╮") for line in tops)
    [roofline] = [line for line in tops if "arithmetic-intensity" in line]
    assert roofline == "╭─ INFO  arithmetic-intensity: Roofline: arithmetic inte… ─╮"
