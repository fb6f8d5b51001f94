"""Traces as whatif reads them: plain and gzip-compressed CSV, one request a line into compact
columns; and what a hostile or broken file gets: one line saying what is wrong, exit code 2,
no traceback, and memory proportional to the requests, not to the file's lines' length."""

from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import pytest

from snooze.cli import main
from snooze.whatif import trace


def test_a_gzip_trace_reads_as_its_csv(tmp_path: Path) -> None:
    text = "# made by hand\ntimestamp,model,output_tokens\n5,b,7\n1,a,\n3,a,2\n"
    plain = tmp_path / "t.csv"
    plain.write_text(text)
    packed = tmp_path / "t.csv.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, packed):
        read = trace.read(path)
        assert [(r.at, r.model, r.output_tokens) for r in read.requests()] == [
            (1.0, "a", None),
            (3.0, "a", 2),
            (5.0, "b", 7),
        ]
        assert list(read.models) == ["b", "a"]  # in order of their first line
        assert (read.first, read.last, len(read)) == (1.0, 5.0, 3)


def test_a_spreadsheet_s_csv_reads_too(tmp_path: Path) -> None:
    # Saved with a byte order mark and CRLF line ends, as spreadsheets write CSV.
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbftimestamp,model\r\n1,a\r\n2,a\r\n")
    assert [r.at for r in trace.read(path).requests()] == [1.0, 2.0]


def test_names_are_data_in_a_written_trace() -> None:
    # A model whose name holds a comma or a quote is written quoted and read back as it was.
    requests = [trace.Request(at=1.0, model='a,"b"'), trace.Request(at=2.0, model="#c")]
    text = trace.write(requests)
    assert trace.parse(text.splitlines()).requests() == requests


def run(tmp_path: Path, body: bytes | str, *policies: str) -> tuple[int, str]:
    path = tmp_path / "trace.csv"
    if isinstance(body, str):
        path.write_text(body)
    else:
        path.write_bytes(body)
    args = ["whatif", "--trace", str(path), "--out", str(tmp_path / "out")]
    for policy in policies or ("fixed:10m",):
        args += ["--policy", policy]
    return main(args), str(path)


@pytest.mark.parametrize(
    ("body", "policy", "says"),
    [
        # A field of 200,000 characters (the csv module's own limit is 131,072).
        ("timestamp,model\n0," + "m" * 200_000 + "\n", "fixed:10m",
         "line 2: longer than 4096 characters"),
        ("timestamp,model\n" + "0,m" + " " * 5000, "fixed:10m", "line 2: longer than 4096"),
        ('timestamp,model\n0,"m\nstill the model"\n', "fixed:10m",
         "line 2: a quoted field that does not end on its line"),
        ('timestamp,model\n0,"m"x\n', "fixed:10m", "line 2: a quoted field"),
        # Past year 9999 and before year 1, as seconds and as ISO 8601.
        ("timestamp,model\n0,m\n1e12,m\n", "prewake", "line 3: '1e12' is outside the years"),
        ("timestamp,model\n-1e11,m\n", "auto", "line 2: '-1e11' is outside the years"),
        ("timestamp,model\n9999-12-31T23:59:59Z,m\n", "prewake", "outside the years 1900"),
        ("timestamp,model\n0001-01-01T00:00:00+14:00,m\n", "auto", "outside the years 1900"),
        ("timestamp,model\nyesterday,m\n", "auto", "is neither seconds nor"),
        ("timestamp,model\nnan,m\n", "fixed:10m", "not a finite number"),
        ("timestamp,model,output_tokens\n0,m," + "9" * 5000 + "\n", "fixed:10m",
         "line 2: longer than 4096"),
        ("timestamp,model,output_tokens\n0,m,99999999999\n", "fixed:10m",
         "output_tokens '99999999999' is not a whole number of tokens up to 10,000,000"),
        ("timestamp,model\n0," + "m" * 300 + "\n", "fixed:10m", "longer than 253 characters"),
        ("timestamp,model\n0\n", "fixed:10m", "line 2: 1 columns where the header has 2"),
    ],
)  # fmt: skip
def test_bad_input_gets_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, policy: str, says: str
) -> None:
    code, path = run(tmp_path, body, policy)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"snooze whatif: {path}") and says in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert len(err) < 400


def test_a_file_that_is_not_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path, b"\xff\xfe\x00binary")[0] == 2
    assert "not a UTF-8 text file" in capsys.readouterr().err
    assert run(tmp_path, gzip.compress(b"timestamp,model\n0,m\n")[:-9])[0] == 2
    assert "a gzip file cut short or damaged" in capsys.readouterr().err


def test_too_many_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = "".join(f"{i},m{i}\n" for i in range(trace.MODELS_LIMIT + 1))
    assert run(tmp_path, "timestamp,model\n" + lines)[0] == 2
    err = capsys.readouterr().err
    assert f"line {trace.MODELS_LIMIT + 2}: more than 10,000 models" in err


def test_reading_takes_memory_in_proportion_to_the_requests(tmp_path: Path) -> None:
    # 200,000 requests of 5 models, out of order: held in two columns (8 + 4 bytes a
    # request), not as an object and a line of text each (some 400 bytes a request before);
    # sorting a model's requests takes more for a while.
    count = 200_000
    path = tmp_path / "big.csv.gz"
    with gzip.open(path, "wt") as out:
        out.write("timestamp,model,output_tokens\n")
        for i in range(count):
            out.write(f"{(i * 7919) % count}.5,model-{i % 5},{i % 500}\n")
    tracemalloc.start()
    try:
        read = trace.read(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(read) == count
    assert all(list(m.at) == sorted(m.at) for m in read.models.values())
    assert peak < 40 * count, f"{peak / count:.0f} bytes a request"


def test_an_out_folder_that_cannot_be_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp,model\n0,m\n")
    taken = tmp_path / "taken"
    taken.write_text("a file")
    compare = ["whatif", "--trace", str(path), "--policy", "always-on", "--out", str(taken)]
    plan = ["whatif", "plan", "--trace", str(path), "--device-memory", "1Gi", "--out", str(taken)]
    for command in (compare, plan):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"--out {taken}: cannot make that folder" in err and err.count("\n") == 1
