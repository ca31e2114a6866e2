"""The repository's analysis scripts that need no GPU (scripts/ncu_sass_summary.py)."""
import gzip
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "ncu_sass_summary.py"

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"# Samples","Instructions Executed","Thread Instructions Executed"')


def export(rows, name="k"):
    """An ncu SASS export with the given (source, executions, stall samples) rows."""
    lines = [f'"Kernel Name","{name}",', HEADER]
    for i, (src, e, s) in enumerate(rows):
        lines.append(f'"0x{0x1000 + 16 * i:x}","      {src}","{s}","{s}","{s}","{e}","{32 * e}"')
    return "\n".join(lines) + "\n"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_sass_summary_sums_by_opcode_and_groups_by_count(tmp_path):
    loop = [("FFMA R1, R2, R3, R4 ;", 500000, 5), ("MUFU.EX2 R1, R1 ;", 500000, 7), ("FFMA R5, R6, R7, R8 ;", 500000, 1)]
    rest = [("@!P0 BRA 0x1000 ;", 250000, 2), ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R0 ;", 250000, 0)]
    path = tmp_path / "k.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(export(loop + rest, name="my_kernel"))
    r = run(str(path), "--top", "5", "--groups", "2")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "kernel: my_kernel" in out
    assert "5 instructions in the code, 2.00M executed (warp level), 15 stall samples" in out
    lines = out.splitlines()
    ffma = next(line for line in lines if line.strip().startswith("FFMA"))
    assert "1.00M  50.0%" in ffma and "stall samples       6 (40.0%)" in ffma  # both FFMAs: 1M of 2M, 6 of 15
    assert any("BRA" in line and line.strip().startswith("BRA") for line in lines)  # the predicate is not the opcode
    groups = [line for line in lines if line.strip().startswith("ran ")]
    assert len(groups) == 2
    assert groups[0].split()[1] == "500000:" and "3 instructions" in groups[0] and "FFMA 2" in groups[0]
    assert groups[1].split()[1] == "250000:" and "2 instructions" in groups[1] and "SYNCS 1" in groups[1]


def test_sass_summary_names_what_is_missing(tmp_path):
    missing = run(str(tmp_path / "none.csv"))
    assert missing.returncode != 0 and "none.csv" in missing.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text('"x","y"\n')
    r = run(str(bad))
    assert r.returncode != 0 and "--page source --print-source sass --csv" in r.stderr
    no_counts = tmp_path / "no_counts.csv"
    no_counts.write_text('"Kernel Name","k",\n"Address","Source"\n"0x1","  FFMA R1, R2, R3, R4 ;"\n')
    r = run(str(no_counts))
    assert r.returncode != 0 and "SourceCounters" in r.stderr
