"""A speculative CPU launch gets an attention backend that verifies drafts, or stops naming it.

The pure decision first, then SGLang's real argument resolution (in the CPU-engine subprocess
the unit tests share: it configures logging and SGLang's process-wide state) with the plugin
loaded as a launch loads it.
"""

from __future__ import annotations

import pytest

from sglang_specsot.cpu.spec_backend import FIX, spec_backend_declaration, verifies_drafts
from tests.unit import cpu_checks

NONE_CHOSEN = {"attention_backend": None, "prefill_attention_backend": None, "decode_attention_backend": None}


def _chosen(**over) -> dict:
    return {**NONE_CHOSEN, **over}


@pytest.mark.parametrize("algorithm", ["SPECSOT", "NGRAM", "STANDALONE", "EAGLE", "EAGLE3"])
def test_no_backend_chosen_gets_specsot_cpu(algorithm, caplog):
    caplog.set_level("INFO", logger="sglang_specsot.cpu.spec_backend")
    declared = spec_backend_declaration("cpu", algorithm, NONE_CHOSEN, has_amx=False)
    assert declared == {"attention_backend": "specsot_cpu"}
    assert FIX in caplog.text and algorithm in caplog.text


@pytest.mark.parametrize(
    ("device", "algorithm", "chosen"),
    [
        ("cuda", "NGRAM", NONE_CHOSEN),  # not CPU: SGLang's own choice
        ("cuda", "NGRAM", _chosen(attention_backend="triton")),
        ("cpu", None, NONE_CHOSEN),  # no speculation: torch_native decodes fine
        ("cpu", None, _chosen(attention_backend="torch_native")),
        ("cpu", "SPECSOT", _chosen(attention_backend="specsot_cpu")),
        ("cpu", "NGRAM", _chosen(attention_backend="specsot_cpu", decode_attention_backend="specsot_cpu")),
    ],
)
def test_other_launches_are_left_alone(device, algorithm, chosen):
    assert spec_backend_declaration(device, algorithm, chosen, has_amx=False) == {}


@pytest.mark.parametrize(
    ("chosen", "named"),
    [
        (_chosen(attention_backend="torch_native"), "--attention-backend torch_native"),
        (_chosen(attention_backend="intel_amx"), "--attention-backend intel_amx"),
        (_chosen(attention_backend="specsot_cpu", prefill_attention_backend="torch_native"),
         "--prefill-attention-backend torch_native"),
        (_chosen(decode_attention_backend="specsot_cpu"), "--attention-backend unset"),
    ],
)  # fmt: skip
def test_a_backend_that_cannot_verify_is_refused_naming_the_flag(chosen, named):
    with pytest.raises(ValueError) as err:
        spec_backend_declaration("cpu", "NGRAM", chosen, has_amx=False)
    message = str(err.value)
    assert named in message and "--speculative-algorithm NGRAM" in message and f"Use {FIX}" in message


def test_intel_amx_verifies_only_with_amx():
    assert verifies_drafts("intel_amx", has_amx=True) and not verifies_drafts("intel_amx", has_amx=False)
    assert verifies_drafts(None, has_amx=True)  # SGLang's CPU default is intel_amx there
    assert not verifies_drafts("torch_native", has_amx=True)
    assert spec_backend_declaration("cpu", "NGRAM", _chosen(attention_backend="intel_amx"), has_amx=True) == {}



def test_triton_verifies_on_cpu_only_under_its_interpreter():
    # Compiled Triton needs a GPU; interpreted, SGLang's Triton backend runs (slowly) on a CPU,
    # which scripts/cuda_draft_twin.py uses to run SGLang's CUDA draft path here.
    assert not verifies_drafts("triton", has_amx=False)
    assert verifies_drafts("triton", has_amx=False, triton_interpreted=True)
    chosen = _chosen(attention_backend="triton")
    with pytest.raises(ValueError, match="--attention-backend triton cannot"):
        spec_backend_declaration("cpu", "SPECSOT", chosen, has_amx=False)
    assert spec_backend_declaration("cpu", "SPECSOT", chosen, has_amx=False, triton_interpreted=True) == {}

# -- SGLang's own argument resolution, as `python -m sglang.launch_server` runs it ---------------

RESOLVE = cpu_checks.add("spec-backend-resolution", """
from sglang_specsot import plugin
plugin.register()
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.overrides import resolution_result
base = ["--model-path", TINY_MODEL, "--device", "cpu"]
argvs = [
    base + ["--speculative-algorithm", "SPECSOT"],
    base + ["--speculative-algorithm", "NGRAM"],
    base + ["--speculative-algorithm", "NGRAM", "--attention-backend", "torch_native"],
    base + ["--speculative-algorithm", "SPECSOT", "--attention-backend", "specsot_cpu"],
    base,
]
result = []
for argv in argvs:
    sa = prepare_server_args(argv)
    try:
        sa.resolve_once()
        result.append(resolution_result(sa, "attention_backend"))
    except ValueError as exc:
        result.append("ValueError: " + str(exc))
""")  # fmt: skip


@pytest.fixture(scope="module")
def resolved(cpu_process) -> list[str]:
    return cpu_process(RESOLVE)


def test_sglang_resolution_chooses_specsot_cpu_when_none_was_chosen(resolved):
    assert resolved[:2] == ["specsot_cpu", "specsot_cpu"]


def test_sglang_resolution_refuses_torch_native_with_speculation(resolved):
    assert resolved[2].startswith("ValueError: --speculative-algorithm NGRAM on CPU")
    assert f"Use {FIX}" in resolved[2]


def test_sglang_resolution_keeps_explicit_and_non_speculative_choices(resolved):
    assert resolved[3] == "specsot_cpu"
    assert resolved[4] == "torch_native"  # plain decoding: SGLang's own default, untouched
