"""Judgement, once: first divergence, margins from recorded top-k (nats, and vllm.cpp's
milli-nats), exact tie, near-tie or real, whether repeated legs agree, which gate a golden
may use, whether a recorded setting is numerics or context, and which recorded settings
differ between a golden and a re-run (config_diffs). Pure functions; capture,
verify, compare, margin, determinism, explain and the vllm.cpp interop all call these."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from oracle_build.contracts import engine_keys
from oracle_build.contracts.golden import Golden, Recorded
from oracle_build.contracts.reports import FieldDiff, TokenKind, TokenRow
from oracle_build.contracts.topk import TopKTable, first_difference, moved_cells
from oracle_build.core.errors import BadInput

TopK = Sequence[Sequence[Any]]  # [[token_id, logprob], ...] best first
Kind = TokenKind  # contracts/reports.py: a report's token rows say the same
DEFAULT_BAND_NATS = 0.5
# vllm.cpp's milli-nats (mnats), and its marker for a token outside the recorded top-k.
OUTSIDE_TOPK_MNATS = 99_999_000


def to_mnats(nats: float | None) -> int:
    """A margin in vllm.cpp's milli-nats; None (outside the top-k) is its marker."""
    return OUTSIDE_TOPK_MNATS if nats is None else round(nats * 1000)


def from_mnats(mnats: int) -> float | None:
    return None if mnats >= OUTSIDE_TOPK_MNATS else mnats / 1000.0


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token; a length difference diverges at the shorter end."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


def logprob_of(topk: TopK | None, token: int) -> float | None:
    if not topk:
        return None
    for entry in topk:
        if int(entry[0]) == token:
            return float(entry[1])
    return None


def margin(topk: TopK | None, preferred: int, other: int) -> float | None:
    """logprob(preferred) - logprob(other) in nats at one position; None when either token
    is outside the recorded top-k."""
    a, b = logprob_of(topk, preferred), logprob_of(topk, other)
    if a is None or b is None:
        return None
    return a - b


def top2_margin(topk: TopK | None) -> float | None:
    if not topk or len(topk) < 2:
        return None
    return float(topk[0][1]) - float(topk[1][1])


@dataclass(frozen=True)
class TokenResult:
    prompt: str
    prompt_ids_equal: bool
    tokens_equal: bool
    n_golden: int
    n_new: int
    index: int | None  # first divergence
    golden_token: int | None
    new_token: int | None
    golden_margin: float | None  # golden's logprob(golden tok) - logprob(new tok), at index
    new_margin: float | None  # new run's logprob(new tok) - logprob(golden tok), at index
    kind: Kind

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def row(self) -> TokenRow:
        """As a report's typed token row."""
        return TokenRow(**asdict(self))


def classify(golden_margin: float | None, band: float) -> Kind:
    """At a divergence: an exact tie (margin 0: any tied member is an acceptable argmax),
    a near-tie (inside the band), or real (outside the band, or outside the top-k)."""
    if golden_margin is None:
        return "real"
    m = abs(golden_margin)
    if m == 0.0:
        return "exact_tie"
    return "near_tie" if m <= band else "real"


def compare_prompt(prompt: str, golden_prompt_ids: Sequence[int], golden_tokens: Sequence[int],
                   golden_topk: Sequence[TopK | None] | None, new_prompt_ids: Sequence[int],
                   new_tokens: Sequence[int], new_topk: Sequence[TopK | None] | None,
                   band: float = DEFAULT_BAND_NATS) -> TokenResult:
    ids_equal = list(golden_prompt_ids) == list(new_prompt_ids)
    index = first_divergence(golden_tokens, new_tokens)
    if index is None:
        return TokenResult(prompt, ids_equal, True, len(golden_tokens), len(new_tokens), None,
                           None, None, None, None, "match")
    g = golden_tokens[index] if index < len(golden_tokens) else None
    n = new_tokens[index] if index < len(new_tokens) else None
    g_margin = n_margin = None
    if g is not None and n is not None:
        if golden_topk is not None and index < len(golden_topk):
            g_margin = margin(golden_topk[index], g, n)
        if new_topk is not None and index < len(new_topk):
            n_margin = margin(new_topk[index], n, g)
    kind: Kind = classify(g_margin, band) if (g is not None and n is not None) else "real"
    return TokenResult(prompt, ids_equal, False, len(golden_tokens), len(new_tokens), index, g,
                       n, g_margin, n_margin, kind)


@dataclass(frozen=True)
class Summary:
    total: int
    exact: int
    near_tie: int  # includes exact ties
    real: int
    max_margin: float | None

    def line(self, gate: str = "strict") -> str:
        mm = "n/a" if self.max_margin is None else f"{self.max_margin:.4f} nats"
        return (f"{gate.upper()} token-exact {self.exact}/{self.total}; near-tie "
                f"{self.near_tie}/{self.total}; real divergence {self.real}/{self.total}; "
                f"max margin at a divergence {mm}")


def summarize(results: Sequence[TokenResult]) -> Summary:
    margins = [abs(r.golden_margin) for r in results if r.golden_margin is not None]
    return Summary(
        total=len(results),
        exact=sum(1 for r in results if r.kind == "match" and r.prompt_ids_equal),
        near_tie=sum(1 for r in results if r.kind in ("near_tie", "exact_tie")),
        real=sum(1 for r in results if r.kind == "real" or not r.prompt_ids_equal),
        max_margin=max(margins) if margins else None,
    )


@dataclass(frozen=True)
class LegAgreement:
    """Whether repeated legs of one configuration agree. ``tokens[leg][prompt]``.

    Legs agree when every leg's tokens equal leg 0's, prompt by prompt (a leg that stops
    early disagrees). ``disagreements``: per disagreeing (prompt, leg), the first position
    and the two tokens there. ``cells``: positions where the legs that reached them emitted
    more than one distinct token (vllm.cpp's view of measured non-determinism)."""

    count: int
    agree: bool
    disagreements: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    matches_leg0: list[int]  # per leg: prompts whose tokens equal leg 0's


def legs_agreement(tokens: Sequence[Sequence[Sequence[int]]],
                   ids: Sequence[str]) -> LegAgreement:
    first = tokens[0]
    disagreements: list[dict[str, Any]] = []
    matches = []
    for leg_no, leg in enumerate(tokens):
        same = 0
        for i, pid in enumerate(ids):
            pos = first_divergence(first[i], leg[i])
            if pos is None:
                same += 1
                continue
            disagreements.append({
                "prompt": pid, "leg": leg_no, "position": pos,
                "tokens": [first[i][pos] if pos < len(first[i]) else None,
                           leg[i][pos] if pos < len(leg[i]) else None]})
        matches.append(same)
    cells = []
    for i, pid in enumerate(ids):
        longest = max(len(leg[i]) for leg in tokens)
        for pos in range(longest):
            values = sorted({leg[i][pos] for leg in tokens if pos < len(leg[i])})
            if len(values) > 1:
                cells.append({"prompt": pid, "position": pos, "values": values})
    return LegAgreement(len(tokens), not disagreements, disagreements, cells, matches)


def gate_admissible(kind: str, *, measured_nondeterminism: bool,
                    ratification: str | None) -> tuple[bool, str]:
    """A band or distributional gate only where the oracle's own greedy decode was measured
    non-deterministic, or a ratification is named. Configuration sensitivity is not
    non-determinism: it calls for re-capturing under a recorded configuration."""
    if kind == "strict":
        return True, "strict token-exact"
    if measured_nondeterminism:
        return True, f"{kind}: the golden's own legs measured non-determinism"
    if ratification:
        return True, f"{kind}: ratified by {ratification}"
    return False, (f"a {kind} gate is inadmissible: the golden's legs agree (the oracle was "
                   "deterministic) and no ratification reference is named")


def admit_gate(golden: Golden, path: Path) -> str:
    """The one gate rule of verify and compare: the golden's gate must be admissible (see
    ``gate_admissible``), or the golden is bad input. Returns why it is admitted."""
    ok, reason = gate_admissible(golden.gate.kind,
                                 measured_nondeterminism=bool(golden.nondeterministic),
                                 ratification=golden.gate.ratification)
    if not ok:
        raise BadInput(path, [("gate.kind", reason)],
                       hint="configuration sensitivity is not non-determinism: re-capture "
                       "under a recorded configuration, or measure with `determinism`")
    return reason


def gate_passes(kind: str, results: Sequence[TokenResult]) -> bool:
    if kind == "strict":
        return all(r.kind == "match" and r.prompt_ids_equal for r in results)
    return all(r.prompt_ids_equal and r.kind in ("match", "near_tie", "exact_tie")
               for r in results)


@cache
def _classes() -> dict[str, str]:
    data = tomllib.loads((Path(__file__).parent / "classification.toml").read_text())
    out = {key: "numerics" for key in data["numerics"]["keys"]}
    out.update({key: "context" for key in data["context"]["keys"]})
    return out


def classify_setting(key: str, tightened: dict[str, str] | None = None) -> str:
    """'numerics' or 'context' for a recorded setting such as 'resolved.num_gpu_blocks'."""
    if tightened and tightened.get(key) == "numerics":
        return "numerics"
    classes = _classes()
    if key in classes:
        return classes[key]
    top = key.split(".", 1)[0]
    if top == "requested":  # an engine argument: its class in the allow-list (scheduling
        # decides which requests share a forward pass, so it is held like numerics)
        return "context" if engine_keys.key_class(key.split(".", 1)[1]) == "context" \
            else "numerics"
    return classes.get(top, "numerics")


def first_topk_difference(ids: Sequence[str], reference: TopKTable | None,
                          new: TopKTable | None, k: int) -> dict[str, Any] | None:
    """The first (prompt, position) whose top-k rows (token ids and logprobs, bit for bit)
    differ between ``reference`` (as recorded: top-k plus the sampled token) and ``new`` (the
    re-run's rows, cut to the same k + 1); None when every one is identical. A missing table
    is a table of empty rows."""
    empty = TopKTable(np.zeros(len(ids), dtype=np.int64), np.zeros(0, dtype=np.uint16),
                      np.zeros((0, 1), dtype=np.int32), np.zeros((0, 1), dtype=np.float32))
    return first_difference(ids, reference if reference is not None else empty,
                            new.cut(k + 1) if new is not None else empty)


def numbers_moved(ids: Sequence[str], reference: TopKTable | None, new: TopKTable | None,
                  k: int) -> dict[str, Any] | None:
    """How many of the golden's top-k logprobs the re-run did not give bit for bit (cells,
    of, max_abs_delta); None when either side recorded none."""
    if reference is None or new is None:
        return None
    return moved_cells(ids, reference, new.cut(k + 1))


def flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    """``value`` (a nested table) as dotted keys under ``prefix``."""
    if isinstance(value, dict):
        for k, v in value.items():
            flat(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def _setting_value(item: Any) -> Any:
    if hasattr(item, "unreadable"):
        return {"unreadable": item.unreadable}
    return item.value


def config_diffs(rec: Recorded, new: dict[str, Any]) -> tuple[list[FieldDiff],
                                                              list[FieldDiff]]:
    """Every recorded setting that differs between the golden and the re-run, split into
    numerics (a configuration difference) and context (reported, never failing)."""
    golden = rec.golden
    old: dict[str, Any] = {}
    cur: dict[str, Any] = {}
    for key, item in rec.engine.resolved.items():
        old[f"resolved.{key}"] = _setting_value(item)
    for key, item in new["engine"].resolved.items():
        cur[f"resolved.{key}"] = _setting_value(item)
    for key, backend in rec.engine.backends.items():
        old[f"backends.{key}"] = _setting_value(backend)
    for key, backend in new["engine"].backends.items():
        cur[f"backends.{key}"] = _setting_value(backend)
    flat("requested", dict(rec.engine.requested), old)
    flat("requested", dict(new["engine"].requested), cur)
    flat("environment", dict(rec.environment), old)
    flat("environment", dict(new["environment"]), cur)
    flat("sampling", dict(golden.sampling), old)
    flat("sampling", dict(new["sampling"]), cur)
    old["batch.calls"] = rec.batch.get("calls")
    cur["batch.calls"] = new["calls"]
    # the CPU kernel variant in force: a golden from before variants were held names the one
    # its identity detected (and it ran under that one's environment, unrecorded)
    variant = new["engine"].kernel_variant  # a CPU target's re-run always reads one
    if variant is not None:
        old["kernel_variant"] = rec.kernel_variant
        cur["kernel_variant"] = variant.resolved
        held = rec.engine.kernel_variant
        if held is not None:
            old["kernel_variant.requested"] = held.requested
            cur["kernel_variant.requested"] = variant.requested
            old["kernel_variant.env"] = held.env
            cur["kernel_variant.env"] = variant.env
            # the whole hold, where the golden records it (issue 55): the library the
            # process mapped, torch's dispatch level, every torch.cpu answer given
            if held.predicates is not None:
                old["kernel_variant.libraries"] = held.libraries
                cur["kernel_variant.libraries"] = variant.libraries
                old["kernel_variant.torch_capability"] = held.torch_capability
                cur["kernel_variant.torch_capability"] = variant.torch_capability
                old["kernel_variant.predicates"] = held.predicates
                cur["kernel_variant.predicates"] = variant.predicates
    # the run-time compiler the engine's kernels were compiled with, where the golden
    # records it (issue 63): its version, the bytes of every program it runs and its -march
    # are numerics; how it was chosen, its path and the kernels it made are context
    compiler = new["engine"].compiler
    if rec.engine.compiler is not None and compiler is not None:
        for name in ("version", "tools", "march", "chosen_by", "path", "kernels"):
            old[f"compiler.{name}"] = getattr(rec.engine.compiler, name)
            cur[f"compiler.{name}"] = getattr(compiler, name)
    numerics: list[FieldDiff] = []
    context: list[FieldDiff] = []
    tightened: dict[str, str] = dict(golden.classification)
    for key in sorted(set(old) | set(cur)):
        a, b = old.get(key, "<not recorded>"), cur.get(key, "<not recorded>")
        if a == b:
            continue
        cls = classify_setting(key, tightened)
        diff = FieldDiff(field=key, golden=a, current=b,
                         cls="numerics" if cls == "numerics" else "context")
        (numerics if cls == "numerics" else context).append(diff)
    return numerics, context
