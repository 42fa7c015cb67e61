"""The README's OpenAI-client snippet, run as written against the session's SPECSOT server.

The snippet is cut from README.md by its heading (`### 2. A SoT answer with the OpenAI client`)
and its first python block; only its base URL is changed, to the shared SPECSOT server's
(SmolLM2-135M). A README that moves the snippet, changes its URL or its printed lines breaks this
test, which is the point: what a user copies must run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "### 2. A SoT answer with the OpenAI client"
README_URL = "http://127.0.0.1:30000"


def readme_snippet(heading: str = HEADING) -> str:
    """The first ```python block after `heading` in README.md."""
    text = README.read_text()
    assert text.count(heading) == 1, f"README.md has no single {heading!r} section"
    section = text.split(heading, 1)[1]
    assert "```python\n" in section, f"no python block after {heading!r}"
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    next_heading = section.find("\n### ")
    assert next_heading == -1 or section.index("```python\n") < next_heading, f"the python block is not in {heading!r}"
    return code


def test_the_readme_openai_client_snippet_runs_as_written(shared_specsot_server):
    code = readme_snippet()
    assert code.count(README_URL) == 1, code
    code = code.replace(README_URL, shared_specsot_server.base_url)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    # Its three prints: the skeleton (reasoning_content), the merged answer, the path taken.
    assert lines[-1] == "sot", out.stdout[-2000:]
    assert lines[0].strip() and lines[0] != "None", out.stdout[-2000:]  # the skeleton came back
    assert len(lines) >= 3, out.stdout[-2000:]
