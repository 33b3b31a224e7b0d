"""Reports for people: verify's table (identity, then configuration, then tokens, then the
gate). The same reports are written for machines as JSON by their models (contracts/)."""

from __future__ import annotations

import json
from typing import Any

from oracle_build.contracts.reports import VerifyReport

UNRECORDED_BANNER = "CONFIGURATION UNRECORDED: NOT ADJUDICABLE"


def _fmt(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def _m(value: float | None) -> str:
    return "outside top-k" if value is None else f"{value:.4f}"


def render(report: VerifyReport) -> str:
    lines = []
    for v in report.goldens:
        lines.append(f"== {v.name}  ({v.path})")
        if v.status == "config_unrecorded":
            lines.append(f"  {UNRECORDED_BANNER}")
            lines += [f"    {n}" for n in v.notes]
        if v.status == "not_verifiable_here":
            lines.append(f"  NOT VERIFIABLE HERE: {v.why}")
            continue
        if v.status != "config_unrecorded":
            lines.append("  identity: " + ("OK" if not v.identity else "ORACLE DIFFERS" if
                                           v.tokens else "ORACLE MISMATCH"))
        for d in v.identity:
            lines.append(f"    {d.field}: golden {_fmt(d.golden)}, current {_fmt(d.current)}")
        if (v.tokens or v.configuration) and v.status != "config_unrecorded":
            lines.append("  configuration: " + ("same" if not v.configuration else
                                                 "CONFIGURATION DIFFERENCE"))
        for d in v.configuration:
            lines.append(f"    {d.field}: golden {_fmt(d.golden)}, now {_fmt(d.current)}")
        for d in v.context:
            lines.append(f"    (context, not failing) {d.field}: golden {_fmt(d.golden)}, "
                         f"now {_fmt(d.current)}")
        if v.tokens:
            note = "" if v.adjudicable else f"  [{UNRECORDED_BANNER}]" if (
                v.status == "config_unrecorded") else (
                "  [NOT ADJUDICABLE: another oracle]" if v.status == "oracle_mismatch"
                else "  [NOT ADJUDICABLE: configuration differs]")
            lines.append("  tokens:" + note)
            lines.append(f"    {'prompt':<20} {'ids':<4} {'match':<9} {'first div':>9} "
                         f"{'golden tok':>10} {'new tok':>8} {'golden margin':>14} "
                         f"{'new margin':>14}  class")
            for t in v.tokens:
                match = f"{t['n_golden'] if t['tokens_equal'] else t['index']}/{t['n_golden']}"
                lines.append(
                    f"    {t['prompt'][:20]:<20} {'=' if t['prompt_ids_equal'] else 'DIFF':<4} "
                    f"{match:<9} {('-' if t['index'] is None else t['index']):>9} "
                    f"{('-' if t['golden_token'] is None else t['golden_token']):>10} "
                    f"{('-' if t['new_token'] is None else t['new_token']):>8} "
                    f"{(_m(t['golden_margin']) if t['index'] is not None else '-'):>14} "
                    f"{(_m(t['new_margin']) if t['index'] is not None else '-'):>14}  "
                    f"{t['kind']}")
            lines.append(f"  {v.summary}")
        if v.gate:
            lines.append(f"  gate: {v.gate.kind} ({v.gate.reason}): "
                         + {True: "PASS", False: "FAIL", None: "not judged"}[v.gate.passed])
        lines.append(f"  => {v.status.upper().replace('_', ' ')}"
                     + (f": {v.why}" if v.why and v.status != "config_unrecorded" else ""))
    counts: dict[str, int] = {}
    for v in report.goldens:
        counts[v.status] = counts.get(v.status, 0) + 1
    lines.append("verify: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
                 + f" (exit {report.exit_code})")
    return "\n".join(lines)
