//! One bounded HTTP POST out (the notification sinks'): a body npc made,
//! to a URL the manifest names, with headers the manifest names. No
//! redirect is followed; the whole exchange has a deadline; the request
//! body is capped ([`MAX_POST_BODY_BYTES`]) and at most
//! [`MAX_REPLY_BYTES`] of the reply are read (the rest is never read: the
//! connection is dropped). Errors never quote the URL (it may hold a
//! secret).

use std::time::Duration;

/// Largest request body npc sends.
pub const MAX_POST_BODY_BYTES: usize = 256 * 1024;
/// Most bytes of a reply's body read (kept for the error of a refusal).
pub const MAX_REPLY_BYTES: usize = 16 * 1024;

/// A POST's answer: the status and the head of the reply's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    pub status: u16,
    /// At most [`MAX_REPLY_BYTES`] of the body, as lossy UTF-8.
    pub reply: String,
}

impl Posted {
    /// A 2xx status.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Why a POST got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("the request body is {len} bytes, more than the {MAX_POST_BODY_BYTES} npc sends")]
    TooLarge { len: usize },
    #[error("header `{name}` is not valid HTTP; fix it in the sink's `headers`")]
    Header { name: String },
    #[error("no answer within {ms} ms; check that the receiver is up, or raise `timeout_ms`")]
    Timeout { ms: u128 },
    #[error("the request failed: {reason}")]
    Request { reason: String },
}

/// An HTTP client for POSTs (one per sink, so connections are reused).
#[derive(Debug, Clone)]
pub struct PostClient {
    client: reqwest::Client,
}

impl PostClient {
    /// A client that follows no redirect.
    pub fn new() -> Result<Self, PostError> {
        // reqwest is built without a default TLS provider; install ring once.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| PostError::Request {
                reason: e.without_url().to_string(),
            })?;
        Ok(Self { client })
    }

    /// POST `body` to `url` with `headers`, all of it within `timeout`.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Posted, PostError> {
        if body.len() > MAX_POST_BODY_BYTES {
            return Err(PostError::TooLarge { len: body.len() });
        }
        let mut request = self.client.post(url).body(body);
        for (name, value) in headers {
            let name_ok = reqwest::header::HeaderName::try_from(name.as_str()).is_ok();
            let value_ok = reqwest::header::HeaderValue::try_from(value.as_str()).is_ok();
            if !name_ok || !value_ok {
                return Err(PostError::Header { name: name.clone() });
            }
            request = request.header(name.as_str(), value.as_str());
        }
        let exchange = async {
            let mut response = request.send().await?;
            let status = response.status().as_u16();
            let mut reply = Vec::new();
            while reply.len() < MAX_REPLY_BYTES {
                match response.chunk().await? {
                    Some(chunk) => {
                        let room = MAX_REPLY_BYTES - reply.len();
                        reply.extend_from_slice(&chunk[..chunk.len().min(room)]);
                    }
                    None => break,
                }
            }
            Ok::<_, reqwest::Error>(Posted {
                status,
                reply: String::from_utf8_lossy(&reply).into_owned(),
            })
        };
        match tokio::time::timeout(timeout, exchange).await {
            Err(_) => Err(PostError::Timeout {
                ms: timeout.as_millis(),
            }),
            Ok(Err(e)) => Err(PostError::Request {
                reason: describe(&e.without_url()),
            }),
            Ok(Ok(posted)) => Ok(posted),
        }
    }
}

/// A reqwest error and its causes, one line (the URL already removed).
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
