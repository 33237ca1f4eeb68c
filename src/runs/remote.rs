//! A repository's `origin` remote as git reads it: its URL (which may hold
//! credentials, so it is never logged, recorded or shown) and the same URL
//! without them, the fleet's name for it. A worker's fleet, a run row's
//! remote and a worker's mirror all name the remote through this one reader.

/// A repository's `origin` remote.
#[derive(Clone, PartialEq, Eq)]
pub struct Remote {
    /// Its URL as git reads it: it may hold credentials, so it is never
    /// logged, recorded or shown.
    pub url: String,
    /// Its URL without credentials: the fleet's name for it, what a run
    /// row records.
    pub shown: String,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("shown", &self.shown)
            .finish()
    }
}

impl Remote {
    /// `text` (a git error's words) with the URL shown without credentials.
    pub fn scrub(&self, text: &str) -> String {
        if self.url == self.shown {
            text.to_string()
        } else {
            text.replace(&self.url, &self.shown)
        }
    }
}

/// The `origin` remote of the repository at `root`, if it has one.
pub async fn origin_of(
    supervisor: &crate::supervisor::Supervisor,
    root: &std::path::Path,
) -> Option<Remote> {
    let url = super::workspace::git(
        supervisor,
        root,
        &["remote", "get-url", super::workspace::ORIGIN],
    )
    .await
    .ok()
    .filter(|u| !u.is_empty())?;
    Some(Remote {
        shown: without_credentials(&url),
        url,
    })
}

/// `URL` without its user and password (a remote may carry a token).
fn without_credentials(remote: &str) -> String {
    match url::Url::parse(remote) {
        Ok(mut u) if u.has_host() => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        _ => remote.to_string(),
    }
}
