// Managed by npc (`npc apply`): OpenCode's own tools obey the repository's
// `before_tool` / `after_tool` hooks (the manifest's and its plugins') by
// calling `npc hook run` for every tool call. Edits here are overwritten.
import { spawnSync } from "node:child_process";
import { join } from "node:path";

const MANIFEST = __MANIFEST__;
const TIMEOUT_MS = __TIMEOUT_MS__;
const BEFORE = __BEFORE__;
const AFTER = __AFTER__;
const MAX_OUTPUT_BYTES = 2 * 1024 * 1024;

// Run the hooks of `event` with `payload`; a refusal or a failure throws
// (fail closed), which stops the tool call.
function npcHook(directory, event, payload) {
  const run = spawnSync("npc", ["hook", "run", event, "--manifest", join(directory, MANIFEST)], {
    input: JSON.stringify(payload),
    encoding: "utf8",
    timeout: TIMEOUT_MS,
    maxBuffer: MAX_OUTPUT_BYTES,
  });
  if (run.error) throw new Error(`npc hook run ${event} could not run: ${run.error.message}`);
  const text = (run.stdout || "").trim();
  let answer = {};
  if (text) {
    try {
      answer = JSON.parse(text);
    } catch {
      throw new Error(`npc hook run ${event} answered something that is not JSON`);
    }
  }
  if (run.status !== 0 || answer.decision === "deny") {
    throw new Error(answer.reason || (run.stderr || "").trim() || `npc hook run ${event} failed`);
  }
  return answer;
}

export const NpcHooks = async ({ directory }) => {
  const calls = new Map();
  const hooks = {};
  if (BEFORE || AFTER) {
    hooks["tool.execute.before"] = async (input, output) => {
      const args = output.args ?? {};
      if (BEFORE) {
        const answer = npcHook(directory, "before_tool", {
          tool_call: { id: input.callID, name: input.tool, arguments: args },
        });
        if (answer.decision === "rewrite" && answer.arguments) {
          for (const key of Object.keys(args)) delete args[key];
          Object.assign(args, answer.arguments);
        }
      }
      if (AFTER) calls.set(input.callID, args);
    };
  }
  if (AFTER) {
    hooks["tool.execute.after"] = async (input, output) => {
      const args = calls.get(input.callID) ?? {};
      calls.delete(input.callID);
      const answer = npcHook(directory, "after_tool", {
        tool_call: { id: input.callID, name: input.tool, arguments: args },
        result: { output: String(output.output ?? ""), is_error: false },
      });
      if (typeof answer.output === "string") output.output = answer.output;
    };
  }
  return hooks;
};
