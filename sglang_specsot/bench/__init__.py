"""End-to-end SpecSoT benchmark: complete-answer latency and answer quality, side by side.

`python -m sglang_specsot.bench e2e|report|judge|serving --help`. Cells (one question x one
configuration) are appended to a JSONL as they finish, so a run resumes where it stopped;
`report` rebuilds JSON, a markdown table and PNG plots from that file alone.
"""
