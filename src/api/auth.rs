//! Who may use the REST API, and from where. Every request passes, in
//! order: the trusted-host check (the `Host` header names this machine,
//! which stops DNS-rebinding pages; skipped when the API is remote), the
//! same-origin check for every state-changing request and every WebSocket
//! ([`same_origin`]: a page on another origin cannot POST here, even
//! `text/plain` or without a body), then a credential — a bearer token, or
//! the dashboard's session cookie — unless `daemon.auth = "none"`, and a
//! JSON content type on every request with a body.
//!
//! The dashboard gets its cookie by redeeming a one-time code
//! ([`Dashboard::issue_code`], printed by the daemon and by `npc
//! dashboard` in the page's URL fragment, which never reaches a server log
//! or a `Referer`): `POST /api/v1/session {"code"}` answers with an
//! `HttpOnly; SameSite=Strict` cookie naming a session. Codes expire after
//! [`CODE_TTL`] and serve once; sessions expire after [`SESSION_IDLE`] of
//! disuse; both are bounded ([`MAX_CODES`], [`MAX_SESSIONS`]). Every secret
//! is compared in constant time.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode, header};

use super::ApiError;
pub use crate::surfaces::http::{changes_state, has_body, is_json, origin_allowed};
use crate::surfaces::tcp::{Access, bearer_matches, constant_time_eq};

/// The dashboard's session cookie.
pub const SESSION_COOKIE: &str = "npc_session";
/// How long a one-time code may wait to be redeemed.
pub const CODE_TTL: Duration = Duration::from_secs(10 * 60);
/// One-time codes waiting at once; the oldest is dropped for a new one.
pub const MAX_CODES: usize = 16;
/// Random bytes in a one-time code.
pub const CODE_BYTES: usize = 16;
/// Dashboard sessions at once; the least recently used is dropped.
pub const MAX_SESSIONS: usize = 64;
/// A session unused this long ends.
pub const SESSION_IDLE: Duration = Duration::from_secs(12 * 60 * 60);
/// Random bytes in a session id.
pub const SESSION_BYTES: usize = 32;
/// Longest `Cookie` header looked at.
pub const MAX_COOKIE_HEADER_BYTES: usize = 8 * 1024;

/// The dashboard's one-time codes and sessions.
#[derive(Debug, Default)]
pub struct Dashboard {
    codes: Mutex<VecDeque<(String, Instant)>>,
    sessions: Mutex<VecDeque<(String, Instant)>>,
}

impl Dashboard {
    /// A new one-time code for the dashboard's URL.
    pub fn issue_code(&self) -> std::io::Result<String> {
        let code = crate::stdx::random_hex(CODE_BYTES)?;
        let mut codes = crate::stdx::lock(&self.codes);
        codes.retain(|(_, at)| at.elapsed() < CODE_TTL);
        if codes.len() >= MAX_CODES {
            codes.pop_front();
        }
        codes.push_back((code.clone(), Instant::now()));
        Ok(code)
    }

    /// Redeem `code` once: a new session id, or `None` for a code this
    /// daemon did not issue, already used or expired.
    pub fn redeem(&self, code: &str) -> Option<String> {
        let mut codes = crate::stdx::lock(&self.codes);
        codes.retain(|(_, at)| at.elapsed() < CODE_TTL);
        // Every code is compared, so the time says nothing of which matched.
        let mut found = None;
        for (i, (c, _)) in codes.iter().enumerate() {
            if constant_time_eq(c.as_bytes(), code.as_bytes()) {
                found = Some(i);
            }
        }
        codes.remove(found?);
        drop(codes);
        let session = crate::stdx::random_hex(SESSION_BYTES).ok()?;
        let mut sessions = crate::stdx::lock(&self.sessions);
        sessions.retain(|(_, at)| at.elapsed() < SESSION_IDLE);
        if sessions.len() >= MAX_SESSIONS {
            sessions.pop_front();
        }
        sessions.push_back((session.clone(), Instant::now()));
        Some(session)
    }

    /// Whether `id` is a live session (its idle clock restarts).
    pub fn session(&self, id: &str) -> bool {
        let mut sessions = crate::stdx::lock(&self.sessions);
        sessions.retain(|(_, at)| at.elapsed() < SESSION_IDLE);
        let mut found = None;
        for (i, (s, _)) in sessions.iter().enumerate() {
            if constant_time_eq(s.as_bytes(), id.as_bytes()) {
                found = Some(i);
            }
        }
        let Some(i) = found else { return false };
        if let Some(mut entry) = sessions.remove(i) {
            entry.1 = Instant::now();
            sessions.push_back(entry);
        }
        true
    }
}

/// What the API wants of a client.
#[derive(Debug, Clone)]
pub struct ApiAuth {
    /// A bearer token, or nothing (`daemon.auth = "none"`).
    pub access: Access,
    pub dashboard: Arc<Dashboard>,
}

impl ApiAuth {
    pub fn new(access: Access) -> Self {
        Self {
            access,
            dashboard: Arc::default(),
        }
    }
}

/// `POST /api/v1/session`'s body.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// The one-time code of the dashboard's URL (`#code=…`).
    pub code: String,
}

/// The `Set-Cookie` value of a new dashboard session.
pub fn session_cookie(session: &str) -> String {
    format!("{SESSION_COOKIE}={session}; HttpOnly; SameSite=Strict; Path=/")
}

/// The session cookie's value among `headers`' cookies.
fn session_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter(|v| v.len() <= MAX_COOKIE_HEADER_BYTES)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == SESSION_COOKIE).then_some(value)
        })
}

/// [`crate::surfaces::http::same_origin`], refused as the API says it.
pub fn same_origin(headers: &HeaderMap, remote: bool) -> Result<(), ApiError> {
    if crate::surfaces::http::same_origin(headers, remote) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "untrusted_origin",
        "a request from another web page is refused: the `Origin` must be the page the daemon serves",
    ))
}

/// Whether the request carries a credential `auth` accepts: the bearer
/// token (a terminal WebSocket may send it as the subprotocol
/// `npc.bearer.<token>`, `bearer_from_protocol`), or a live session cookie.
pub fn authorized(
    headers: &HeaderMap,
    auth: &ApiAuth,
    bearer_from_protocol: Option<String>,
) -> bool {
    let Access::Token(token) = &auth.access else {
        return true;
    };
    let given = match headers.get(header::AUTHORIZATION) {
        Some(v) => Some(v.as_bytes()),
        None => bearer_from_protocol.as_deref().map(str::as_bytes),
    };
    if given.is_some() {
        return bearer_matches(given, token);
    }
    session_of(headers).is_some_and(|s| auth.dashboard.session(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_code_serves_once_and_its_session_authorizes() {
        let dashboard = Dashboard::default();
        let code = dashboard.issue_code().unwrap();
        assert_eq!(code.len(), CODE_BYTES * 2);
        assert!(dashboard.redeem("0".repeat(code.len()).as_str()).is_none());
        let session = dashboard.redeem(&code).unwrap();
        assert!(dashboard.redeem(&code).is_none(), "a code serves once");
        let auth = ApiAuth {
            access: Access::Token("t".into()),
            dashboard: Arc::new(dashboard),
        };
        let cookie = format!("a=b; {SESSION_COOKIE}={session}");
        assert!(authorized(&headers(&[("cookie", &cookie)]), &auth, None));
        assert!(!authorized(
            &headers(&[("cookie", "npc_session=forged")]),
            &auth,
            None
        ));
        assert!(authorized(
            &headers(&[("authorization", "Bearer t")]),
            &auth,
            None
        ));
        // A wrong bearer is not rescued by a cookie.
        let both = [("authorization", "Bearer x"), ("cookie", cookie.as_str())];
        assert!(!authorized(&headers(&both), &auth, None));
        assert!(!authorized(&HeaderMap::new(), &auth, None));
    }

    #[test]
    fn codes_and_sessions_are_bounded() {
        let dashboard = Dashboard::default();
        let first = dashboard.issue_code().unwrap();
        for _ in 0..MAX_CODES {
            dashboard.issue_code().unwrap();
        }
        assert!(
            dashboard.redeem(&first).is_none(),
            "the oldest code was dropped"
        );
        let sessions: Vec<String> = (0..=MAX_SESSIONS)
            .map(|_| {
                let code = dashboard.issue_code().unwrap();
                dashboard.redeem(&code).unwrap()
            })
            .collect();
        assert!(
            !dashboard.session(&sessions[0]),
            "the oldest session was dropped"
        );
        assert!(dashboard.session(&sessions[MAX_SESSIONS]));
    }

    #[test]
    fn cross_site_requests_are_refused_and_non_browsers_pass() {
        let host = ("host", "127.0.0.1:8766");
        assert!(
            same_origin(
                &headers(&[host, ("origin", "http://127.0.0.1:8766")]),
                false
            )
            .is_ok()
        );
        assert!(same_origin(&headers(&[host, ("origin", "http://evil.example")]), false).is_err());
        assert!(same_origin(&headers(&[host, ("origin", "null")]), false).is_err());
        assert!(same_origin(&headers(&[host, ("sec-fetch-site", "cross-site")]), false).is_err());
        assert!(same_origin(&headers(&[host, ("sec-fetch-site", "same-site")]), false).is_err());
        assert!(same_origin(&headers(&[host, ("sec-fetch-site", "same-origin")]), false).is_ok());
        assert!(
            same_origin(&headers(&[host]), false).is_ok(),
            "curl sends neither"
        );
        assert!(is_json(&headers(&[(
            "content-type",
            "application/json; charset=utf-8"
        )])));
        assert!(!is_json(&headers(&[("content-type", "text/plain")])));
        assert!(has_body(&headers(&[("content-length", "2")])));
        assert!(!has_body(&headers(&[("content-length", "0")])));
    }
}
