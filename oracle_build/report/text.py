"""Reports for people in a terminal: verify's table (identity, then configuration, then
tokens, then the gate) and diff's account of two oracles. The same reports are written for
machines as JSON by their models (contracts/reports.py)."""

from __future__ import annotations

from pathlib import Path

from oracle_build.contracts.reports import NOT_COMPARED, DiffReport, TokenRow, VerifyReport
from oracle_build.core import verdicts
from oracle_build.report.values import fmt, margin, nats, text
from oracle_build.report.words import gate_result, numbers_words, verdict_words


def token_table(rows: list[TokenRow]) -> list[str]:
    lines = [f"    {'prompt':<20} {'ids':<4} {'match':<9} {'first div':>9} "
             f"{'golden tok':>10} {'new tok':>8} {'golden margin':>14} "
             f"{'new margin':>14}  class"]
    for t in rows:
        match = f"{t.n_golden if t.tokens_equal else t.index}/{t.n_golden}"
        diverged = t.index is not None
        lines.append(
            f"    {t.prompt[:20]:<20} {'=' if t.prompt_ids_equal else 'DIFF':<4} "
            f"{match:<9} {('-' if t.index is None else t.index):>9} "
            f"{('-' if t.golden_token is None else t.golden_token):>10} "
            f"{('-' if t.new_token is None else t.new_token):>8} "
            f"{(margin(t.golden_margin) if diverged else '-'):>14} "
            f"{(margin(t.new_margin) if diverged else '-'):>14}  {t.kind}")
    return lines


def render(report: VerifyReport) -> str:
    """verify's report: per golden its words column by column, each difference, the
    token table, the gate, and its verdict line; then the closing line."""
    lines = [f"engines ran with the network {text(report.network)}"] if report.network else []
    for v in report.goldens:
        w = verdict_words(v)
        lines.append(f"== {text(v.name)}  ({text(v.path)})")
        if v.status == "not_verifiable_here":
            lines.append(f"  {w.identity}: {text(v.why)}")
            continue
        if v.status == "config_unrecorded":
            lines.append(f"  {w.configuration}")
            lines += [f"    {n}" for n in v.notes]
        if w.identity is not None:
            lines.append(f"  identity: {w.identity}")
        for d in v.identity:
            lines.append(f"    {text(d.field)}: golden {fmt(d.golden)}, current "
                         f"{fmt(d.current)}")
        if w.configuration is not None and v.status != "config_unrecorded":
            lines.append(f"  configuration: {w.configuration}")
        for d in v.configuration:
            lines.append(f"    {text(d.field)}: golden {fmt(d.golden)}, now {fmt(d.current)}")
        for d in v.context:
            lines.append(f"    (context, not failing) {text(d.field)}: golden "
                         f"{fmt(d.golden)}, now {fmt(d.current)}")
        if v.tokens:
            lines.append("  tokens:" + (f"  [{w.tokens_note}]" if w.tokens_note else ""))
            lines += token_table(v.tokens)
            lines.append(f"  {v.summary}")
            moved = numbers_words(v)
            if moved:
                lines.append(f"  {moved}")
        if v.gate:
            lines.append(f"  gate: {v.gate.kind} ({text(v.gate.reason)}): "
                         + gate_result(v.gate.passed))
        lines.append(verdicts.golden(v.status, v.why if v.status != "config_unrecorded"
                                     else ""))
    counts: dict[str, int] = {}
    for v in report.goldens:
        counts[v.status] = counts.get(v.status, 0) + 1
    lines.append(verdicts.verify_closing(counts, report.exit_code))
    return "\n".join(lines)


def render_diff(report: DiffReport, record: Path) -> str:
    """diff's report: both oracles, the packages that differ, per golden the configuration
    differences and each prompt's first divergence with both margins."""
    a, b = report.a, report.b
    lines = [f"A: {text(a.pin_key)} (vllm {text(a.vllm)}, torch {text(a.torch)}, "
             f"transformers {text(a.transformers)})",
             f"B: {text(b.pin_key)} (vllm {text(b.vllm)}, torch {text(b.torch)}, "
             f"transformers {text(b.transformers)})",
             f"packages that differ ({len(report.packages)}):"]
    lines += [f"  {text(p.name)}: {fmt(p.a or '-')} -> {fmt(p.b or '-')}"
              for p in report.packages]
    lines.append(f"how they were made differs ({len(report.recipe)}):")
    lines += [f"  {text(r.what)}: {text(r.a or '-')} -> {text(r.b or '-')}"
              for r in report.recipe]
    for g in report.goldens:
        lines.append(f"== {text(g.name)}  ({text(g.path)})")
        if g.verdict in NOT_COMPARED:
            lines.append(f"  {g.verdict}: {text(g.why)}")
            continue
        for d in g.configuration:
            lines.append(f"  configuration{' (context)' if d.cls == 'context' else ''}: "
                         f"{text(d.field)}: A {text(repr(d.golden))}, B {text(repr(d.current))}")
        for t in g.tokens:
            if t.tokens_equal:
                lines.append(f"  {text(t.prompt)}: same {t.n_golden} tokens")
            else:
                lines.append(f"  {text(t.prompt)}: first divergence at {t.index}: A token "
                             f"{t.golden_token} (A's margin {nats(t.golden_margin)}), B "
                             f"token {t.new_token} (B's margin {nats(t.new_margin)}): "
                             f"{t.kind}")
        lines.append(f"  top-k logprobs {'bit-identical' if g.logprobs_identical else 'differ'}")
    lines.append("")
    lines += [f"{text(g.name)}: {g.verdict}" for g in report.goldens]
    lines.append(f"record: {record}")
    return "\n".join(lines)
