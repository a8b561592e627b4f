"""`render_html(state)`: a self-contained HTML page of a finished program run.

It draws the fork / join tree (each branch a box, side by side under the point where it forked),
the text of each box with generated spans highlighted, and a table of its gen / select calls with
prompt, cached and completion tokens, a cache-hit bar and latency. No scripts, no external assets.
"""

from __future__ import annotations

from html import escape
from typing import Any

_CSS = """
body{font-family:system-ui,sans-serif;margin:16px;color:#222}
.node{border:1px solid #bbb;border-radius:6px;padding:8px;margin:6px 0;background:#fafafa;flex:1;min-width:0}
.title{font-weight:600;font-size:13px;color:#555;margin-bottom:4px}
pre{white-space:pre-wrap;word-break:break-word;font-size:12px;margin:4px 0;background:#fff;padding:6px;
border:1px solid #eee}
.inh{color:#999}.gen{background:#d7f0d7}.sel{background:#dbe6ff}
.forks{display:flex;gap:8px;align-items:flex-start}
.fork{font-size:12px;color:#555;margin-top:6px}
table{border-collapse:collapse;font-size:12px;margin-top:4px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}td:first-child,th:first-child{text-align:left}
.bar{display:inline-block;height:8px;background:#4a4;vertical-align:middle}
.barbg{display:inline-block;width:80px;height:8px;background:#eee;vertical-align:middle}
.err{color:#b00;font-weight:600}
"""


def _text_html(ex: Any, own: list[dict]) -> str:
    text, start = ex.text_, ex.fork_start
    spans = sorted((r["text_start"], r["text_end"], r["kind"]) for r in own if r["text_end"] > r["text_start"])
    out = [f'<span class="inh">{escape(text[:start][-300:])}</span>'] if start else []
    pos = start
    for s, e, kind in spans:
        if s < pos:
            continue
        out.append(escape(text[pos:s]))
        cls = "gen" if kind == "gen" else "sel"
        out.append(f'<span class="{cls}">{escape(text[s:e])}</span>')
        pos = e
    out.append(escape(text[pos:]))
    return "".join(out)


def _calls_html(own: list[dict]) -> str:
    if not own:
        return ""
    rows = ["<tr><th>call</th><th>prompt</th><th>cached</th><th>hit</th><th>completion</th><th>latency</th></tr>"]
    for r in own:
        p, c = r["prompt_tokens"] or 0, r["cached_tokens"] or 0
        frac = c / p if p else 0.0
        rows.append(
            f"<tr><td>{escape(r['kind'])} <b>{escape(str(r['name']))}</b></td><td>{p}</td><td>{c}</td>"
            f'<td><span class="barbg"><span class="bar" style="width:{frac * 80:.0f}px"></span></span> '
            f"{frac:.0%}</td><td>{r['completion_tokens']}</td><td>{r['latency_s'] * 1000:.0f} ms</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _node_html(ex: Any, records: list[dict], title: str) -> str:
    own = [r for r in records if r.get("executor") == ex.id]
    parts = [f'<div class="node"><div class="title">{escape(title)}</div>',
             f"<pre>{_text_html(ex, own)}</pre>", _calls_html(own)]
    if ex.error_ is not None:
        parts.append(f'<div class="err">error: {escape(repr(ex.error_))}</div>')
    for pos, children in ex.fork_groups:
        parts.append(f'<div class="fork">fork &times;{len(children)} at character {pos}</div><div class="forks">')
        for c in children:
            parts.append(_node_html(c, records + c.records, f"branch {c.branch}"))
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def render_html(state: Any, title: str = "radixgen program") -> str:
    """HTML for `state` (a ProgramState): fork tree, texts, calls with their cache hits."""
    ex = state._ex
    ex.wait()
    total_p = sum(r["prompt_tokens"] or 0 for r in ex.records)
    total_c = sum(r["cached_tokens"] or 0 for r in ex.records)
    summary = (f"{len(ex.records)} calls, {total_p} prompt tokens, {total_c} cached "
               f"({(total_c / total_p if total_p else 0):.0%})")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h3>{escape(title)}</h3><p>{summary}</p>"
            f"{_node_html(ex, list(ex.records), 'program')}</body></html>")
