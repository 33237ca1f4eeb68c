//! The egress proxy of a `strict` run: an HTTP proxy on a unix socket (the
//! run's forwarder carries each connection of its network namespace here)
//! that admits only the hosts of its [`EgressPolicy`]. It speaks `CONNECT
//! host:port` (tunnels, for HTTPS) and plain HTTP in absolute form
//! (`GET http://host/path`, rewritten to origin form). A request head is
//! bounded ([`MAX_HEAD_BYTES`], [`HEAD_TIMEOUT`]); names are resolved only
//! for admitted hosts, so a refused name never reaches a resolver. Every
//! admitted connection and every refusal is reported ([`EgressRecord`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::model::HostPattern;

/// Longest request head read from a client.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Longest wait for a client's request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for an upstream connection (resolution included).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections the proxy carries at once; more wait.
pub const MAX_CONNECTIONS: usize = 256;

/// What the proxy admits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    pub allow: Vec<HostPattern>,
}

impl EgressPolicy {
    pub fn admits(&self, host: &str, port: u16) -> bool {
        self.allow.iter().any(|p| p.admits(host, port))
    }
}

/// One connection the proxy admitted or refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRecord {
    pub host: String,
    pub port: u16,
    /// `CONNECT`, `GET`, …
    pub method: String,
    pub allowed: bool,
    /// Why it was refused or failed.
    pub reason: Option<String>,
}

/// Serve `listener` until it fails (the reason is returned), reporting on
/// `report`.
pub async fn serve(
    listener: UnixListener,
    policy: Arc<EgressPolicy>,
    report: mpsc::UnboundedSender<EgressRecord>,
) -> std::io::Error {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return std::io::Error::other("the proxy's connection slots are gone");
        };
        let (client, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => return e,
        };
        let policy = policy.clone();
        let report = report.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Some(record) = handle(client, &policy).await {
                let _ = report.send(record);
            }
        });
    }
}

/// A parsed request head: method, host, port, and for plain HTTP the head
/// rewritten to origin form.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub host: String,
    pub port: u16,
    /// Plain HTTP: what to send upstream first.
    pub forward: Option<Vec<u8>>,
}

/// Parse a request head (up to and including the blank line).
pub fn parse_head(head: &[u8]) -> Result<Request, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8")?;
    let (line, rest) = text.split_once("\r\n").ok_or("no request line")?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("a request line is METHOD TARGET VERSION".into());
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!("unsupported version `{version}`"));
    }
    if method == "CONNECT" {
        let (host, port) = split_authority(target, None)?;
        return Ok(Request {
            method: method.into(),
            host,
            port,
            forward: None,
        });
    }
    let after = target
        .strip_prefix("http://")
        .ok_or("only `CONNECT` and absolute `http://` requests go through the proxy")?;
    let (authority, path) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let (host, port) = split_authority(authority, Some(80))?;
    let mut forward = format!("{method} {path} {version}\r\n").into_bytes();
    forward.extend_from_slice(rest.as_bytes());
    Ok(Request {
        method: method.into(),
        host,
        port,
        forward: Some(forward),
    })
}

/// `host:port` (or `host` with `default`), no user info.
fn split_authority(authority: &str, default: Option<u16>) -> Result<(String, u16), String> {
    if authority.contains('@') || authority.is_empty() {
        return Err("a bad host".into());
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => Ok((
            host.to_string(),
            port.parse().map_err(|_| format!("a bad port `{port}`"))?,
        )),
        _ => match default {
            Some(port) if !authority.contains(':') => Ok((authority.to_string(), port)),
            _ => Err("no port".into()),
        },
    }
}

/// Read the head (bounded), check it, connect and relay.
async fn handle(mut client: UnixStream, policy: &EgressPolicy) -> Option<EgressRecord> {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
        Ok(Ok(head)) => head,
        Ok(Err(_)) | Err(_) => {
            let _ = client
                .write_all(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n")
                .await;
            return None;
        }
    };
    let request = match parse_head(&head) {
        Ok(r) => r,
        Err(why) => {
            let _ = client
                .write_all(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
                .await;
            return Some(EgressRecord {
                host: String::new(),
                port: 0,
                method: String::new(),
                allowed: false,
                reason: Some(why),
            });
        }
    };
    let mut record = EgressRecord {
        host: request.host.clone(),
        port: request.port,
        method: request.method.clone(),
        allowed: false,
        reason: None,
    };
    if !policy.admits(&request.host, request.port) {
        let _ = client
            .write_all(b"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 44\r\n\r\nthe run's sandbox does not allow this host\r\n")
            .await;
        record.reason = Some("not the model endpoint, npc's gateway or `allow_hosts`".into());
        return Some(record);
    }
    let upstream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect((request.host.as_str(), request.port)),
    )
    .await;
    let mut upstream = match upstream {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            let _ = client
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\n\r\n")
                .await;
            record.reason = Some(format!("cannot connect: {e}"));
            return Some(record);
        }
        Err(_) => {
            let _ = client
                .write_all(b"HTTP/1.1 504 Gateway Timeout\r\nConnection: close\r\n\r\n")
                .await;
            record.reason = Some("the connection timed out".into());
            return Some(record);
        }
    };
    record.allowed = true;
    let sent = match &request.forward {
        Some(head) => upstream.write_all(head).await,
        None => {
            client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await
        }
    };
    if sent.is_ok() {
        tokio::spawn(async move {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        });
    }
    Some(record)
}

/// The bytes up to and including the first blank line, at most
/// [`MAX_HEAD_BYTES`]; bytes past it are not read.
async fn read_head(client: &mut UnixStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while head.len() < MAX_HEAD_BYTES {
        if client.read(&mut byte).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(byte[0]);
        if head.ends_with(b"\r\n\r\n") {
            return Ok(head);
        }
    }
    Err(std::io::Error::other("the request head is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_into_connect_and_origin_form_and_bad_ones_are_refused() {
        let r = parse_head(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(
            (r.host.as_str(), r.port, r.forward),
            ("api.example.com", 443, None)
        );
        let r =
            parse_head(b"GET http://h.example/a?b HTTP/1.1\r\nHost: h.example\r\n\r\n").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("h.example", 80));
        assert_eq!(
            r.forward.unwrap(),
            b"GET /a?b HTTP/1.1\r\nHost: h.example\r\n\r\n".to_vec()
        );
        for bad in [
            &b"GET /local HTTP/1.1\r\n\r\n"[..],
            b"CONNECT h HTTP/1.1\r\n\r\n",
            b"CONNECT u@h:1 HTTP/1.1\r\n\r\n",
            b"GET https://h/ HTTP/1.1\r\n\r\n",
            b"GET http://h/ HTTP/2\r\n\r\n",
            b"GET  http://h/ HTTP/1.1\r\n\r\n",
            b"\xff\r\n\r\n",
        ] {
            assert!(parse_head(bad).is_err(), "{bad:?}");
        }
    }
}
