//! The floor of a process in the middle (see relay_floor.py): copies lines from its stdin
//! to a child's stdin and from the child's stdout to its stdout, two blocking threads, no
//! parsing. Not part of the crate; built by hand with `rustc -O`.
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut child = Command::new(&args[0]).args(&args[1..]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut cin = child.stdin.take().unwrap();
    let cout = child.stdout.take().unwrap();
    let t = std::thread::spawn(move || {
        let mut r = BufReader::new(cout);
        let mut out = std::io::stdout().lock();
        let mut line = Vec::new();
        loop { line.clear(); if r.read_until(b'\n', &mut line).unwrap_or(0) == 0 { break; } out.write_all(&line).unwrap(); out.flush().unwrap(); }
    });
    let stdin = std::io::stdin();
    let mut r = stdin.lock();
    let mut line = Vec::new();
    loop { line.clear(); if r.read_until(b'\n', &mut line).unwrap_or(0) == 0 { break; } cin.write_all(&line).unwrap(); cin.flush().unwrap(); }
    drop(cin);
    let _ = t.join();
}
