"""The example of docs/PYTHON.md, run as written against the test cluster:
every `# -> VALUE` comment is what that line prints."""

import contextlib
import io
import os
import re

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "PYTHON.md")


def example():
    text = open(DOC, encoding="utf-8").read()
    section = text.split("## Example", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_documented_example_runs_and_prints_what_it_says(cluster, monkeypatch):
    code = example()
    expected = re.findall(r"# -> (.*)$", code, re.M)
    assert len(expected) >= 5, "the example lost its checks"
    monkeypatch.setenv("DAFNE_HOME", cluster)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/PYTHON.md", "exec"), {})
    assert out.getvalue().splitlines() == expected
