//! Lowering of the sandbox settings: `sandbox` on `[runs]`, profiles and
//! triggers (a mode), and `[runs.sandbox]` (`writable`, `writable_outside`,
//! `readable`, `allow_hosts`). A path is kept as written ([`SandboxPath`]):
//! `~/…` in the home directory, relative in the repository, absolute only
//! where the manifest says so apart (`writable_outside`, `readable`); no
//! path may climb with `..` or name one of the user's secrets
//! ([`SECRET_HOME_PATHS`]).

use super::*;

/// Longest host name `allow_hosts` takes (DNS's limit).
pub const MAX_HOST_BYTES: usize = 253;
/// Longest label of a host name (DNS's limit).
const MAX_LABEL_BYTES: usize = 63;
/// Most entries of one `[runs.sandbox]` list.
pub const MAX_SANDBOX_ENTRIES: usize = 256;

/// Where a `[runs.sandbox]` path may be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Where {
    /// `writable`: the home directory or the repository.
    HomeOrRepository,
    /// `writable_outside`: absolute only.
    Absolute,
    /// `readable`: anywhere.
    Anywhere,
}

impl Lower<'_> {
    /// A `sandbox` mode word.
    pub(super) fn sandbox_mode(&mut self, span: &Span, word: &str) -> Option<SandboxMode> {
        let mode = SandboxMode::parse(word);
        if mode.is_none() {
            let hint = suggest(word, &SandboxMode::NAMES);
            self.error(span, format!("unknown sandbox `{}`", clip(word)), hint);
        }
        mode
    }

    /// `[runs] sandbox`: the project's mode and `[runs.sandbox]`'s rules.
    pub(super) fn runs_sandbox(
        &mut self,
        raw: Option<&Spanned<RawRunsSandbox>>,
    ) -> (Option<SandboxMode>, SandboxRules) {
        let Some(raw) = raw else {
            return (None, SandboxRules::default());
        };
        let table = match &raw.value {
            RawRunsSandbox::Mode(word) => {
                return (self.sandbox_mode(&raw.span, word), SandboxRules::default());
            }
            RawRunsSandbox::Table(table) => table,
        };
        let mode = table
            .mode
            .as_ref()
            .and_then(|m| self.sandbox_mode(&m.span, m));
        let mut rules = SandboxRules::default();
        for (list, place, into_writable) in [
            (&table.writable, Where::HomeOrRepository, true),
            (&table.writable_outside, Where::Absolute, true),
            (&table.readable, Where::Anywhere, false),
        ] {
            for p in list.iter().take(MAX_SANDBOX_ENTRIES) {
                if let Some(path) = self.sandbox_path(p, place) {
                    if into_writable {
                        rules.writable.push(path);
                    } else {
                        rules.readable.push(path);
                    }
                }
            }
        }
        for h in table.allow_hosts.iter().take(MAX_SANDBOX_ENTRIES) {
            match parse_host_pattern(h) {
                Ok(pattern) => rules.allow_hosts.push(pattern),
                Err(why) => self.error(
                    &h.span,
                    format!("`allow_hosts` entry `{}` is not a host: {why}", clip(h)),
                    "write `host`, `host:port` or `*.example.com` (no scheme, path or address range)",
                ),
            }
        }
        let lists = [
            &table.writable,
            &table.writable_outside,
            &table.readable,
            &table.allow_hosts,
        ];
        for list in lists {
            if let Some(extra) = list.get(MAX_SANDBOX_ENTRIES) {
                self.error(
                    &extra.span,
                    format!("more than {MAX_SANDBOX_ENTRIES} entries in a `[runs.sandbox]` list"),
                    "name directories that hold the paths instead of each path",
                );
            }
        }
        (mode, rules)
    }

    fn sandbox_path(&mut self, p: &Spanned<String>, place: Where) -> Option<SandboxPath> {
        let what = match place {
            Where::HomeOrRepository => "writable",
            Where::Absolute => "writable_outside",
            Where::Anywhere => "readable",
        };
        if p.contains('\0') || p.trim().is_empty() {
            self.error(
                &p.span,
                format!("`{what}` entry `{}` is not a path", clip(p)),
                "write `~/DIR`, a path relative to the manifest's directory, or an absolute path",
            );
            return None;
        }
        let climbs = Path::new(p.as_str())
            .components()
            .any(|c| c == Component::ParentDir);
        if climbs {
            self.error(
                &p.span,
                format!("`{what}` entry `{}` climbs with `..`", clip(p)),
                "write the path without `..`",
            );
            return None;
        }
        let path = if let Some(rel) = p.strip_prefix("~/") {
            SandboxPath::Home(rel.trim_end_matches('/').to_string())
        } else if p.starts_with('~') {
            self.error(
                &p.span,
                format!("`{what}` entry `{}` names another user's home", clip(p)),
                "write `~/DIR` for a directory in your own home",
            );
            return None;
        } else if Path::new(p.as_str()).is_absolute() {
            SandboxPath::Absolute(p.trim_end_matches('/').to_string())
        } else {
            SandboxPath::Repository(p.trim_end_matches('/').to_string())
        };
        match (&path, place) {
            (SandboxPath::Absolute(_), Where::HomeOrRepository) => {
                self.error(
                    &p.span,
                    format!("`writable` entry `{}` is outside the home directory and the repository", clip(p)),
                    "write `~/DIR` or a path in the repository; to let runs write elsewhere, list the path in `writable_outside` instead",
                );
                return None;
            }
            (SandboxPath::Home(_) | SandboxPath::Repository(_), Where::Absolute) => {
                self.error(
                    &p.span,
                    format!(
                        "`writable_outside` entry `{}` is not an absolute path",
                        clip(p)
                    ),
                    "list paths in the home directory or the repository in `writable`",
                );
                return None;
            }
            _ => {}
        }
        if let SandboxPath::Home(rel) = &path
            && let Some(secret) = SECRET_HOME_PATHS.iter().find(|s| {
                let s = Path::new(s);
                let rel = Path::new(rel.as_str());
                rel.starts_with(s) || s.starts_with(rel)
            })
        {
            self.error(
                &p.span,
                format!(
                    "`{what}` entry `{}` opens `~/{secret}`, which sandboxed runs never see",
                    clip(p)
                ),
                "name a directory that holds no secrets",
            );
            return None;
        }
        Some(path)
    }
}

/// `allow_hosts` entry `text` as a [`HostPattern`], or why it is none.
pub fn parse_host_pattern(text: &str) -> Result<HostPattern, String> {
    if text.contains('/') {
        return Err("a URL or a path, not a host name".into());
    }
    let (host, port) = match text.rsplit_once(':') {
        Some((host, port)) => {
            let port: u16 = port
                .parse()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| "the port is not a number from 1 to 65535".to_string())?;
            (host, Some(port))
        }
        None => (text, None),
    };
    let (subdomains, name) = match host.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, host),
    };
    if name.is_empty() || name.len() > MAX_HOST_BYTES {
        return Err(format!("a host name has 1 to {MAX_HOST_BYTES} bytes"));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= MAX_LABEL_BYTES
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!(
                "`{}` is not a DNS label (letters, digits, inner `-`)",
                clip(label)
            ));
        }
    }
    Ok(HostPattern {
        host: name.to_ascii_lowercase(),
        subdomains,
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns_admit_exact_names_subdomains_and_ports_only() {
        let p = parse_host_pattern("*.Example.com:443").unwrap();
        assert!(p.admits("api.example.com", 443));
        assert!(p.admits("A.B.EXAMPLE.COM.", 443));
        assert!(!p.admits("example.com", 443));
        assert!(!p.admits("evilexample.com", 443));
        assert!(!p.admits("api.example.com", 80));
        let exact = parse_host_pattern("registry.npmjs.org").unwrap();
        assert!(exact.admits("registry.npmjs.org", 8443));
        assert!(!exact.admits("x.registry.npmjs.org", 443));
        for bad in [
            "",
            "*",
            "*.",
            "a..b",
            "-a.com",
            "http://a.com",
            "a.com:0",
            "a.com:x",
            "a b",
            "[::1]:80",
            "*.*.a",
        ] {
            assert!(parse_host_pattern(bad).is_err(), "{bad}");
        }
    }
}
