"""docs/python.md as a newcomer follows it: every ```python block of the page is a program,
run as it is written by this interpreter (the installed package) from an empty directory,
and a ```text block right after it is what it must print, line for line, "..." standing for
anything."""
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[3] / "docs" / "python.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.M | re.S)


def page_programs():
    """(line of the block, its code, its expected output or None) for each python block."""
    text = PAGE.read_text()
    blocks = [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)) for m in FENCE.finditer(text)]
    programs = []
    for i, (line, language, body) in enumerate(blocks):
        if language == "python":
            after = blocks[i + 1] if i + 1 < len(blocks) else None
            expected = after[2] if after is not None and after[1] == "text" else None
            programs.append((line, body, expected))
    return programs


PROGRAMS = page_programs()


def line_matches(expected, printed):
    return re.fullmatch(".*".join(re.escape(part) for part in expected.split("...")), printed) is not None


def test_the_page_has_a_numpy_and_a_torch_program_each_with_its_output():
    assert len(PROGRAMS) >= 3
    assert all(expected is not None for _, _, expected in PROGRAMS)
    assert any("import numpy" in code for _, code, _ in PROGRAMS)
    assert any("FusedAdam" in code for _, code, _ in PROGRAMS)


def test_an_expected_output_line_matches_only_its_own_shape():
    assert line_matches("step   1  loss 5.1...", "step   1  loss 5.1234")
    assert not line_matches("step   1  loss 5.1...", "step   1  loss 6.1234")
    assert not line_matches("exp_avg (4, 3) float32", "exp_avg (4, 3) float32 extra")


@pytest.mark.parametrize("line, code, expected", PROGRAMS, ids=[f"python.md:{p[0]}" for p in PROGRAMS])
def test_the_page_program_runs_as_written(line, code, expected, tmp_path):
    if "import torch" in code and importlib.util.find_spec("torch") is None:
        pytest.skip("the program needs torch (not installed here)")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"docs/python.md:{line}: the program failed:\n{run.stdout}{run.stderr}"
    printed = run.stdout.splitlines()
    wanted = expected.splitlines()
    assert len(printed) == len(wanted) and all(map(line_matches, wanted, printed)), (
        f"docs/python.md:{line}: the program printed\n{run.stdout}which is not the page's\n{expected}")
