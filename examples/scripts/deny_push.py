"""before_tool hook: deny `git push` from agents, continue otherwise."""
import json
import sys

call = json.load(sys.stdin)["payload"]["tool_call"]
command = json.dumps(call.get("arguments", {}))
if "git push" in command:
    print(json.dumps({"decision": "deny", "reason": "agents may not push; open a PR instead"}))
else:
    print(json.dumps({"decision": "continue"}))
