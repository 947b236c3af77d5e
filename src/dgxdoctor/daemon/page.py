"""The status page at ``GET /``: this node and its peers, what is wrong and what to do, remediation's state.

Server-rendered HTML with inline style and nothing else (nodes have no internet, and the page must load while the
network is the problem). A wall view first: the node-by-check grid at the top (beside what is wrong on a wide
screen, above it on a phone), the page reloading itself every ``[daemon] page_refresh_s`` through a meta refresh
(no script: the page's CSP allows none), each sentence said once, commands in remedies shown as code.
Everything shown comes from what the daemon already holds: its own results, and its peers' ``/state`` as the peer
comparison last fetched it (each with its age); a page load asks no peer. Every value is escaped.
"""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dgxdoctor.config import Config
from dgxdoctor.documents import FindingDoc
from dgxdoctor.fleet.compare import told_by_the_comparison
from dgxdoctor.fleet.incidents import IncidentTracker
from dgxdoctor.fleet.peer_states import PeerStates
from dgxdoctor.fleet.store import ResultStore

if TYPE_CHECKING:
    from dgxdoctor.fleet.cluster import ClusterView, NodeRun

QUIET = ("ok", "skipped")
# A peer the page has no fetch of (it asks none itself): said as such, not as a peer down.
NOT_ASKED_YET = "not asked yet (the peer comparison asks every peer at each of its runs)"
NOT_ASKED_DISABLED = "not asked: the peer comparison ([checks.peer_compare]) is disabled, and the page asks no peer"
NOT_ASKED = (NOT_ASKED_YET, NOT_ASKED_DISABLED)
LABEL = {"ok": "OK", "warning": "WARNING", "critical": "CRITICAL", "unknown": "UNKNOWN", "skipped": "SKIPPED"}

STYLE = """
body{font:16px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;background:#f4f5f7;color:#1c1e21}
main{max-width:980px;margin:0 auto;padding:12px}
h1{font-size:1.35em;margin:0}h2{font-size:1.1em;margin:1em 0 .4em}
.banner{padding:10px 16px;border-radius:10px;color:#fff;font-weight:600;display:flex;flex-wrap:wrap;
align-items:baseline;column-gap:.6em}.banner nav{margin-left:auto}.banner a{color:#fff;margin-left:14px}
.card{background:#fff;border-radius:10px;padding:10px 14px;margin:10px 0;box-shadow:0 1px 2px #0002}
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid #e3e5e8;vertical-align:top}
th{font-size:.85em;color:#555}
.b{display:inline-block;min-width:5.5em;text-align:center;border-radius:6px;padding:2px 6px;font-weight:700;
color:#fff;font-size:.85em}
.ok{background:#1e8e3e}.warning{background:#e37400}.critical{background:#c5221f}.unknown{background:#7b1fa2}
.skipped{background:#80868b}
.muted{color:#555;font-size:.9em;overflow-wrap:anywhere}.node{padding:8px 0;border-bottom:1px solid #e3e5e8}
.node:last-child{border-bottom:0}.remedy{background:#fef7e0;border-left:4px solid #e37400;padding:6px 10px;
margin:6px 0;border-radius:4px}
code{font:.9em ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;overflow-wrap:anywhere}
.remedy code{background:#fff;border:1px solid #e6d9b0;border-radius:4px;padding:0 4px;
display:inline-block;max-width:100%}
ul{padding-left:1.2em;margin:.3em 0}
.grid td,.grid th{padding:3px 8px}.grid .b{min-width:4.8em;font-size:.8em}.grid th .muted{font-weight:400}
@media (min-width:1000px){main{max-width:1480px}
.wall{display:grid;grid-template-columns:minmax(0,max-content) minmax(420px,1fr);gap:0 18px;align-items:start}}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


# A command in a remedy, as the checks write it: `ss -lntp | grep 6379` (a lone backtick stays as it is).
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def remedy_html(text: str) -> str:
    """A remedy with its backtick spans as ``<code>``; every piece escaped on its own, so a span cannot open a tag."""
    pieces = _CODE_SPAN.split(str(text))
    return "".join(f"<code>{_e(p)}</code>" if i % 2 else _e(p) for i, p in enumerate(pieces))


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def says_nothing_more(text: str, than: str) -> bool:
    """Whether ``text`` repeats ``than``: every word of it is in ``than`` ("vLLM dead: X at URL" beside "X at URL:
    vLLM is dead (...)", a summary equal to its only finding's message)."""
    return _words(text) <= _words(than)


def badge(status: str) -> str:
    css = status if status in LABEL else "unknown"
    return f'<span class="b {css}">{_e(LABEL.get(status, status.upper()))}</span>'


def _as_of(fetched_at: float | None, now: float) -> str:
    """When a peer's results (or its failure) were fetched: the page shows what the daemon holds, not a fetch now."""
    if fetched_at is None:
        return ""
    return f" · as of {_e(_when(fetched_at))} ({max(now - fetched_at, 0.0):.0f} s ago)"


def _node_rows(nodes: Sequence[NodeRun], now: float) -> str:
    """One line per node (a list, not a table: it must fit a phone's width with a long error in it)."""
    rows = []
    for n in nodes:
        if n.url is None:
            where = "this node"
        elif n.doc is None:
            word = "not asked" if n.error in NOT_ASKED else "unreachable"
            where = f"<b>{word}</b> at {_e(n.url)}: {_e(n.error)}{_as_of(n.fetched_at, now)}"
        else:
            offset = "" if n.clock_offset_s is None else f", clock {n.clock_offset_s:+.3f} s"
            where = f"{_e(n.url)}{offset}{_as_of(n.fetched_at, now)}"
        bad = sum(1 for c in (n.doc or {}).get("checks", []) if c["status"] not in QUIET)
        count = f" · {bad} check(s) not ok" if bad else ""
        rows.append(f'<div class="node">{badge(n.status.value)} <b>{_e(n.node)}</b>{count}'
                    f'<div class="muted">{where}</div></div>')  # fmt: skip
    return "".join(rows)


def _column_head(n: NodeRun, now: float) -> str:
    """A node's column in the grid: its name, its status, and how old what the grid shows of it is."""
    if n.url is None:
        age = "this node"
    elif n.doc is None:
        age = "not asked" if n.error in NOT_ASKED else "unreachable"
    elif n.fetched_at is not None:
        age = f"{max(now - n.fetched_at, 0.0):.0f} s ago"
    else:
        age = ""
    return f'<th>{_e(n.node)}<br>{badge(n.status.value)}<br><span class="muted">{_e(age)}</span></th>'


def _check_grid(nodes: Sequence[NodeRun], now: float) -> str:
    """Checks down, nodes across: the wall's view, at the top of the page."""
    names: list[str] = []
    for n in nodes:
        names += [c["name"] for c in (n.doc or {}).get("checks", []) if c["name"] not in names]
    by_node = [{c["name"]: c for c in (n.doc or {}).get("checks", [])} for n in nodes]
    head = "".join(_column_head(n, now) for n in nodes)
    rows = []
    for name in names:
        cells = []
        for n, checks in zip(nodes, by_node, strict=True):
            got = checks.get(name)
            cells.append(f"<td>{badge(got['status']) if got else (badge('unknown') if n.doc is None else '-')}</td>")
        rows.append(f"<tr><td>{_e(name)}</td>{''.join(cells)}</tr>")
    return f'<div class="scroll grid"><table><tr><th>check</th>{head}</tr>{"".join(rows)}</table></div>'


def _finding(f: Mapping[str, Any], said: set[str], message: bool = True) -> str:
    """One finding with its own remedy under it (a remedy already said above is not repeated); its subject only
    where its message does not name it already; ``message`` False where the check's summary above says it."""
    said_here = f["message"] if message else None
    subject = f.get("subject") or None
    if subject and said_here and subject in said_here:
        subject = None
    text = ": ".join(_e(part) for part in (subject, said_here) if part)
    fix = f.get("remedy")
    more = f'<div class="remedy">{remedy_html(fix)}</div>' if fix and fix not in said else ""
    if fix:
        said.add(fix)
    return f"<li>{badge(f['status'])} <code>{_e(f['code'])}</code> {text}{more}</li>"


def _problems(view: ClusterView) -> str:
    """Every check that is not ok, per node: its summary, its findings each with its own remedy, the check's remedy.

    The comparison's verdicts that a node's peer_compare check also gives are left to "Between the nodes" when the
    comparison was made here (two nodes or more with results)."""
    compared = len(view.comparison.nodes) >= 2
    nodes = view.nodes
    out = []
    for n in nodes:
        if n.doc is None and n.error in NOT_ASKED:
            out.append(f'<div class="card">{badge("unknown")} <b>{_e(n.node)}</b>: no results: {_e(n.error)}</div>')
            continue
        if n.doc is None:
            out.append(f'<div class="card">{badge("unknown")} <b>{_e(n.node)}</b>: no results: {_e(n.error)}'
                       '<div class="remedy">check dgxdoctor on that node (<code>systemctl status dgxdoctor</code>) '
                       "and the network between the nodes</div></div>")  # fmt: skip
            continue
        for c in n.doc.get("checks", []):
            if c["status"] in QUIET:
                continue
            told = [f for f in c.get("findings", []) if compared and told_by_the_comparison(c["name"], f["code"])]
            shown = [f for f in c.get("findings", []) if f["status"] not in QUIET and f not in told]
            if told and not shown:
                continue  # all it says is the comparison's, below
            said: set[str] = {f["remedy"] for f in told if f.get("remedy")}  # said below, with the comparison
            # Each sentence once: a summary that only repeats its one finding is left out, a finding's message
            # that the summary already holds too.
            summary, message = c["summary"], True
            if len(shown) == 1 and says_nothing_more(summary, shown[0]["message"]):
                summary = ""
            elif len(shown) == 1 and says_nothing_more(shown[0]["message"], summary):
                message = False
            items = "".join(_finding(f, said, message) for f in shown)
            action = (c.get("action") or {}).get("remedy")
            remedy = (
                f'<div class="remedy"><b>remedy</b>: {remedy_html(action)}</div>'
                if action and action not in said
                else ""
            )
            said_here = f": {_e(summary)}" if summary else ""
            out.append(f'<div class="card">{badge(c["status"])} <b>{_e(n.node)}</b> · {_e(c["name"])}{said_here}'
                       f'<ul>{items}</ul>{remedy}</div>')  # fmt: skip
    if out:
        return "".join(out)
    alone = "nothing is wrong on any node that answered"
    return f'<div class="card">{alone}{"; the nodes differ: see below" if view.comparison.findings else ""}</div>'


def _comparison(view: ClusterView) -> str:
    """The comparison's findings, each once: a disagreement of two nodes names no node, the odd one is named only
    where a majority of three or more agree (``fleet.compare``)."""
    findings = view.comparison.findings
    if not findings:
        answered = sum(1 for n in view.nodes if n.doc is not None)
        note = "no difference between the nodes" if answered >= 2 else "needs two nodes with results"
        return f'<div class="card muted">{note}</div>'
    said: set[str] = set()
    items = "".join(_finding(FindingDoc.of(f).dumped(), said) for f in findings)
    return f'<div class="card"><ul>{items}</ul></div>'


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts)))


def _remediation(doc: Mapping[str, Any] | None) -> str:
    if doc is None:
        return '<div class="card muted">remediation state unreadable</div>'
    breaker = doc["breaker"]
    state = f"<b>OPEN</b> ({_e(breaker['reason'])})" if breaker["open"] else "closed"
    budget = doc["budget"]
    rows = []
    for r in reversed(doc["last_actions"]):
        what = r.get("action") or r.get("step") or r.get("event")
        bundle = f"<br><span class='muted'>evidence: <code>{_e(r['bundle'])}</code></span>" if r.get("bundle") else ""
        rows.append(f"<tr><td>{_e(_when(r.get('ts')))}</td><td>{_e(what)}</td><td>{_e(r.get('outcome'))}</td>"
                    f"<td>{_e(r.get('problem') or '')}{bundle}</td></tr>")  # fmt: skip
    table = (
        f'<div class="scroll"><table><tr><th>when</th><th>action</th><th>outcome</th><th>problem</th></tr>'
        f"{''.join(rows)}</table></div>"
        if rows
        else '<p class="muted">no actions yet</p>'
    )
    flight = doc["in_flight"]["action"] if doc.get("in_flight") else "nothing"
    return (
        f'<div class="card">mode <b>{_e(doc["mode"])}</b>, role {_e(doc["role"] or "-")}; breaker {state}; '
        f"budget {_e(budget['left'])} of {_e(budget['limit'])} left; in flight: {_e(flight)}{table}</div>"
    )


def _incidents(doc: Mapping[str, Any] | None) -> str:
    if not doc:
        return ""
    last = doc.get("last")
    count = doc.get("count", 0)
    if last is None:
        text = "no incident recorded"
    else:
        took = last.get("recovery_s")
        end = f"recovered in {took:.0f} s" if isinstance(took, int | float) else "<b>open</b>"
        text = (f"last incident detected {_e(_when(last.get('detected_at')))} ({_e(last.get('problem'))}), "
                f"action {_e(last.get('action') or 'none')}, {end}")  # fmt: skip
    total = f"; {_e(count)} recorded" if count else ""
    return f'<h2>Incidents</h2><div class="card">{text}{total}</div>'


def render_page(view: ClusterView, remediation: Mapping[str, Any] | None,
                incidents: Mapping[str, Any] | None = None, now: float | None = None,
                refresh_s: int = 0) -> str:  # fmt: skip
    """The whole page; every finding shows its own remedy, as its node's results document carries it.

    ``refresh_s``: the browser reloads the page every this many seconds (0: never); a meta refresh, so the page
    refreshes with no script, as its CSP requires."""
    status = view.status.value
    local = view.nodes[0].node if view.nodes else "?"
    now = time.time() if now is None else now
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">' if refresh_s > 0 else ""
    every = f"refreshes every {int(refresh_s)} s" if refresh_s > 0 else "no auto-refresh ([daemon] page_refresh_s = 0)"
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">{refresh}'
        f"<title>{_e(LABEL.get(status, status))} · dgxdoctor {_e(local)}</title><style>{STYLE}</style></head>"
        f'<body><main><header class="banner {_e(status)}"><h1>cluster {_e(LABEL.get(status, status))}</h1>'
        f"<span>{len(view.nodes)} node(s), seen from {_e(local)} at {_e(_when(now))} · {every}</span>"
        f'<nav><a href="/metrics">/metrics</a><a href="/state">/state</a><a href="/healthz">/healthz</a></nav>'
        "</header>"
        f'<div class="wall"><section id="grid"><h2>Checks</h2><div class="card">{_check_grid(view.nodes, now)}</div>'
        f'</section><section id="wrong"><h2>What is wrong</h2>{_problems(view)}'
        f"<h2>Between the nodes</h2>{_comparison(view)}</section></div>"
        f'<h2>Nodes</h2><div class="card">{_node_rows(view.nodes, now)}</div>'
        f"<h2>Remediation</h2>{_remediation(remediation)}{_incidents(incidents)}"
        "</main></body></html>"
    )


class StatusPage:
    """Builds the page on request from what the daemon already holds: the store's results, the peers as the peer
    comparison last fetched them (``fleet.peer_states``: the page asks no peer, so a wedged one cannot hold it up and
    a page reloaded in a loop sends nothing to the peers), remediation's state file."""

    def __init__(
        self,
        store: ResultStore,
        config: Callable[[], Config],
        peers: PeerStates,
        incidents: IncidentTracker | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.peers = peers
        self.incidents = incidents

    def _peer_runs(self) -> list[NodeRun]:
        """Every configured peer, as last fetched; one not fetched yet is UNKNOWN with the reason."""
        from dgxdoctor.fleet.cluster import NodeRun
        from dgxdoctor.fleet.peers import peer_label

        config = self.config()
        compared = config.check_settings("peer_compare").enabled
        runs = []
        for url in config.daemon.peers:
            held = self.peers.get(url)
            if held is None:
                why = NOT_ASKED_YET if compared else NOT_ASKED_DISABLED
                runs.append(NodeRun(peer_label(url), url, None, why))
            elif held.document is None:
                runs.append(NodeRun(held.label, url, None, held.error, fetched_at=held.fetched_at))
            else:
                doc = held.document.state()
                runs.append(NodeRun(str(doc["node"]), url, doc, fetched_at=held.fetched_at))
        return runs

    async def __call__(self) -> str:
        # The cluster view and remediation's status are imported at the first page view: most daemons never
        # serve one, and they stay out of an idle daemon's memory.
        from dgxdoctor.fleet.cluster import NodeRun, assemble
        from dgxdoctor.remediation.status import status_document

        local = NodeRun(self.store.node, None, self.store.snapshot())
        view = assemble(local, self._peer_runs())
        try:
            remediation: dict[str, Any] | None = await asyncio.to_thread(status_document, self.config(), 8)
        except (OSError, ValueError):
            remediation = None
        incidents = self.incidents.summary() if self.incidents is not None else None
        return render_page(view, remediation, incidents, refresh_s=self.config().daemon.page_refresh_s)
