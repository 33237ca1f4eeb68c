fn main() -> std::process::ExitCode {
    npcagent::cli::main()
}
