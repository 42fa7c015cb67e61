"""The skeleton constraint over SmolLM2's real tokenizer, and custom processors at verify."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
from sglang.srt.sampling.sampling_batch_info import ProcessorEntry
from transformers import AutoTokenizer

from sglang_specsot.serving.skeleton_constraint import constraint_for, skeleton_processor_for
from sglang_specsot.sot import SoTConfig, parse_skeleton
from sglang_specsot.sot.runner import SoTOptions
from sglang_specsot.sot.skeleton_format import Piece, classify_piece
from sglang_specsot.speculative.draft_tree import DraftTree
from sglang_specsot.speculative.verify_processors import apply_verify_processors, node_output_ids

CONFIG = SoTConfig(max_points=3, max_point_words=3, max_point_chars=24)
IM_END = 2  # SmolLM2's <|im_end|>: the end of an assistant turn


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def constraint(smollm2_path):
    return constraint_for(smollm2_path, CONFIG, "1.")


@pytest.fixture(scope="module")
def processor(smollm2_path) -> CustomLogitProcessor:
    return CustomLogitProcessor.from_str(skeleton_processor_for(smollm2_path, CONFIG))


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_the_vocabulary_reads_tokens_as_they_print(constraint, tokenizer):
    vocab = constraint.vocab
    assert vocab.end_ids == (IM_END,)
    assert len(vocab.pieces) == len(tokenizer)
    cases = {" Keep": Piece.SPACE_WORD, "\n": Piece.NEWLINE, ".": Piece.DOT, "2": Piece.NUMBER,
             "-": Piece.JOIN, ",": Piece.COMMA, "\n\n": None}  # fmt: skip
    for text, piece in cases.items():
        (token,) = _ids(tokenizer, text)
        assert vocab.pieces[token] == text and classify_piece(vocab.pieces[token]) is piece
    assert vocab.text(_ids(tokenizer, " Keep calm\n2. Sleep")) == " Keep calm\n2. Sleep"


@pytest.mark.parametrize(
    "text", ["", " Keep", " Keep calm", " Keep calm\n", " Keep calm\n2", " Keep calm\n2. Sleep",
             " Keep calm\n2. Sleep well\n3. Eat", " Long-"]
)  # fmt: skip
def test_the_mask_is_exactly_what_the_format_reads(constraint, tokenizer, text):
    ids = _ids(tokenizer, text)
    state = constraint.state(ids)
    mask = ~constraint.blocked(ids, len(tokenizer) + 64)  # a padded vocabulary: pads never allowed
    assert not mask[len(tokenizer) :].any()
    end = Piece.END in state.allowed().pieces
    for token, piece in enumerate(constraint.vocab.pieces):
        fits = classify_piece(piece) is not None and state.copy().feed(piece)
        expected = end if token == IM_END else fits
        assert bool(mask[token]) == expected, (text, token, piece)


def test_a_left_format_or_a_stuck_point_may_only_end(constraint, tokenizer, smollm2_path):
    for ids in (_ids(tokenizer, " Keep calm!"), _ids(tokenizer, " Sleep\n2. Go") + [IM_END]):
        assert _allowed_ids(constraint, ids, len(tokenizer)) == [IM_END]
    # Nothing fits after a repeat on the last line (see test_skeleton_format): end there.
    stuck = constraint_for(smollm2_path, SoTConfig(max_points=2, max_point_words=1, max_point_chars=5), "1.")
    ids = _ids(tokenizer, " Sleep\n2. Sleep\n")
    assert not stuck.state(ids).allowed().pieces
    assert _allowed_ids(stuck, ids, len(tokenizer)) == [IM_END]


def _allowed_ids(constraint, ids: list[int], size: int) -> list[int]:
    return np.flatnonzero(~constraint.blocked(ids, size)).tolist()


def test_serialized_processor_carries_its_settings(processor, smollm2_path):
    assert type(processor).CONFIG == CONFIG and type(processor).TOKENIZER_PATH == smollm2_path
    with pytest.raises(ValueError, match="prefill"):
        skeleton_processor_for(smollm2_path, CONFIG, prefill="Sure!")
    with pytest.raises(ValueError, match="SoTConfig"):
        skeleton_processor_for(smollm2_path, {"max_points": 3})


def _req(output_ids: list[int], prompt: list[int] | None = None):
    prompt = array("q", prompt or [1, 2, 3])
    return SimpleNamespace(origin_input_ids=prompt, origin_input_ids_unpadded=prompt,
                           output_ids=array("q", output_ids))  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
def test_greedy_decoding_of_random_logits_writes_a_skeleton_that_parses(processor, tokenizer, seed):
    gen = torch.Generator().manual_seed(seed)
    bias = torch.zeros(len(tokenizer))
    bias[_ids(tokenizer, "\n") + [IM_END]] = 4.0  # else word tokens, 30k of them, always win
    out: list[int] = []
    for _ in range(200):
        logits = torch.randn(1, len(tokenizer), generator=gen) + bias
        token = int(processor(logits, [{"__req__": _req(out)}])[0].argmax())
        if token == IM_END:
            break
        out.append(token)
    assert token == IM_END, "the skeleton never ended"
    parse = parse_skeleton(tokenizer.decode(out), CONFIG, prefill="1.")
    assert parse.is_plan and 2 <= len(parse.points) <= CONFIG.max_points, (tokenizer.decode(out), parse)
    assert all(len(p.text.split()) <= CONFIG.max_point_words for p in parse.points)


def test_rows_without_a_request_are_left_alone(processor, tokenizer):
    logits = torch.zeros(2, len(tokenizer))
    out = processor(logits.clone(), [None, {"__req__": _req([])}])
    assert torch.equal(out[0], logits[0]) and torch.isinf(out[1]).any()


# -- custom processors at verify -----------------------------------------------------------------


class _Recorder(CustomLogitProcessor):
    """Writes each row's output length and last output id into logits columns 0 and 1."""

    def __call__(self, logits, custom_param_list=None):
        for row, params in enumerate(custom_param_list):
            ids = params["__req__"].output_ids
            logits[row, 0], logits[row, 1] = len(ids), ids[-1] if ids else -1
        return logits


def _sampling_info(processor, rows: list[int], custom_params: list):
    entry = ProcessorEntry(processor=processor, rows=rows, indices=torch.tensor(rows))
    return SimpleNamespace(custom_logit_processor={0: entry}, custom_params=custom_params)


# Two requests; request 0's tree: root (node 0) -> 1 -> 3, root -> 2 (BFS order).
TREES = [DraftTree((10, 11, 12, 13), (-1, 0, 0, 1)), DraftTree((20, 21, 22, 23), (-1, 0, 1, 2))]
HISTORIES = [[1, 2, 3, 7, 10], [4, 5, 20]]  # prompt + committed output; the root last


def test_node_output_ids_follow_each_path():
    assert node_output_ids(HISTORIES[0], 3, TREES[0]) == [[7, 10], [7, 10, 11], [7, 10, 12], [7, 10, 11, 13]]


def test_each_verify_row_sees_its_node_history_and_only_processed_rows_change():
    # Request 0 has the processor; request 1 does not. The scheduler's output_ids are stale
    # (as under overlap): verify must use the drafter's history, not them.
    reqs = [_req([7], [1, 2, 3]), _req([], [4, 5])]
    params = [{"k": 1}, None]
    logits = torch.zeros(8, 5)
    apply_verify_processors(logits, _sampling_info(_Recorder(), [0], params), reqs, TREES, HISTORIES)
    assert logits[:4, 0].tolist() == [2, 3, 3, 4]
    assert logits[:4, 1].tolist() == [10, 11, 12, 13]
    assert not logits[4:].any()
    assert params == [{"k": 1}, None]  # the request's own params are not touched


def test_verify_rows_match_the_processor_applied_row_by_row(processor, tokenizer):
    """The reference: the plain processor on one row whose request holds that node's ids."""
    prompt = [1, 2, 3]
    committed = _ids(tokenizer, " Keep calm\n2")
    path = _ids(tokenizer, ". Sleep well\n3")
    tree = DraftTree(tuple(committed[-1:] + path), (-1, *range(len(path))))
    logits = torch.randn(tree.size, len(tokenizer), generator=torch.Generator().manual_seed(0))
    expected = logits.clone()
    for node, ids in enumerate(node_output_ids(prompt + committed, len(prompt), tree)):
        expected[node] = processor(expected[node : node + 1].clone(), [{"__req__": _req(ids)}])[0]
    info = _sampling_info(processor, [0], [{}])
    apply_verify_processors(logits, info, [_req(committed[:-1], prompt)], [tree], [prompt + committed])
    assert torch.equal(logits, expected)
    assert torch.isinf(logits).any(dim=1).all()  # every node was constrained


# -- the frontend's default ---------------------------------------------------------------------


class _Endpoint:
    def __init__(self, model: str, **info) -> None:
        self.model, self.info, self.asked = model, info, 0

    def get_model_name(self) -> str:
        return self.model

    def get_server_info(self) -> dict:
        self.asked += 1
        return self.info


LIST_QUESTION = "How can I improve my time management skills?"


@pytest.mark.parametrize(
    "info, wanted, constrained",
    [({"enable_custom_logit_processor": True, "speculative_algorithm": "SPECSOT"}, None, True),
     ({"enable_custom_logit_processor": True, "disable_overlap_schedule": True}, None, True),
     # plain overlap: processors read a history one token short, so not by default
     ({"enable_custom_logit_processor": True, "disable_overlap_schedule": False}, None, False),
     ({"enable_custom_logit_processor": True, "disable_overlap_schedule": False}, True, True),
     ({"enable_custom_logit_processor": False, "speculative_algorithm": "SPECSOT"}, None, False),
     ({"enable_custom_logit_processor": True, "speculative_algorithm": "SPECSOT"}, False, False),
     # SGLang's own algorithms mask every draft position with the pre-draft history
     ({"enable_custom_logit_processor": True, "speculative_algorithm": "NGRAM",
       "disable_overlap_schedule": True}, None, False)],
)  # fmt: skip
def test_frontend_adds_the_constraint_where_the_server_can_run_it(smollm2_path, info, wanted, constrained):
    from sglang_specsot.frontend import _with_skeleton_constraint

    options = SoTOptions("on", CONFIG)
    got = _with_skeleton_constraint(_Endpoint(smollm2_path, **info), LIST_QUESTION, options, wanted)
    assert (got.skeleton_logit_processor is not None) is constrained
    if constrained:
        processor = CustomLogitProcessor.from_str(got.skeleton_logit_processor)
        assert type(processor).CONFIG == CONFIG and type(processor).TOKENIZER_PATH == smollm2_path


def test_frontend_refuses_a_forced_constraint_the_server_cannot_run_and_asks_only_for_sot():
    from sglang_specsot.frontend import _with_skeleton_constraint

    with pytest.raises(ValueError, match="--enable-custom-logit-processor"):
        _with_skeleton_constraint(_Endpoint("m"), LIST_QUESTION, SoTOptions("on", CONFIG), True)
    endpoint = _Endpoint("m", enable_custom_logit_processor=True)
    options = SoTOptions("off", CONFIG)  # no skeleton, so no processor and no /server_info
    assert _with_skeleton_constraint(endpoint, LIST_QUESTION, options, None) is options
    assert endpoint.asked == 0


def test_a_tokenizer_the_server_cannot_load_leaves_logits_alone(tmp_path, caplog):
    processor = CustomLogitProcessor.from_str(skeleton_processor_for(str(tmp_path / "missing"), CONFIG))
    logits = torch.randn(2, 10)
    for _ in range(2):  # the second call does not try to load it again
        assert torch.equal(processor(logits.clone(), [{"__req__": _req([])}, None]), logits)
    assert str(tmp_path / "missing") in type(processor)._unloadable
    assert "skeleton constraint disabled" in caplog.text


def _server_args(path: str, **flags) -> SimpleNamespace:
    defaults = {"enable_custom_logit_processor": True, "speculative_algorithm": None,
                "disable_overlap_schedule": False, "tokenizer_path": path, "model_path": path}  # fmt: skip
    return SimpleNamespace(**{**defaults, **flags})


@pytest.mark.parametrize(
    "flags, delay_sample, constrained",
    [({"speculative_algorithm": "SPECSOT"}, False, True),
     ({"disable_overlap_schedule": True}, False, True),
     ({}, True, True),  # SGLANG_ENABLE_DELAY_SAMPLE puts the current token in view
     ({}, False, False),
     ({"speculative_algorithm": "NGRAM", "disable_overlap_schedule": True}, False, False),
     ({"enable_custom_logit_processor": False, "speculative_algorithm": "SPECSOT"}, False, False)],
)  # fmt: skip
def test_server_side_sot_constrains_the_skeleton_by_default_where_it_runs(
    smollm2_path, monkeypatch, flags, delay_sample, constrained
):
    from sglang_specsot.serving.skeleton_constraint import with_server_constraint

    monkeypatch.setenv("SGLANG_ENABLE_DELAY_SAMPLE", "1" if delay_sample else "0")
    got = with_server_constraint(SoTOptions("on", CONFIG), _server_args(smollm2_path, **flags))
    assert (got.skeleton_logit_processor is not None) is constrained
    if constrained:
        processor = CustomLogitProcessor.from_str(got.skeleton_logit_processor)
        assert type(processor).CONFIG == CONFIG and type(processor).TOKENIZER_PATH == smollm2_path


@pytest.fixture
def in_server(monkeypatch):
    """Run the processor as if inside a server with the given resolved settings."""
    from sglang_specsot.serving import skeleton_constraint as sc

    def settle(algorithm=None, disable_overlap_schedule=False, delay_sample=False):
        monkeypatch.setattr(sc.sgl, "get_spec", lambda: SimpleNamespace(speculative_algorithm=algorithm))
        monkeypatch.setattr(sc.sgl, "get_schedule",
                            lambda: SimpleNamespace(disable_overlap_schedule=disable_overlap_schedule))  # fmt: skip
        monkeypatch.setenv("SGLANG_ENABLE_DELAY_SAMPLE", "1" if delay_sample else "0")
        monkeypatch.setattr(sc.SkeletonConstraint, "_warned", set())
        sc.stale_history_reason.cache_clear()

    yield settle
    sc.stale_history_reason.cache_clear()


def test_outside_a_server_the_processor_is_trusted():
    from sglang_specsot.serving.skeleton_constraint import stale_history_reason

    stale_history_reason.cache_clear()  # nothing published in a test process: get_spec raises
    assert stale_history_reason() is None


@pytest.mark.parametrize(
    "settings, why",
    [({"algorithm": "SPECSOT"}, None),  # None: the history is current, the mask applies
     ({"disable_overlap_schedule": True}, None),
     ({"delay_sample": True}, None),
     ({}, "one token late"),  # a plain server with SGLang's overlap scheduler
     ({"algorithm": "NGRAM", "disable_overlap_schedule": True}, "--speculative-algorithm NGRAM")],
)  # fmt: skip
def test_a_server_with_a_stale_history_gets_no_mask_and_a_reason_once(
    processor, tokenizer, in_server, caplog, settings, why
):
    in_server(**settings)
    logits = torch.zeros(1, len(tokenizer))
    for _ in range(2):
        out = processor(logits.clone(), [{"__req__": _req(_ids(tokenizer, " Keep"))}])
        assert bool(torch.isinf(out).any()) is (why is None)
    warnings = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    if why is None:
        assert warnings == []
    else:  # once, saying why and what to launch instead
        assert len(warnings) == 1 and why in warnings[0] and "SPECSOT" in warnings[0]


def test_server_side_sot_keeps_the_clients_own_processor(smollm2_path):
    from sglang_specsot.serving.skeleton_constraint import with_server_constraint

    options = SoTOptions("on", CONFIG, skeleton_logit_processor="client's own")
    assert with_server_constraint(options, _server_args(smollm2_path, speculative_algorithm="SPECSOT")) is options


def test_frontend_router_choice():
    from sglang_specsot.frontend import _with_classifier

    options = SoTOptions(mode="auto")
    assert _with_classifier(options, "rules") is options
    assert _with_classifier(SoTOptions(mode="on"), "classifier").classifier is None  # not routed
    with pytest.raises(ValueError, match="router='model' is not one of"):
        _with_classifier(options, "model")
