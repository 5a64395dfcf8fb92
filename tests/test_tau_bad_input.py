"""TAU bad input: one line naming file, line and what was expected; exit 2; nothing stored. Entity bombs refused fast."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from helpers import FIXTURES, refused as assert_refused, run_cli
from traceparse.ingest import read_paths

CPI = FIXTURES / "tau" / "real" / "cpi-mpi"
MALICIOUS = FIXTURES / "tau" / "handwritten" / "malicious"
REFUSED = "XML with a DOCTYPE or ENTITY declaration is refused (entities are never expanded)"


def profile_dir(tmp_path: Path, lines: list[str]) -> tuple[Path, Path]:
    d = tmp_path / "run"
    d.mkdir()
    f = d / "profile.0.0.0"
    f.write_text("\n".join(lines) + "\n")
    return d, f


def real_lines() -> list[str]:
    return (CPI / "profile.0.0.0").read_text().splitlines()


def test_header_that_is_not_taus(store, tmp_path):
    lines = real_lines()
    lines[0] = "23 functions_MULTI_TIME"
    d, f = profile_dir(tmp_path, lines)
    assert_refused(["ingest", str(d)], f"{f}:1: not a TAU profile: expected '<n> templated_functions_MULTI_<METRIC>' "
                                      "or '<n> templated_functions', found '23 functions_MULTI_TIME'", store)


def test_fewer_rows_than_the_header_says(store, tmp_path):
    lines = real_lines()
    lines[0] = "25 templated_functions_MULTI_TIME"
    d, f = profile_dir(tmp_path, lines)
    assert_refused(["ingest", str(d)], f"{f}:26: line 1 announces 25 routine rows but only 23 come before "
                                      "'<n> aggregates'", store)


def test_more_rows_than_the_header_says(store, tmp_path):
    lines = real_lines()
    lines[0] = "20 templated_functions_MULTI_TIME"
    d, f = profile_dir(tmp_path, lines)
    assert_refused(["ingest", str(d)], f"{f}:23: line 1 announces 20 routine rows but there are more: expected "
                                      "'<n> aggregates' after row 20", store)


def test_name_with_an_unclosed_quote(store, tmp_path):
    lines = real_lines()
    assert lines[3].startswith('"MPI_Init()  " ')
    lines[3] = lines[3].replace('"MPI_Init()  "', '"MPI_Init()  ')
    d, f = profile_dir(tmp_path, lines)
    assert_refused(["ingest", str(d)], f"{f}:4: the routine name opens a quote that is never closed", store)


def test_a_row_that_is_not_a_routine_row(store, tmp_path):
    lines = real_lines()
    lines[3] = '"MPI_Init()  " 1 0 lots 17983 0 GROUP="MPI" '
    d, f = profile_dir(tmp_path, lines)
    assert_refused(["ingest", str(d)], f"{f}:4: expected a number for Excl in this routine row, found 'lots'", store)


def test_user_event_row_count(store, tmp_path):
    lines = real_lines()
    assert lines[-4] == "2 userevents"
    lines[-4] = "1 userevents"
    d, f = profile_dir(tmp_path, lines)
    assert_refused(["ingest", str(d)], f"{f}:30: line 27 announces 1 user events but there are more", store)
    lines[-4] = "3 userevents"
    f.write_text("\n".join(lines) + "\n")
    code, out, err = run_cli("ingest", str(d), "--json")
    assert code == 0 and err == (f"traceparse: warning: {f}: the file ends after 2 of its 3 user events; "
                                 "the complete rows were kept\n")


def test_directory_with_no_profile_files(store, tmp_path):
    d = tmp_path / "empty_run"
    d.mkdir()
    (d / "notes.txt").write_text("nothing here\n")
    assert_refused(["ingest", "--format", "tau", str(d)],
                   f"{d}: no TAU profile files here: expected profile.<node>.<context>.<thread> files, "
                   "MULTI__<METRIC>/ directories of them, or tauprofile.xml", store)


def test_some_unreadable_files_are_skipped_with_a_warning(store, tmp_path):
    d = tmp_path / "mixed"
    shutil.copytree(CPI, d)
    (d / "profile.2.0.0").write_text("garbage\n")
    (d / "profile.3.0.0").write_bytes(b"")
    code, out, err = run_cli("ingest", str(d), "--json")
    assert code == 0, err
    assert err == (f"traceparse: warning: skipped: {d / 'profile.2.0.0'}:1: not a TAU profile: expected "
                   "'<n> templated_functions_MULTI_<METRIC>' or '<n> templated_functions', found 'garbage'\n"
                   f"traceparse: warning: skipped: {d / 'profile.3.0.0'}: the file is empty; expected a TAU profile "
                   "starting '<n> templated_functions_MULTI_<METRIC>' or '<n> templated_functions'\n")
    doc = json.loads(out)["traces"][0]
    assert doc["event_count"] == 2 * 25


def test_all_files_bad_is_an_error(store, tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "profile.0.0.0").write_text("garbage\n")
    (d / "profile.1.0.0").write_text("more garbage\n")
    assert_refused(["ingest", str(d)], f"{d / 'profile.0.0.0'}:1: not a TAU profile: expected "
                                      "'<n> templated_functions_MULTI_<METRIC>' or '<n> templated_functions', "
                                      "found 'garbage'", store)


@pytest.mark.parametrize("name", ["billion-laughs.xml", "external-entity.xml"])
def test_malicious_xml_is_refused_quickly(store, name):
    path = MALICIOUS / name
    started = time.perf_counter()
    assert_refused(["ingest", "--format", "tau", str(path)], f"{path}:2: {REFUSED}", store)
    assert time.perf_counter() - started < 2.0


def test_entity_bomb_in_profile_metadata_is_refused(store):
    path = MALICIOUS / "metadata-entity" / "profile.0.0.0"
    assert_refused(["ingest", str(path)], f"{path}:2: {REFUSED}", store)


def test_entity_declared_after_the_first_megabyte_is_refused(store, tmp_path):
    path = tmp_path / "tauprofile.xml"
    filler = "<profile_xml>\n" + "<!-- padding -->\n" * 70000
    path.write_text(filler + '<!DOCTYPE x [<!ENTITY a "b">]>\n</profile_xml>\n')
    code, _, err = run_cli("ingest", str(path))
    assert code == 2 and err.startswith(f"traceparse: error: {path}:") and err.endswith(f": {REFUSED}\n")


def test_xml_nested_too_deep(store, tmp_path):
    path = tmp_path / "tauprofile.xml"
    path.write_text("<profile_xml>" + "<x>" * 40 + "</x>" * 40 + "</profile_xml>\n")
    assert_refused(["ingest", str(path)], f"{path}:1: XML nested deeper than 32 elements; TAU's needs 5", store)


def test_xml_event_id_without_definition(store, tmp_path):
    path = tmp_path / "tauprofile.xml"
    path.write_text('<profile_xml>\n<definitions thread="0.0.0.1">\n<event id="0"><name>a</name><group>G</group></event>\n'
                    '</definitions>\n<profile thread="0.0.0.1">\n<interval_data metrics="0 ">\n0 1 0 5 5\n7 1 0 5 5\n'
                    "</interval_data>\n</profile>\n</profile_xml>\n")
    assert_refused(["ingest", str(path)], f"{path}:8: interval_data refers to event id '7' that no <definitions> "
                                         "declares", store)


def test_pprof_row_that_does_not_parse(store, tmp_path):
    path = tmp_path / "out.pprof"
    lines = (FIXTURES / "tau" / "real" / "pprof" / "taustubs-matmult-pprof-s.txt").read_text().splitlines()
    lines[8] = " 99.8           31       eleven           4          32    2968856 do_work"
    path.write_text("\n".join(lines) + "\n")
    assert_refused(["ingest", str(path)], f"{path}:9: expected a pprof row '%Time Exclusive Inclusive #Call #Subrs "
                                         "Inclusive-per-call Name', found '99.8           31       eleven           4 "
                                         "         32    2968856 do_work'", store)


def test_reader_error_is_an_input_error_not_a_crash(tmp_path):
    from traceparse.errors import InputError

    d, f = profile_dir(tmp_path, ["x"])
    with pytest.raises(InputError):
        read_paths([d], fmt="tau")


def test_a_gzip_xml_profile_cut_before_its_first_profile(store, tmp_path):
    """The handwritten XML profile gzipped and cut at two thirds of its bytes (a copy cut short): one line that
    says so, not ``internal error: EOFError`` (found by the fuzz corpus)."""
    import gzip

    data = gzip.compress((FIXTURES / "tau" / "handwritten" / "xml" / "tauprofile.xml").read_bytes(), 6, mtime=0)
    cut = tmp_path / "tauprofile.xml.gz"
    cut.write_bytes(data[: len(data) * 2 // 3])
    assert_refused(["ingest", str(cut)], f"{cut}: no <profile> with <interval_data> in this TAU XML file before the "
                                         "file ends early (cut short?)", store)


def test_a_paraprof_packed_profile_cut_in_its_header_is_one_line(store, tmp_path):
    """Hand-written edge case after the head of tau2's perfexplorer examples (``DrawGraph/2.ppk``): a ``.ppk`` is
    gzip around Java's serialisation, "PPK" first. Once refused with how to unpack it; now read (tests/test_tau_ppk.py),
    and this one, whose header announces 1,028 bytes where 64 follow, is one line saying what was expected."""
    import gzip

    f = tmp_path / "my run.ppk"
    f.write_bytes(gzip.compress(b"\x00P\x00P\x00K\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x04\x04" + bytes(64)))
    assert_refused(["ingest", str(f)], f"{f}: the file ends early (byte 18 of 82 decompressed) while reading a header "
                                       "of 1,028 bytes, before any thread's data", store)


def test_a_pprof_dump_is_refused_with_what_to_give_instead(store, tmp_path):
    """Hand-written edge case after the first lines of tau2's ``TauIL/tests/pprof.dat`` (``pprof -d``)."""
    f = tmp_path / "pprof.dat"
    f.write_text('default.dep\n8 templated_functions -stddev\n'
                 '%time         msec   total msec       #call      #subrs  usec/call     stddev name\n'
                 '0,0,0 5 "void quicksort(int *, int, int)  " excl 5341226.344726562 74.02 GROUP="TAU_USER"\n')
    assert_refused(["ingest", str(f)], f"{f}: a `pprof -d` dump, which traceparse does not read: give the "
                                       "profile.N.C.T files (or their folder) that pprof read, or let "
                                       "`paraprof -f pprof --dump pprof.dat` write them", store)
