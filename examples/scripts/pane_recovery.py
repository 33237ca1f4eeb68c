"""A minimal pane plugin (nightcrow protocol v3): logs pane events, never acts."""
import json
import sys

for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    message = json.loads(line)
    if message.get("event") == "shutdown":
        break
    print(json.dumps({"v": 3, "cmd": "log", "level": "debug", "message": message.get("event", "?")}), flush=True)
