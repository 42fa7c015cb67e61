"""The SGLang boundary: every SGLang module sglang-specsot reaches below `sglang`, and every
change it makes to SGLang's behaviour.

- `adapter.py`: each SGLang name the package uses, resolved on first use, and subclasses
  that give SGLang's private methods public names (`subclasses.py`); it re-exports the
  verify-graph capture (`verify_graphs.py`) and the draft-forward hooks (`draft_forwards.py`),
  so callers read every name from it;
- `changes.py`: the ordered list of changes to SGLang's behaviour, each with its reason and
  its upstream-ready diff in patches/; the entries are in `cpu_changes.py` and
  `server_changes.py`, what an entry is in `host_change.py`.

SGLang is "the host" throughout (host changes, HostChange): the package is named for that
role, and `import sglang...` beside `import sglang_specsot.host...` reads unambiguously. No
other package imports SGLang's modules, but for the exemptions below
(tests/unit/test_import_graph.py checks both). Importing this package imports nothing.
"""

# Modules outside host/ that import SGLang's modules directly (paths under sglang_specsot/),
# and why each must.
BOUNDARY_EXEMPT: dict[str, str] = {
    "cpu/attention.py": (
        "the specsot_cpu attention backend subclasses SGLang's TorchNativeAttnBackend and "
        "implements its attention ops against SGLang's KV-pool and forward-batch internals; "
        "it registers itself through SGLang's attention registry"
    ),
    "cpu/draft_attention.py": (
        "specsot_cpu's multi-step draft backends implement SGLang's draft attention ops and "
        "read its draft decode window the way SGLang's own draft backends do"
    ),
}
