"""``bench/gpu_refit.py`` finds a GPU check's work folder in an archive whatever the folder above it is
called, and names a check it cannot read in one line (exit 2)."""

from __future__ import annotations

import subprocess
import sys
import tarfile

import pytest

from bench import gpu_refit
from tests.paths import ROOT

SMALLEST = ROOT / "bench/results/gpu_check_h200_2026-11-26b.tgz"  # its work folder is at the top


def _repacked(src, dst, top):
    """``src``'s members under ``top/`` (as run e's archive keeps them under ``g/``)."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w:gz") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m) if m.isfile() else None
            m.name = f"{top}/{m.name}"
            tout.addfile(m, data)
    return dst


def test_the_work_folder_is_found_at_the_top_or_under_any_folder(tmp_path):
    (tmp_path / "a").mkdir()
    assert gpu_refit.open_check(SMALLEST, tmp_path / "a") == tmp_path / "a/work"
    archive = _repacked(SMALLEST, tmp_path / "moved.tgz", "checks/g")
    (tmp_path / "b").mkdir()
    work = gpu_refit.open_check(archive, tmp_path / "b")
    assert work == tmp_path / "b/checks/g/work"
    probes, workloads = gpu_refit.load(work)  # the archived v2/v3 plans read with today's code
    assert len(probes) == 136 and len(workloads) == 16
    assert all(name.startswith("spec") for name, _, _ in workloads)


def test_before_python_3_11_4_an_archive_is_unpacked_by_the_data_filters_rules(tmp_path, monkeypatch):
    """Python before 3.11.4 has no tar filters (``extractall(filter=...)`` was a TypeError there): plain
    files and folders inside the destination are unpacked, a link or a path outside is refused."""
    import io

    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    (tmp_path / "a").mkdir()
    assert gpu_refit.open_check(SMALLEST, tmp_path / "a") == tmp_path / "a/work"
    for name, kind in (("work/link", tarfile.SYMTYPE), ("../outside.json", tarfile.REGTYPE)):
        archive = tmp_path / f"{kind!r}.tgz"
        with tarfile.open(archive, "w:gz") as tar:
            member = tarfile.TarInfo(name)
            member.type, member.linkname = kind, "/etc/passwd"
            tar.addfile(member, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
        (tmp_path / "b").mkdir(exist_ok=True)
        with pytest.raises(gpu_refit.CheckError, match="which is not a plain file or folder inside it"):
            gpu_refit.open_check(archive, tmp_path / "b")
    assert not (tmp_path / "outside.json").exists() and not list((tmp_path / "b").iterdir())


def test_a_folder_of_two_checks_or_of_none_is_refused_by_name(tmp_path):
    for top in ("x", "y"):
        (tmp_path / top / "work/calibrate").mkdir(parents=True)
        (tmp_path / top / "work/calibrate/timings.json").write_text("{}")
    with pytest.raises(gpu_refit.CheckError, match=r"several GPU checks in it \(x/work, y/work\)"):
        gpu_refit.find_work(tmp_path)
    with pytest.raises(gpu_refit.CheckError, match="no GPU check in it"):
        gpu_refit.find_work(tmp_path / "x/work/calibrate")


def test_a_missing_or_unreadable_archive_is_one_line_naming_it_and_exit_2(tmp_path):
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"not gzip")
    for check, reason in ((tmp_path / "missing.tgz", "no such file"), (bad, "tar cannot open it")):
        r = subprocess.run([sys.executable, str(ROOT / "bench/gpu_refit.py"), str(check), "--out-dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2
        assert r.stderr.count("\n") == 1 and str(check) in r.stderr and reason in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and not list(tmp_path.glob("gpu_refit_*.json"))


def test_an_out_dir_that_cannot_be_made_is_one_line_before_any_check_is_read(tmp_path, capsys):
    """It was a traceback after the first check's refit (FileNotFoundError); a missing folder is made."""
    (tmp_path / "a_file").write_text("")
    assert gpu_refit.main([str(tmp_path / "missing.tgz"), "--out-dir", str(tmp_path / "a_file" / "refits")]) == 2
    err = capsys.readouterr().err
    assert err == f"gpu_refit: --out-dir {tmp_path / 'a_file' / 'refits'}: cannot write there (Not a directory)\n"
    assert gpu_refit.main([str(tmp_path / "missing.tgz"), "--out-dir", str(tmp_path / "new" / "refits")]) == 2
    assert (tmp_path / "new" / "refits").is_dir() and "missing.tgz: " in capsys.readouterr().err


def test_the_comparison_plans_are_judged_by_their_own_errors():
    rows = [{"predicted_ms": 2.0, "measured_ms": 1.0, "error": 1.0},
            {"predicted_ms": 3.0, "measured_ms": 4.0, "error": -0.25},
            {"predicted_ms": 5.0, "measured_ms": 5.0, "error": 0.0}]
    assert gpu_refit.agreement(rows) == {"plans": 3, "median_abs_error": 0.25, "max_abs_error": 1.0, "spearman": 1.0}
    assert gpu_refit.agreement(rows[:2])["spearman"] is None  # too few to rank
    assert gpu_refit.agreement([]) == {"plans": 0}
