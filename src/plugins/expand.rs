//! `${PLUGIN_ROOT}` and `${PLUGIN_DATA}`: the only expansion that happens
//! inside a package (§9), in `args`, `env` values and `cwd` only, in one
//! non-recursive pass: the text a placeholder expands to is never looked
//! at again, and any other `${…}` stays literal. `command`, URLs and
//! headers are never expanded.

use std::collections::BTreeMap;
use std::path::Path;

use super::{PLUGIN_DATA, PLUGIN_ROOT};

/// The two values a package's placeholders expand to.
#[derive(Debug, Clone, Copy)]
pub struct Placeholders<'a> {
    /// The package root: absolute, links resolved.
    pub root: &'a Path,
    /// The plugin's data directory.
    pub data: &'a Path,
}

impl Placeholders<'_> {
    /// `text` with every `${PLUGIN_ROOT}` and `${PLUGIN_DATA}` replaced, once.
    pub fn expand(&self, text: &str) -> String {
        let root = self.root.to_string_lossy();
        let data = self.data.to_string_lossy();
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let after = &rest[i..];
            let (value, len) = if after.starts_with(&format!("${{{PLUGIN_ROOT}}}")) {
                (root.as_ref(), PLUGIN_ROOT.len() + 3)
            } else if after.starts_with(&format!("${{{PLUGIN_DATA}}}")) {
                (data.as_ref(), PLUGIN_DATA.len() + 3)
            } else {
                ("${", 2)
            };
            out.push_str(value);
            rest = &after[len..];
        }
        out.push_str(rest);
        out
    }

    pub fn expand_all(&self, items: &[String]) -> Vec<String> {
        items.iter().map(|s| self.expand(s)).collect()
    }

    pub fn expand_env(&self, env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        env.iter()
            .map(|(k, v)| (k.clone(), self.expand(v)))
            .collect()
    }

    /// A `cwd` expanded; `./x` is relative to the package root. `None`
    /// (no `cwd`) is the package root (§7.2).
    pub fn cwd(&self, cwd: Option<&str>) -> std::path::PathBuf {
        match cwd {
            None => self.root.to_path_buf(),
            Some(c) => match c.strip_prefix("./") {
                Some(rel) => self.root.join(rel),
                None => Path::new(&self.expand(c)).to_path_buf(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> Placeholders<'static> {
        Placeholders {
            root: Path::new("/pkg"),
            data: Path::new("/data/${PLUGIN_ROOT}"),
        }
    }

    #[test]
    fn expands_the_two_names_once_and_nothing_else() {
        let p = p();
        assert_eq!(p.expand("${PLUGIN_ROOT}/s.py"), "/pkg/s.py");
        // The data path contains a placeholder: it is not expanded again.
        assert_eq!(p.expand("${PLUGIN_DATA}/x"), "/data/${PLUGIN_ROOT}/x");
        assert_eq!(
            p.expand("${HOME} $HOME ${PLUGIN_ROOTX} ${"),
            "${HOME} $HOME ${PLUGIN_ROOTX} ${"
        );
        assert_eq!(
            p.expand("a${PLUGIN_ROOT}${PLUGIN_DATA}b"),
            "a/pkg/data/${PLUGIN_ROOT}b"
        );
        // Unclosed names and a trailing `${` after a multi-byte character.
        assert_eq!(p.expand("${PLUGIN_ROOT ${"), "${PLUGIN_ROOT ${");
        assert_eq!(p.expand("a€${"), "a€${");
    }

    #[test]
    fn cwd_defaults_to_the_root() {
        let p = p();
        assert_eq!(p.cwd(None), Path::new("/pkg"));
        assert_eq!(p.cwd(Some("./sub")), Path::new("/pkg/sub"));
        assert_eq!(p.cwd(Some("${PLUGIN_ROOT}/a")), Path::new("/pkg/a"));
    }
}
