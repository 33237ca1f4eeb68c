//! The dashboard's static files, compiled into the binary: the page, its
//! script and style sheet, and the vendored terminal emulator (`@xterm/xterm`,
//! see `assets/vendor/README.md`) that draws pane terminals. They hold no
//! data (the page reads the API), so the router serves them without the
//! token, behind the host check, each with [`DASHBOARD_CSP`]: scripts only
//! from this origin and never evaluated from strings, connections only back
//! to this origin (its REST, SSE and WebSocket endpoints), never framed.

/// Version of the vendored `@xterm/xterm` (its files are `assets/vendor/xterm.*`).
pub const XTERM_VERSION: &str = "6.0.0";

/// Every dashboard asset: path, content type, body.
pub const DASHBOARD_ASSETS: [(&str, &str, &str); 5] = [
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("assets/dashboard.html"),
    ),
    (
        "/dashboard.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/dashboard.js"),
    ),
    (
        "/dashboard.css",
        "text/css; charset=utf-8",
        include_str!("assets/dashboard.css"),
    ),
    (
        "/vendor/xterm.js",
        "text/javascript; charset=utf-8",
        include_str!("assets/vendor/xterm.js"),
    ),
    (
        "/vendor/xterm.css",
        "text/css; charset=utf-8",
        include_str!("assets/vendor/xterm.css"),
    ),
];

/// The dashboard's Content-Security-Policy: nothing from elsewhere, no
/// script from a string or an inline block, never framed. One relaxation,
/// for styles only: xterm.js sizes and colours its terminal by writing
/// `<style>` elements and `style` attributes at run time (its DOM
/// renderer's cell metrics, theme and true-colour cells), which a
/// `style-src` without `'unsafe-inline'` would drop. Styles cannot run
/// code, and the page puts server data into text nodes only.
pub const DASHBOARD_CSP: &str = "default-src 'self'; connect-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

#[cfg(test)]
mod tests {
    use super::*;

    fn asset(path: &str) -> &'static str {
        DASHBOARD_ASSETS
            .iter()
            .find(|(p, _, _)| *p == path)
            .map(|(_, _, body)| *body)
            .unwrap()
    }

    #[test]
    fn the_policy_allows_no_script_from_strings_or_elsewhere() {
        for directive in DASHBOARD_CSP.split(';').map(str::trim) {
            if directive.starts_with("style-src") {
                continue;
            }
            assert!(
                !directive.contains("unsafe") && !directive.contains(':'),
                "{directive}"
            );
        }
        assert!(DASHBOARD_CSP.starts_with("default-src 'self';"));
        assert!(!DASHBOARD_CSP.contains("script-src"), "default-src decides");
    }

    #[test]
    fn the_vendored_terminal_needs_no_eval() {
        let xterm = asset("/vendor/xterm.js");
        assert!(xterm.len() > 100_000, "the real bundle, not a stub");
        for forbidden in ["eval(", "new Function(", "Function(\"", "setTimeout(\""] {
            assert!(!xterm.contains(forbidden), "{forbidden}");
        }
        assert!(
            include_str!("assets/vendor/README.md").contains(&format!("**{XTERM_VERSION}**")),
            "the vendor README names the pinned version"
        );
        assert!(include_str!("assets/vendor/xterm.LICENSE").contains("MIT"));
    }

    #[test]
    fn the_page_loads_only_its_own_files_and_never_inlines_script() {
        let page = asset("/");
        for (path, _, _) in DASHBOARD_ASSETS.iter().skip(1) {
            assert!(page.contains(&format!("\"{path}\"")), "{path} is linked");
        }
        assert!(!page.contains("http://") && !page.contains("https://"));
        assert!(!page.contains("<script>") && !page.contains(" style="));
        let handler = page.split(" on").skip(1).any(|rest| {
            let name_len = rest.bytes().take_while(u8::is_ascii_lowercase).count();
            name_len > 0 && rest[name_len..].starts_with('=')
        });
        assert!(!handler, "no inline event handlers");
    }

    #[test]
    fn the_script_writes_server_data_as_text_only() {
        let script = asset("/dashboard.js");
        for forbidden in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
        ] {
            assert!(!script.contains(forbidden), "{forbidden}");
        }
        for forbidden in ["eval(", "new Function", "setTimeout(\"", "setInterval(\""] {
            assert!(!script.contains(forbidden), "{forbidden}");
        }
    }
}
