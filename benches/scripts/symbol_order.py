"""Regenerates `link/startup.order`, the symbol ordering file the release build hands the linker
(`build.rs`): the functions `npc --version`, `npc validate examples/full.toml` and `npc hook run
before_tool -m examples/full.toml` execute, in that order of commands, so the code these short
processes touch sits together at the start of `.text` and pages in with a few faults instead of
one per scattered function. Names are the binary's own (mangled) symbols, as callgrind reports
them; the linker ignores names it no longer finds, so a stale file only packs less.

The hashes in the names of generic functions depend on the build's dependency features:
`cargo build --release` and a release build made with the dev-dependencies (`cargo bench`,
`--all-targets`: `tempfile` turns on more of `rustix`) name many functions differently. Pass both
binaries to cover both: the file holds the union, each build finds its own names.

Run from the repository root on release builds of the current tree that keep their symbol table
(`NPC_KEEP_SYMBOLS=1`: build.rs strips it otherwise; the names are the same either way), then
build again without it (needs valgrind and nm):

    NPC_KEEP_SYMBOLS=1 cargo build --release && cp target/release/npc /tmp/npc-build
    NPC_KEEP_SYMBOLS=1 cargo bench --no-run && cp target/release/npc /tmp/npc-bench
    python3 benches/scripts/symbol_order.py /tmp/npc-build /tmp/npc-bench
    cargo build --release

With `--check BINARY` it only reports how many of the file's names BINARY has.
"""
import os, re, subprocess, sys, tempfile

OUT = "link/startup.order"
CALL = b'{"tool_call":{"id":"c","name":"shell__run","arguments":{"cmd":"git status"}}}'
COMMANDS = [
    ["--version"],
    ["validate", "examples/full.toml"],
    ["hook", "run", "before_tool", "-m", "examples/full.toml"],
]
# `fn=(id) name` / `cfn=(id) name` define a compressed name; `fn=(id)` alone reuses it.
FN = re.compile(r"^c?fn=\((\d+)\)(?: (.*))?$")


def executed(npc, args):
    """Names of the functions one run of `npc args` executes, in the order callgrind lists them."""
    with tempfile.NamedTemporaryFile(suffix=".callgrind") as out:
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--demangle=no", f"--callgrind-out-file={out.name}",
             npc, *args],
            input=CALL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        names, ran = {}, []
        for line in open(out.name, encoding="utf-8", errors="replace"):
            m = FN.match(line.rstrip("\n"))
            if not m:
                continue
            if m.group(2) is not None:
                names[m.group(1)] = m.group(2)
            if line.startswith("fn="):
                ran.append(names[m.group(1)])
        # callgrind marks recursion levels as `name'2`; the symbol is `name`.
        return [re.sub(r"'\d+$", "", n) for n in ran]


def functions(npc):
    """The names of the functions in `npc`'s symbol table."""
    nm = subprocess.run(["nm", "--defined-only", npc], capture_output=True, text=True, check=True)
    return {parts[2] for parts in (l.split() for l in nm.stdout.splitlines())
            if len(parts) == 3 and parts[1] in "tT"}


def main():
    if sys.argv[1:2] == ["--check"]:
        names = open(OUT).read().split()
        text = functions(sys.argv[2])
        print(f"{sys.argv[2]} has {sum(n in text for n in names)} of {OUT}'s {len(names)} names")
        return
    binaries = sys.argv[1:] or [os.path.join(
        os.environ.get("CARGO_TARGET_DIR", "target"), "release", "npc")]
    order, seen = [], set()
    for npc in binaries:
        text = functions(npc)
        for args in COMMANDS:
            for name in executed(npc, args):
                if name in text and name not in seen:
                    seen.add(name)
                    order.append(name)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write("".join(n + "\n" for n in order))
    print(f"{OUT}: {len(order)} symbols")


if __name__ == "__main__":
    main()
