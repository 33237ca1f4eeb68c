//! TLS to the fleet's PostgreSQL server through rustls (`ring`, chosen
//! explicitly: the crate's rustls has no default provider), with libpq's
//! `sslmode` and `sslrootcert` ([`crate::model::store_url`]):
//!
//! - `disable`: plain TCP; `prefer`: TLS when the server offers it;
//!   `require`: TLS — neither checks the certificate (an eavesdropper is
//!   kept out, a man in the middle is not);
//! - `verify-ca`: the certificate chains to a trusted authority;
//!   `verify-full`: and it is valid for the host the URL names;
//! - `require` with an `sslrootcert` file checks as `verify-ca` (libpq's
//!   rule); `sslrootcert=system` means `verify-full` on the system's roots.
//!
//! Without `sslmode` npc chooses [`default_mode`]: `verify-full` for any
//! host but loopback and Unix sockets, which get `prefer`. The authorities
//! a verify mode trusts are the `sslrootcert` file, else the system's
//! roots (`rustls-native-certs`). The file is read as the user named it
//! ([`crate::repofs::read_file`]: a regular file only, at most
//! [`MAX_ROOT_CERT_BYTES`]) and only its PEM certificates are used; no
//! error quotes its path or its contents.

use std::net::IpAddr;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::Host;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::model::store_url::{RootCert, SslMode};
use crate::store::StoreError;

/// Largest `sslrootcert` file read.
pub const MAX_ROOT_CERT_BYTES: usize = 1024 * 1024;

/// How the store's connections are made: the driver's mode and the
/// connector every connection (pool, listener, scheduler) uses.
#[derive(Clone)]
pub(super) struct Tls {
    pub mode: SslMode,
    pub connector: MakeRustlsConnect,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("mode", &self.mode).finish()
    }
}

/// The mode when the URL names none: `prefer` when every host is a Unix
/// socket or loopback (`localhost`, `127.0.0.0/8`, `::1`), else
/// `verify-full`, so a remote server is never reached in the clear or
/// unverified unless the URL says so.
pub fn default_mode(config: &tokio_postgres::Config) -> SslMode {
    let loopback_name = |name: &str| {
        name.eq_ignore_ascii_case("localhost")
            || name
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    };
    let hosts_local = config.get_hosts().iter().all(|host| match host {
        Host::Tcp(name) => loopback_name(name),
        Host::Unix(_) => true,
    });
    let addrs_local = config.get_hostaddrs().iter().all(IpAddr::is_loopback);
    if hosts_local && addrs_local {
        SslMode::Prefer
    } else {
        SslMode::VerifyFull
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The mode the connection runs in: the URL's, else [`default_mode`];
/// `require` with a root certificate file verifies as `verify-ca`, and
/// `sslrootcert=system` as `verify-full`.
pub(super) fn effective_mode(
    asked: Option<SslMode>,
    root: Option<&RootCert>,
    config: &tokio_postgres::Config,
) -> SslMode {
    match (asked, root) {
        (None, Some(RootCert::System)) => SslMode::VerifyFull,
        (Some(SslMode::Require), Some(RootCert::File(_))) => SslMode::VerifyCa,
        (Some(mode), _) => mode,
        (None, _) => default_mode(config),
    }
}

/// The connector for `mode` trusting `root` (when it verifies), and the
/// driver's mode for it.
pub(super) fn tls_for(
    mode: SslMode,
    root: Option<&RootCert>,
) -> Result<(Tls, tokio_postgres::config::SslMode), StoreError> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::PgTls(format!("cannot set up TLS: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = if mode.verifies() {
        let roots = Arc::new(roots(root)?);
        let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| StoreError::PgTls(format!("cannot set up TLS: {e}")))?;
        if mode == SslMode::VerifyFull {
            webpki
        } else {
            Arc::new(Checked {
                check: Check::Chain(webpki),
                provider: provider.clone(),
            })
        }
    } else {
        Arc::new(Checked {
            check: Check::Nothing,
            provider: provider.clone(),
        })
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    let driver = match mode {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    };
    Ok((
        Tls {
            mode,
            connector: MakeRustlsConnect::new(config),
        },
        driver,
    ))
}

/// The trusted authorities: the `sslrootcert` file's certificates, else
/// the system's.
fn roots(root: Option<&RootCert>) -> Result<RootCertStore, StoreError> {
    let mut store = RootCertStore::empty();
    match root {
        Some(RootCert::File(path)) => {
            let bytes = crate::repofs::read_file(path, MAX_ROOT_CERT_BYTES).map_err(|e| {
                StoreError::PgTls(format!("the `sslrootcert` file {}", e.into_reason()))
            })?;
            let mut found = 0usize;
            for cert in CertificateDer::pem_slice_iter(&bytes) {
                let cert = cert.map_err(|_| {
                    StoreError::PgTls(
                        "the `sslrootcert` file is not a PEM file of certificates; name the certificate authorities' PEM file".into(),
                    )
                })?;
                store.add(cert).map_err(|_| {
                    StoreError::PgTls(
                        "a certificate in the `sslrootcert` file is not a valid certificate authority".into(),
                    )
                })?;
                found += 1;
            }
            if found == 0 {
                return Err(StoreError::PgTls(
                    "the `sslrootcert` file holds no PEM certificate; name the certificate authorities' PEM file".into(),
                ));
            }
        }
        Some(RootCert::System) | None => {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                let _ = store.add(cert);
            }
            if store.is_empty() {
                return Err(StoreError::PgTls(
                    "the system has no trusted certificate authorities to verify the server with; name the server's authority with `sslrootcert=/path/to/ca.pem`".into(),
                ));
            }
        }
    }
    Ok(store)
}

/// What [`Checked`] checks of the server's certificate.
#[derive(Debug)]
enum Check {
    /// `prefer`, `require`: nothing (libpq's meaning).
    Nothing,
    /// `verify-ca`: the chain, not the host name.
    Chain(Arc<WebPkiServerVerifier>),
}

/// The verifier of the modes that do not check everything; the
/// handshake's signatures are checked always.
#[derive(Debug)]
struct Checked {
    check: Check,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Checked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Check::Chain(webpki) = &self.check else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// What a failed TLS connection means, in words that quote neither the
/// URL nor the certificate; `None` when `error` is not about TLS.
pub(super) fn tls_words(error: &tokio_postgres::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    let mut last = None;
    while let Some(e) = cause {
        if let Some(rustls) = e.downcast_ref::<rustls::Error>() {
            return Some(rustls_words(rustls));
        }
        if e.to_string().contains(NO_TLS_WORDS) {
            return Some(
                "the server does not offer TLS and `sslmode` requires it (without `sslmode`, any host but loopback gets `verify-full`); turn on `ssl` on the server, or set `sslmode=disable` only on a network you trust".to_string(),
            );
        }
        last = Some(e);
        // An `io::Error`'s `source` skips the error it wraps.
        cause = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as _),
            None => e.source(),
        };
    }
    let text = error.to_string();
    text.starts_with(TLS_FAILED_WORDS).then(|| match last {
        Some(cause) if cause.to_string() != text => format!("{text}: {cause}"),
        _ => text,
    })
}

/// How the driver says a server answered its TLS request with no.
const NO_TLS_WORDS: &str = "server does not support TLS";
/// How the driver starts the message of a failed TLS handshake.
const TLS_FAILED_WORDS: &str = "error performing TLS handshake";

fn rustls_words(error: &rustls::Error) -> String {
    use CertificateError as C;
    let about = match error {
        rustls::Error::InvalidCertificate(cert) => match cert {
            C::UnknownIssuer => {
                "the server's certificate is not signed by a certificate authority npc trusts (the `sslrootcert` file, else the system's); name the server's authority with `sslrootcert`"
            }
            C::NotValidForName | C::NotValidForNameContext { .. } => {
                "the server's certificate is not valid for the host the URL names; connect by a name the certificate lists, or use `sslmode=verify-ca`"
            }
            C::Expired | C::ExpiredContext { .. } => "the server's certificate has expired",
            C::NotValidYet | C::NotValidYetContext { .. } => {
                "the server's certificate is not valid yet (check the clocks)"
            }
            C::Revoked => "the server's certificate is revoked",
            C::BadEncoding => "the server's certificate is malformed",
            C::BadSignature => "the server's certificate has a bad signature",
            _ => "the server's certificate is not acceptable",
        },
        _ => "",
    };
    if about.is_empty() {
        format!("the TLS handshake with the server failed: {error}")
    } else {
        format!("TLS: {about}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn config(url: &str) -> tokio_postgres::Config {
        tokio_postgres::Config::from_str(url).unwrap()
    }

    #[test]
    fn loopback_and_sockets_default_to_prefer_any_other_host_to_verify_full() {
        for url in [
            "postgres://u@127.0.0.1/db",
            "postgres://u@localhost/db",
            "postgres://u@[::1]:5433/db",
            "postgres://u@%2Frun%2Fpostgresql/db",
        ] {
            assert_eq!(default_mode(&config(url)), SslMode::Prefer, "{url}");
        }
        for url in [
            "postgres://u@db.internal/db",
            "postgres://u@10.0.0.7/db",
            "postgres://u@127.0.0.1,db.internal/db",
        ] {
            assert_eq!(default_mode(&config(url)), SslMode::VerifyFull, "{url}");
        }
    }

    #[test]
    fn require_with_a_root_file_verifies_the_chain_and_system_roots_verify_fully() {
        let remote = config("postgres://u@db.internal/db");
        let file = RootCert::File("/ca.pem".into());
        assert_eq!(
            effective_mode(Some(SslMode::Require), Some(&file), &remote),
            SslMode::VerifyCa
        );
        assert_eq!(
            effective_mode(
                None,
                Some(&RootCert::System),
                &config("postgres://u@localhost/db")
            ),
            SslMode::VerifyFull
        );
        assert_eq!(
            effective_mode(Some(SslMode::Disable), None, &remote),
            SslMode::Disable
        );
        assert_eq!(effective_mode(None, None, &remote), SslMode::VerifyFull);
    }

    #[test]
    fn a_root_file_that_is_no_certificate_is_refused_without_its_contents_or_path() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("id_secret");
        std::fs::write(
            &secret,
            "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        for path in [
            secret.clone(),
            dir.path().to_path_buf(),
            dir.path().join("gone"),
        ] {
            let err = tls_for(SslMode::VerifyFull, Some(&RootCert::File(path.clone())))
                .map(drop)
                .unwrap_err()
                .to_string();
            assert!(err.contains("`sslrootcert` file"), "{err}");
            assert!(!err.contains("c2VjcmV0"), "{err}");
            assert!(!err.contains(&*dir.path().to_string_lossy()), "{err}");
        }
        // A FIFO is refused before it is opened: nothing blocks.
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(
            &fifo,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .unwrap();
        let err = tls_for(SslMode::VerifyCa, Some(&RootCert::File(fifo)))
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }
}
