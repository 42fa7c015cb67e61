"""The configuration matrix: which servers run, and what each cell asks of them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sglang_specsot.speculative.draft_kind import DraftKind, config_of, draft_kind

NORMAL, SERVER_SOT, FRONTEND = "normal", "server_sot", "frontend"  # how a cell asks
ALL, SUITABLE, UNSUITABLE = "all", "suitable", "unsuitable"  # which questions a cell runs on
BASELINE = "plain"
SAMPLED, SAMPLED_TEMPERATURE = "plain-sampled", 0.7
# Three sampled normal answers per question: one sample makes a noisy ceiling (a single
# refusal scores its question 0), and "covers less than every one of them" needs more than one.
SAMPLED_RUNS = (SAMPLED, f"{SAMPLED}-2", f"{SAMPLED}-3")


# SGLang's plain overlap scheduler hands logit processors a history one token short unless
# sampling is delayed (tp_worker.py:718-745); with it, SoT on the plain server gets the same
# skeleton constraint as on SPECSOT, so SoT-only and SpecSoT answer the same question alike.
DELAY_SAMPLE = (("SGLANG_ENABLE_DELAY_SAMPLE", "1"),)


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One SGLang server: its name, the flags beyond the common ones, extra environment."""

    name: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def algorithm(self) -> str | None:
        """The --speculative-algorithm it runs, None for plain decoding."""
        args = list(self.args)
        flag = "--speculative-algorithm"
        return args[args.index(flag) + 1] if flag in args else None

    @property
    def has_draft(self) -> bool:
        """Whether it loads a draft model beside the target."""
        return "--speculative-draft-model-path" in self.args


@dataclass(frozen=True, slots=True)
class CellConfig:
    """One column of the benchmark: a server, a way of asking, and the questions it runs on."""

    name: str
    server: str
    kind: str  # NORMAL (/generate), SERVER_SOT (/v1/chat/completions + specsot), FRONTEND (sgl program)
    mode: str = "off"  # the SoT mode sent (SERVER_SOT, FRONTEND)
    subset: str = ALL
    temperature: float = 0.0  # NORMAL only; every other cell is greedy
    # SoTConfig fields this cell sets over the run's --sot-config (an ablation in one run)
    sot_config: tuple[tuple[str, object], ...] = ()

    def runs_on(self, suitable: bool) -> bool:
        return self.subset == ALL or (self.subset == SUITABLE) == suitable


# SPECSOT as recommended: its measured cost model sizes each request's draft every step,
# which is also its default without the flag. The flag is passed all the same, since SPECSOT
# reads an adaptive config file only with it (worker.adaptive_config).
SPECSOT_ADAPTIVE = ("--speculative-adaptive",)


def baseline_algorithm(draft: str | None) -> str:
    """SGLang's own algorithm for a draft: EAGLE3 (or EAGLE) for a head, by its config's
    architectures as SPECSOT reads them; STANDALONE for a draft model or a registry name."""
    if not draft or config_of(draft) is None:
        return "STANDALONE"
    return {DraftKind.EAGLE3: "EAGLE3", DraftKind.EAGLE: "EAGLE"}.get(draft_kind(draft), "STANDALONE")


def servers(
    draft_path: str | None, ngram_tokens: int = 6, steps: int = 4, token_map: str | None = None,
    trace: str | None = None,
) -> dict[str, ServerSpec]:  # fmt: skip
    """Plain, NGRAM, SPECSOT from the SoT context alone and, with a draft, SGLang's own
    algorithm for it (STANDALONE, or EAGLE3 for an EAGLE-3 head; the server is named after it)
    and SPECSOT with the draft (the same chain; SPECSOT's window holds 3 context nodes more).
    `token_map`: SPECSOT's draft LM head keeps only its tokens (--speculative-token-map).
    `trace`: SPECSOT servers record what the model pair accepts (SGLANG_SPECSOT_TRACE, this path
    with the server's name before its suffix) and draft their whole window every step
    (SGLANG_SPECSOT_FIXED_WINDOW, no --speculative-adaptive): the pair's acceptance at full
    width, not widths chosen for this machine's costs, which a replay on other hardware needs."""
    adaptive = () if trace else SPECSOT_ADAPTIVE
    traced = lambda name: _traced(trace, name)  # noqa: E731
    out = [
        ServerSpec("plain", (), DELAY_SAMPLE),
        ServerSpec("ngram", ("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(ngram_tokens))),
        ServerSpec("specsot-ctx", ("--speculative-algorithm", "SPECSOT",
                                   "--speculative-num-draft-tokens", str(ngram_tokens), *adaptive), traced("specsot-ctx")),
    ]  # fmt: skip
    if draft_path:
        chain = ("--speculative-draft-model-path", draft_path, "--speculative-num-steps", str(steps),
                 "--speculative-eagle-topk", "1")  # fmt: skip
        algorithm = baseline_algorithm(draft_path)
        out.append(ServerSpec(algorithm.lower(), ("--speculative-algorithm", algorithm, *chain,
                                                  "--speculative-num-draft-tokens", str(steps + 1))))  # fmt: skip
        hot = ("--speculative-token-map", token_map) if token_map else ()
        out.append(ServerSpec("specsot", ("--speculative-algorithm", "SPECSOT", *chain, *hot,
                                          "--speculative-num-draft-tokens", str(steps + 4), *adaptive), traced("specsot")))  # fmt: skip
    return {s.name: s for s in out}


def _traced(trace: str | None, server: str) -> tuple[tuple[str, str], ...]:
    """The environment that makes a SPECSOT server record its acceptance at full width."""
    if not trace:
        return ()
    path = Path(trace)
    return (("SGLANG_SPECSOT_TRACE", str(path.with_name(f"{path.stem}-{server}{path.suffix}").resolve())),
            ("SGLANG_SPECSOT_FIXED_WINDOW", "1"))  # fmt: skip


def matrix(has_draft: bool, baseline: str = "STANDALONE") -> list[CellConfig]:
    """Every configuration, baseline first. SpecSoT runs on the draft server when there is one;
    `baseline` names SGLang's own algorithm for the draft (`baseline_algorithm`)."""
    spec = "specsot" if has_draft else "specsot-ctx"
    cells = [
        CellConfig(BASELINE, "plain", NORMAL),
        # Other normal answers of the same model, sampled: how much of one normal answer
        # another covers is the ceiling the coverage measure can reach, for SoT answers too.
        *(CellConfig(name, "plain", NORMAL, temperature=SAMPLED_TEMPERATURE) for name in SAMPLED_RUNS),
        CellConfig("NGRAM", "ngram", NORMAL),
        CellConfig("SPECSOT-ctx", "specsot-ctx", NORMAL),
    ]
    if has_draft:
        cells += [CellConfig(baseline, baseline.lower(), NORMAL), CellConfig("SPECSOT", "specsot", NORMAL)]
    cells += [
        CellConfig("SoT-server", "plain", SERVER_SOT, "on"),
        # Mode "auto" on the same server: the router, then the latency model on the server's
        # measured row costs (sot/latency.py), on every question; each answer's decision and
        # its predicted times are in the cell (`route_latency`).
        CellConfig("SoT-auto", "plain", SERVER_SOT, "auto"),
        # SoT-server, but a question that names its items still gets a generated skeleton:
        # what deriving the plan from the question (SoTConfig.derive_skeleton) changes.
        CellConfig("SoT-server-skeleton", "plain", SERVER_SOT, "on", sot_config=(("derive_skeleton", False),)),
        CellConfig("SoT-frontend", "plain", FRONTEND, "on"),
        CellConfig("SoT+NGRAM", "ngram", SERVER_SOT, "on"),
        # SoT's branches over SGLang's own drafting with the same draft: what SPECSOT's merge of
        # the draft with the SoT context adds on the same branches.
        *([CellConfig(f"SoT+{baseline}", baseline.lower(), SERVER_SOT, "on")] if has_draft else []),
        CellConfig("SpecSoT-server", spec, SERVER_SOT, "on"),
        # With a draft, SoT's branches on the context-alone server too: SPECSOT without the
        # draft model on the SoT answer, beside SPECSOT-ctx on the normal answer.
        *([CellConfig("SpecSoT-ctx-server", "specsot-ctx", SERVER_SOT, "on")] if has_draft else []),
        CellConfig("SpecSoT-frontend", spec, FRONTEND, "on"),
        CellConfig("SpecSoT-router", spec, SERVER_SOT, "auto", UNSUITABLE),
    ]
    return cells


# Pairs whose greedy answers must be token-identical (speculation is lossless) in float32.
# SoT+NGRAM is not one: SGLang's NGRAM cannot run the skeleton constraint (it masks every
# draft position with the pre-draft history), so its skeletons are unconstrained.
GREEDY_PAIRS = (("SpecSoT-server", "SoT-server"), ("SpecSoT-ctx-server", "SoT-server"),
                ("SpecSoT-frontend", "SoT-frontend"), ("SPECSOT", "plain"), ("SPECSOT-ctx", "plain"))  # fmt: skip


def select(cells: list[CellConfig], names: list[str] | None) -> list[CellConfig]:
    """The named configurations (the baseline always included); a ValueError names unknown ones."""
    if not names:
        return cells
    known = {c.name: c for c in cells}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; known here: {', '.join(known)}")
    wanted = set(names) | {BASELINE}
    return [c for c in cells if c.name in wanted]
