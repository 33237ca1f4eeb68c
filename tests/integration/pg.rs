//! A throwaway PostgreSQL cluster for the fleet's tests: `initdb` into a
//! temporary directory, `postgres` on 127.0.0.1 with a random free port
//! and its Unix socket in that directory, stopped (fast shutdown) on drop.
//! Run as root (CI), the cluster belongs to an unprivileged account
//! (`postgres`, else `nobody`) through `setpriv`, since `initdb` refuses
//! root. Without the binaries a test is skipped with a message, except
//! under `CI=true`, where it fails. [`PgCluster::start_tls`] starts one
//! with `ssl=on` that accepts TCP clients over TLS only: a certificate
//! authority and a server certificate for 127.0.0.1 made at test time by
//! `openssl` (a dependency of Debian's `postgresql`), and a second
//! authority that signed nothing. Every cluster binds 127.0.0.1 only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Peer, require};

/// Where Debian puts each major version's server binaries
/// (`VERSION/bin`); the newest is used unless `NPC_TEST_PG_BIN` names one.
const DEBIAN_PG_DIR: &str = "/usr/lib/postgresql";
/// How long the server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a fast shutdown may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// How often readiness and exit are looked at while waiting.
const WAIT_STEP: Duration = Duration::from_millis(50);
/// The cluster's superuser and its password (scram over TCP).
pub const PG_USER: &str = "npc";
pub const PG_PASSWORD: &str = "fleet-secret-8d1f0c";
/// Connections the server accepts (16 workers with their pools).
const MAX_CONNECTIONS: &str = "400";

fn pg_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("NPC_TEST_PG_BIN") {
        return PathBuf::from(bin);
    }
    let newest = std::fs::read_dir(DEBIAN_PG_DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((major, bin))
        })
        .max_by_key(|(major, _)| *major);
    newest.map_or_else(|| Path::new(DEBIAN_PG_DIR).join("bin"), |(_, bin)| bin)
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The account the cluster runs as when the tests run as root.
fn account() -> &'static str {
    let has = |name: &str| nix::unistd::User::from_name(name).ok().flatten().is_some();
    if has("postgres") {
        "postgres"
    } else {
        "nobody"
    }
}

/// `program` as the cluster's account (directly when not root).
fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        let who = account();
        c.args([
            &format!("--reuid={who}"),
            &format!("--regid={who}"),
            "--init-groups",
            "--pdeathsig=KILL",
        ])
        .arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// `postgres` on `port` over the data directory in `dir`, with `extra`
/// settings (`-c name=value` pairs).
fn spawn_server(dir: &Path, port: u16, extra: &[String]) -> Child {
    as_owner(&pg_bin().join("postgres"))
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-p", &port.to_string()])
        .arg("-k")
        .arg(dir)
        .args(["-c", "listen_addresses=127.0.0.1"])
        .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
        .args(["-c", "full_page_writes=off"])
        .args(["-c", &format!("max_connections={MAX_CONNECTIONS}")])
        .args(extra)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start postgres")
}

/// When a commit is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commits {
    /// Before it is written out (`synchronous_commit=off`): fast, and a
    /// crash loses the last ones.
    Lazy,
    /// Once it is written out (to the OS; `fsync` stays off): a crash of
    /// the server loses none.
    Durable,
}

/// A running throwaway cluster.
pub struct PgCluster {
    dir: tempfile::TempDir,
    child: Option<Child>,
    pub port: u16,
    /// The server's settings beyond the defaults (its TLS).
    extra: Vec<String>,
}

/// The certificate files of a TLS cluster, in its directory.
#[allow(dead_code)]
pub struct TlsFiles {
    /// The authority that signed the server's certificate.
    pub ca: PathBuf,
    /// An authority that signed nothing the server holds.
    pub wrong_ca: PathBuf,
}

/// `openssl ARGS` in `dir`; panics with its stderr on failure.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (Debian's `postgresql` depends on it)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed certificate authority `NAME.pem` with key `NAME.key`.
fn make_ca(dir: &Path, name: &str) {
    let (key, pem, subject) = (
        format!("{name}.key"),
        format!("{name}.pem"),
        format!("/CN={name}"),
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &subject,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// The authorities and the server's certificate for 127.0.0.1 in `dir`.
fn make_certs(dir: &Path) -> TlsFiles {
    make_ca(dir, "ca");
    make_ca(dir, "wrong-ca");
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    TlsFiles {
        ca: dir.join("ca.pem"),
        wrong_ca: dir.join("wrong-ca.pem"),
    }
}

impl PgCluster {
    /// Start one, or `None` when the server binaries are missing
    /// ([`require`]: skipped outside CI, failed under `CI=true`).
    pub fn start() -> Option<Self> {
        Self::start_with(false, Commits::Lazy).map(|(cluster, _)| cluster)
    }

    /// [`start`](Self::start) with every commit written out before it is
    /// answered, so a crash ([`Shutdown::Immediate`]) loses no committed
    /// transaction (the other clusters, `synchronous_commit=off`, lose
    /// the last ones, as a store configured so would).
    #[allow(dead_code)]
    pub fn start_durable() -> Option<Self> {
        Self::start_with(false, Commits::Durable).map(|(cluster, _)| cluster)
    }

    /// [`start`](Self::start) with `ssl=on`, TCP clients over TLS only
    /// (`hostssl` in `pg_hba.conf`); the certificate files with it.
    #[allow(dead_code)]
    pub fn start_tls() -> Option<(Self, TlsFiles)> {
        Self::start_with(true, Commits::Lazy)
            .map(|(cluster, files)| (cluster, files.expect("certificates")))
    }

    fn start_with(tls: bool, commits: Commits) -> Option<(Self, Option<TlsFiles>)> {
        let bin = pg_bin();
        if !require(Peer::condition(
            &format!("PostgreSQL server binaries in {}", bin.display()),
            bin.join("initdb").exists() && bin.join("postgres").exists(),
            "apt-get install postgresql",
        )) {
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, PG_PASSWORD).unwrap();
        if is_root() {
            let user = nix::unistd::User::from_name(account()).unwrap().unwrap();
            nix::unistd::chown(dir.path(), Some(user.uid), Some(user.gid)).unwrap();
            nix::unistd::chown(&pwfile, Some(user.uid), Some(user.gid)).unwrap();
        }
        let out = as_owner(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                PG_USER,
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ])
            .args(["--no-sync", "--encoding=UTF8", "--locale=C"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .current_dir(dir.path())
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (files, extra) = if tls {
            let files = make_certs(dir.path());
            let key = dir.path().join("server.key");
            if is_root() {
                let user = nix::unistd::User::from_name(account()).unwrap().unwrap();
                nix::unistd::chown(&key, Some(user.uid), Some(user.gid)).unwrap();
            }
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
            let hba = data.join("pg_hba.conf");
            let rules = std::fs::read_to_string(&hba).unwrap();
            let rules: String = rules
                .lines()
                .map(|l| match l.strip_prefix("host ") {
                    Some(rest) => format!("hostssl {rest}\n"),
                    None => format!("{l}\n"),
                })
                .collect();
            std::fs::write(&hba, rules).unwrap();
            let extra = vec![
                "-c".to_string(),
                "ssl=on".to_string(),
                "-c".to_string(),
                format!("ssl_cert_file={}", dir.path().join("server.pem").display()),
                "-c".to_string(),
                format!("ssl_key_file={}", key.display()),
            ];
            (Some(files), extra)
        } else {
            (None, Vec::new())
        };
        let mut extra = extra;
        if commits == Commits::Durable {
            // After the defaults on the command line, so it wins.
            extra.extend(["-c".to_string(), "synchronous_commit=on".to_string()]);
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = spawn_server(dir.path(), port, &extra);
        let cluster = Self {
            dir,
            child: Some(child),
            port,
            extra,
        };
        cluster.wait_ready();
        Some((cluster, files))
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ready = Command::new(pg_bin().join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections within {READY_TIMEOUT:?}"
            );
            std::thread::sleep(WAIT_STEP);
        }
    }

    /// The URL of database `db`, with the password.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://{PG_USER}:{PG_PASSWORD}@127.0.0.1:{}/{db}",
            self.port
        )
    }

    /// A fresh database; returns its URL.
    pub fn database(&self, name: &str) -> String {
        let out = Command::new(pg_bin().join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                PG_USER,
            ])
            .arg(name)
            .env("PGPASSWORD", PG_PASSWORD)
            .env("PGSSLMODE", "prefer")
            .output()
            .expect("run createdb");
        assert!(
            out.status.success(),
            "createdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.url(name)
    }

    /// Stop the server (fast shutdown) and start it again on the same
    /// port and data, as an operator's restart does.
    #[allow(dead_code)]
    pub fn restart(&mut self) {
        self.restart_in(Shutdown::Fast);
    }

    /// [`PgCluster::restart`] with the shutdown `mode`.
    #[allow(dead_code)]
    pub fn restart_in(&mut self, mode: Shutdown) {
        if let Some(child) = self.child.take() {
            stop_server_in(child, mode);
        }
        self.child = Some(spawn_server(self.dir.path(), self.port, &self.extra));
        self.wait_ready();
    }

    /// Stop the server (fast shutdown) until [`PgCluster::start_again`].
    #[allow(dead_code)]
    pub fn stop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_server(child);
        }
    }

    /// Start a server [`PgCluster::stop`] stopped, on the same port and data.
    #[allow(dead_code)]
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        self.child = Some(spawn_server(self.dir.path(), self.port, &self.extra));
        self.wait_ready();
    }

    /// The server's process id (the postmaster; its backends are its
    /// children).
    #[allow(dead_code)]
    pub fn server_pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The cluster's directory (its socket lives there).
    #[allow(dead_code)]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// How the server is stopped (`pg_ctl stop -m MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub enum Shutdown {
    /// SIGINT: sessions are ended, open transactions rolled back, and the
    /// server checkpoints before it exits.
    Fast,
    /// SIGQUIT: every process quits at once, as in a crash; the next start
    /// recovers from the write-ahead log.
    Immediate,
}

/// SIGINT (fast shutdown), then SIGKILL past [`STOP_TIMEOUT`].
fn stop_server(child: Child) {
    stop_server_in(child, Shutdown::Fast);
}

/// Stop the server in `mode`, then SIGKILL past [`STOP_TIMEOUT`].
fn stop_server_in(mut child: Child, mode: Shutdown) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let signal = match mode {
        Shutdown::Fast => nix::sys::signal::Signal::SIGINT,
        Shutdown::Immediate => nix::sys::signal::Signal::SIGQUIT,
    };
    let _ = nix::sys::signal::kill(pid, signal);
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(WAIT_STEP);
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            stop_server(child);
        }
    }
}
