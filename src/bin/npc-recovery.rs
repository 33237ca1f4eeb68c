//! `npc-recovery`: the pane plugin npc ships (protocol v3 on stdin/stdout);
//! see `npcagent::panes::recovery`. Configure it as a `[pane_plugins.NAME]`
//! entry with `allowed_resume_flags = ["resume", "--session"]`.

fn main() -> std::process::ExitCode {
    let plugin = npcagent::panes::recovery::Plugin::from_env(std::io::stdout());
    match plugin.run(std::io::stdin()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(_) => std::process::ExitCode::FAILURE,
    }
}
