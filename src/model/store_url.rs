//! `[store] url`'s TLS parameters, libpq's words: `sslmode` (`disable`,
//! `prefer`, `require`, `verify-ca`, `verify-full`) and `sslrootcert` (an
//! absolute path to a PEM file of certificate authorities, or `system`).
//! [`parse`] takes them out of the URL and leaves the rest for the
//! PostgreSQL driver, which knows neither verify mode nor `sslrootcert`.
//! Pure: reading the file and connecting are `store::pg`'s.
//!
//! The URL holds a password: nothing here quotes it or any part of it;
//! an error names only the parameter.

use std::borrow::Cow;
use std::path::PathBuf;

/// How the connection to the server is protected (libpq's `sslmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, else plain; the certificate is not
    /// checked.
    Prefer,
    /// TLS, the certificate not checked (checked as `verify-ca` when
    /// `sslrootcert` names a file, libpq's rule).
    Require,
    /// TLS, the certificate signed by a trusted authority, any host name.
    VerifyCa,
    /// TLS, the certificate signed by a trusted authority and valid for the
    /// host the URL names.
    VerifyFull,
}

/// Every `sslmode` value, as written.
pub const SSL_MODES: [(&str, SslMode); 5] = [
    ("disable", SslMode::Disable),
    ("prefer", SslMode::Prefer),
    ("require", SslMode::Require),
    ("verify-ca", SslMode::VerifyCa),
    ("verify-full", SslMode::VerifyFull),
];

impl SslMode {
    pub fn as_str(self) -> &'static str {
        SSL_MODES
            .iter()
            .find(|(_, m)| *m == self)
            .map_or("", |(name, _)| name)
    }

    /// Whether the server's certificate is checked against trusted roots.
    pub fn verifies(self) -> bool {
        matches!(self, Self::VerifyCa | Self::VerifyFull)
    }
}

/// The certificate authorities a verify mode trusts (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RootCert {
    /// `sslrootcert=system`: the operating system's roots (and
    /// `verify-full`, as libpq has it).
    System,
    /// A PEM file of certificates, an absolute path.
    File(PathBuf),
}

/// libpq's TLS parameters npc does not take; each is refused by name.
pub const UNSUPPORTED_SSL_PARAMETERS: [&str; 10] = [
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "requiressl",
];

/// A store URL with its TLS parameters taken out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl {
    /// The URL without `sslmode` and `sslrootcert`, for the driver.
    pub rest: String,
    pub sslmode: Option<SslMode>,
    pub sslrootcert: Option<RootCert>,
}

/// Why a store URL's TLS parameters are refused; never quotes the URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreUrlError {
    #[error(
        "its `sslmode` is not one of `disable`, `prefer`, `require`, `verify-ca`, `verify-full`"
    )]
    SslMode,
    #[error(
        "its `sslrootcert` is not an absolute path or `system`; name the certificate authorities' PEM file by its absolute path"
    )]
    RelativeRootCert,
    #[error("it names `{0}` more than once; keep one")]
    Repeated(&'static str),
    #[error("its `{0}` is not supported; npc reads `sslmode` and `sslrootcert` only")]
    Unsupported(&'static str),
    #[error("a parameter of it is not valid UTF-8 once decoded")]
    NotUtf8,
    #[error(
        "its `sslrootcert=system` needs `sslmode=verify-full` (or no `sslmode`), as libpq has it"
    )]
    WeakSystemRoots,
}

fn decoded(text: &str) -> Result<Cow<'_, str>, StoreUrlError> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map_err(|_| StoreUrlError::NotUtf8)
}

/// Take `sslmode` and `sslrootcert` out of `url`'s query (percent-decoded
/// like the driver does); the other parameters stay as written.
pub fn parse(url: &str) -> Result<StoreUrl, StoreUrlError> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let mut kept = Vec::new();
    let mut sslmode = None;
    let mut sslrootcert = None;
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match &*decoded(key)? {
            "sslmode" => {
                let value = decoded(value)?;
                let mode = SSL_MODES
                    .iter()
                    .find(|(name, _)| *name == value)
                    .map(|(_, mode)| *mode)
                    .ok_or(StoreUrlError::SslMode)?;
                if sslmode.replace(mode).is_some() {
                    return Err(StoreUrlError::Repeated("sslmode"));
                }
            }
            "sslrootcert" => {
                let value = decoded(value)?;
                let root = if value == "system" {
                    RootCert::System
                } else if value.starts_with('/') {
                    RootCert::File(PathBuf::from(&*value))
                } else {
                    return Err(StoreUrlError::RelativeRootCert);
                };
                if sslrootcert.replace(root).is_some() {
                    return Err(StoreUrlError::Repeated("sslrootcert"));
                }
            }
            other => {
                if let Some(name) = UNSUPPORTED_SSL_PARAMETERS.iter().find(|n| **n == other) {
                    return Err(StoreUrlError::Unsupported(name));
                }
                kept.push(pair);
            }
        }
    }
    if sslrootcert == Some(RootCert::System) && sslmode.is_some_and(|m| m != SslMode::VerifyFull) {
        return Err(StoreUrlError::WeakSystemRoots);
    }
    let rest = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(StoreUrl {
        rest,
        sslmode,
        sslrootcert,
    })
}

/// Whether `source`, a manifest string as written, is one whole
/// environment reference (`${NAME}`, no default): then everything it holds
/// came from the user's environment, not from the manifest.
pub fn is_one_env_reference(source: &str) -> bool {
    source
        .strip_prefix("${")
        .and_then(|s| s.strip_suffix('}'))
        .is_some_and(|name| {
            let mut chars = name.chars();
            chars
                .next()
                .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "postgres://npc:pw@db.internal:5432/npc";

    #[test]
    fn tls_parameters_are_taken_out_and_the_rest_kept_as_written() {
        let parsed = parse(&format!(
            "{BASE}?application_name=a%20b&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=3"
        ))
        .unwrap();
        assert_eq!(
            parsed,
            StoreUrl {
                rest: format!("{BASE}?application_name=a%20b&connect_timeout=3"),
                sslmode: Some(SslMode::VerifyFull),
                sslrootcert: Some(RootCert::File("/etc/ca.pem".into())),
            }
        );
        let plain = parse(BASE).unwrap();
        assert_eq!((plain.rest.as_str(), plain.sslmode), (BASE, None));
        for (name, mode) in SSL_MODES {
            let parsed = parse(&format!("{BASE}?sslmode={name}")).unwrap();
            assert_eq!((parsed.rest.as_str(), parsed.sslmode), (BASE, Some(mode)));
            assert_eq!(mode.as_str(), name);
        }
        let system = parse(&format!("{BASE}?sslrootcert=system")).unwrap();
        assert_eq!(system.sslrootcert, Some(RootCert::System));
    }

    #[test]
    fn bad_tls_parameters_are_refused_by_name_without_quoting_the_url() {
        for (query, error) in [
            ("sslmode=verify_full", StoreUrlError::SslMode),
            ("sslmode=allow", StoreUrlError::SslMode),
            ("sslrootcert=ca.pem", StoreUrlError::RelativeRootCert),
            (
                "sslmode=require&sslmode=disable",
                StoreUrlError::Repeated("sslmode"),
            ),
            ("sslkey=%2Fk.pem", StoreUrlError::Unsupported("sslkey")),
            (
                "sslmode=require&sslrootcert=system",
                StoreUrlError::WeakSystemRoots,
            ),
        ] {
            let err = parse(&format!("{BASE}?{query}")).unwrap_err();
            assert_eq!(err, error, "{query}");
            assert!(!err.to_string().contains("pw@"), "{err}");
        }
    }

    #[test]
    fn only_a_whole_reference_without_default_is_one_env_reference() {
        assert!(is_one_env_reference("${NPC_STORE_URL}"));
        for source in [
            "${NPC_STORE_URL:-postgres://h/db?sslrootcert=/x}",
            "postgres://u:${PW}@h/db?sslrootcert=/x",
            "${A}${B}",
            "${}",
            "${1A}",
            "x${A}",
        ] {
            assert!(!is_one_env_reference(source), "{source}");
        }
    }
}
