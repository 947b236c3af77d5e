"""dgxdoctor's RAS reader against a live NCCL job: the reply (bytes both ways) and the parsed report as JSON.

``read.py [--host H] [--port P] [--text] [--deadline S]`` (PYTHONPATH=src); used by scripts/h200-ras*.sh.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time

from dgxdoctor.records import asdict
from dgxdoctor.sources.ras_client import RasError, query
from dgxdoctor.sources.ras_report import RasReportError, parse_report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="localhost")
    parser.add_argument("--port", type=int, default=28028)
    parser.add_argument("--text", action="store_true", help="do not ask for the JSON report")
    parser.add_argument("--brief", action="store_true", help="STATUS instead of VERBOSE STATUS")
    parser.add_argument("--deadline", type=float, default=15.0)
    args = parser.parse_args(argv)
    out: dict[str, object] = {"asked_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "t": time.time()}
    try:
        reply = query(args.host, args.port, verbose=not args.brief, want_json=not args.text, deadline_s=args.deadline)
    except RasError as exc:
        out.update(error_kind=exc.kind, error=str(exc))
        print(json.dumps(out, indent=1))
        return 2
    out["reply"] = {
        "server_protocol": reply.server_protocol,
        "format": reply.format,
        "attempts": reply.attempts,
        "seconds": round(reply.seconds, 4),
        "notes": list(reply.notes),
        "exchanges": [
            {
                "sent": base64.b64encode(e.sent).decode(),
                "received": base64.b64encode(e.received).decode(),
                "seconds": round(e.seconds, 4),
            }
            for e in reply.exchanges
        ],
    }
    out["report_text"] = reply.report
    try:
        out["parsed"] = asdict(parse_report(reply.report))
    except RasReportError as exc:
        out["parse_error"] = str(exc)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
