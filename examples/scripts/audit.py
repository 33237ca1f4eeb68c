"""after_tool / on_agent_end hook: append the event to an audit log."""
import json
import os
import sys

event = json.load(sys.stdin)
with open(os.environ.get("AUDIT_LOG", "audit.jsonl"), "a", encoding="utf-8") as log:
    log.write(json.dumps({"event": event["event"], "summary": "--summary" in sys.argv}) + "\n")
