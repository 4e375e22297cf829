"""The README and the docs/*.md pages as a newcomer follows them: every ```python block of
each page is a program, run as it is written by this interpreter (the installed package)
from an empty directory, and a ```text block right after it is what it must print, line for
line, "..." standing for anything. A python block whose marker line (the HTML comment right
before it, as tests/docs/doc_blocks.cpp reads them) says `untested: WHY` is a fragment, not
a program: it is reported skipped with the page's reason, never silently left out."""
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.M | re.S)
UNTESTED = re.compile(r"<!-- untested: (.*\S) -->\n\Z")
# A marker for doc_blocks (the C page tests) that names this test: the program runs here.
RUN_HERE = "test_docs.py runs it"


def page_programs(page):
    """(line of the block, its code, its expected output or None, why it is not run or None)
    for each python block of the page."""
    text = page.read_text()
    blocks = []
    for m in FENCE.finditer(text):
        marker = UNTESTED.search(text, 0, m.start())
        why = marker.group(1) if marker is not None else None
        blocks.append((text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2), why))
    programs = []
    for i, (line, language, body, why) in enumerate(blocks):
        if language == "python":
            after = blocks[i + 1] if i + 1 < len(blocks) else None
            expected = after[2] if after is not None and after[1] == "text" else None
            skip = why if why is not None and RUN_HERE not in why else None
            programs.append((line, body, expected, skip))
    return programs


PROGRAMS = [(page.relative_to(ROOT).as_posix(), *program) for page in PAGES for program in page_programs(page)]


def line_matches(expected, printed):
    return re.fullmatch(".*".join(re.escape(part) for part in expected.split("...")), printed) is not None


def test_the_pages_have_numpy_and_torch_programs_each_with_its_output():
    run = [p for p in PROGRAMS if p[4] is None]
    assert all(expected is not None for _, _, _, expected, _ in run)
    pages = {page for page, *_ in run}
    assert {"README.md", "docs/python.md"} <= pages
    assert any("import numpy" in code for _, _, code, _, _ in run)
    assert any(page == "README.md" and "FusedAdam" in code for page, _, code, _, _ in run)


def test_an_expected_output_line_matches_only_its_own_shape():
    assert line_matches("step   1  loss 5.1...", "step   1  loss 5.1234")
    assert not line_matches("step   1  loss 5.1...", "step   1  loss 6.1234")
    assert not line_matches("exp_avg (4, 3) float32", "exp_avg (4, 3) float32 extra")


def test_an_untested_marker_applies_only_to_the_block_right_after_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- untested: a fragment -->\n```python\nx\n```\n\n```python\nprint(1)\n```\n"
                    "```text\n1\n```\n")
    assert page_programs(page) == [(2, "x\n", None, "a fragment"), (6, "print(1)\n", "1\n", None)]


@pytest.mark.parametrize("page, line, code, expected, skip", PROGRAMS, ids=[f"{p[0]}:{p[1]}" for p in PROGRAMS])
def test_the_page_program_runs_as_written(page, line, code, expected, skip, tmp_path):
    if skip is not None:
        pytest.skip(f"{page}:{line}: untested: {skip}")
    if "import torch" in code and importlib.util.find_spec("torch") is None:
        pytest.skip("the program needs torch (not installed here)")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{page}:{line}: the program failed:\n{run.stdout}{run.stderr}"
    printed = run.stdout.splitlines()
    wanted = expected.splitlines()
    assert len(printed) == len(wanted) and all(map(line_matches, wanted, printed)), (
        f"{page}:{line}: the program printed\n{run.stdout}which is not the page's\n{expected}")
