//! npc's own whole files among the user's, in an agent CLI's folder (slash
//! commands, subagents): one file per manifest entry, each marked as npc's
//! by its first line(s) ([`Format::is_ours`]). A marked file is npc's —
//! rewritten when its entry changes, removed when the entry (or the CLI) is
//! dropped; a file without the marker is the user's and never touched: an
//! entry whose name a user file takes is skipped with a note. Every read
//! goes through `repofs` confined to the repository (a folder resolving out
//! of it is never listed, a file that is a link is never npc's), and the
//! folders are listed at most [`MAX_FOLDER_ENTRIES`] entries deep.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::repofs::{Links, Root};

/// The line that marks a file as npc's (a YAML comment in frontmatter, a
/// TOML comment).
pub const MANAGED_LINE: &str =
    "# Managed by npc from npcagent.toml: edit the manifest, not this file";
/// Most entries of a folder looked at.
pub const MAX_FOLDER_ENTRIES: usize = 4096;
/// Largest file of such a folder npc reads.
pub const MAX_MANAGED_FILE_BYTES: usize = 1024 * 1024;

/// How a managed file is written and recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Markdown with YAML frontmatter: `---`, then [`MANAGED_LINE`].
    Markdown,
    /// TOML: [`MANAGED_LINE`] first.
    Toml,
}

impl Format {
    /// The file extension (without the dot).
    pub fn extension(self) -> &'static str {
        match self {
            Self::Markdown => "md",
            Self::Toml => "toml",
        }
    }

    /// Whether `text` is a file npc wrote.
    pub fn is_ours(self, text: &str) -> bool {
        let rest = match self {
            Self::Markdown => text.strip_prefix("---\n"),
            Self::Toml => Some(text),
        };
        rest.and_then(|r| r.strip_prefix(MANAGED_LINE))
            .is_some_and(|r| r.starts_with('\n'))
    }

    /// A Markdown file: the marker and `frontmatter` (YAML lines, each
    /// ending in a newline) between the fences, then `body`.
    pub fn markdown(frontmatter: &str, body: &str) -> String {
        let mut out = format!("---\n{MANAGED_LINE}\n{frontmatter}---\n");
        if !body.is_empty() {
            out.push('\n');
            out.push_str(body);
            if !body.ends_with('\n') {
                out.push('\n');
            }
        }
        out
    }

    /// A TOML file: the marker, then `toml`.
    pub fn toml(toml: &str) -> String {
        format!("{MANAGED_LINE}\n{toml}")
    }
}

/// One file npc would create, update or remove, relative to the repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub path: PathBuf,
    /// What the file is for (`claude_code command /review`).
    pub what: String,
    /// The text now; `None` when it does not exist.
    pub before: Option<String>,
    /// The text after; `None`: the file is removed.
    pub after: Option<String>,
    pub notes: Vec<String>,
    /// Why nothing can be planned for this file (it stays as it is).
    pub error: Option<String>,
}

impl Planned {
    /// Nothing can be planned for `path` (`what`), because of `error`: the
    /// file stays as it is.
    pub fn failed(path: PathBuf, what: String, error: String) -> Self {
        Self {
            path,
            what,
            before: None,
            after: None,
            notes: Vec::new(),
            error: Some(error),
        }
    }

    /// Whether applying it changes the file system.
    pub fn is_change(&self) -> bool {
        self.error.is_none() && self.before != self.after
    }
}

/// What one CLI's folder should hold: file stem → (what, text).
pub type Wanted = BTreeMap<String, (String, String)>;

/// The files to write and remove so that `folder` (relative to the
/// repository at `repo`) holds npc's `wanted` files of `format`, and no
/// other file of npc's. Unchanged files are left out.
pub fn plan_folder(repo: &Root, folder: &Path, format: Format, wanted: &Wanted) -> Vec<Planned> {
    let ext = format.extension();
    let mut out = Vec::new();
    let suffix = format!(".{ext}");
    // One more than the bound is asked for, to know the bound was met.
    let existing: Vec<String> = match repo.list_files(folder, &suffix, MAX_FOLDER_ENTRIES + 1) {
        Ok(mut names) => {
            if names.len() > MAX_FOLDER_ENTRIES {
                names.truncate(MAX_FOLDER_ENTRIES);
                out.push(Planned {
                    path: folder.to_path_buf(),
                    what: "agent files".into(),
                    before: None,
                    after: None,
                    notes: vec![format!(
                        "`{}` holds more than {MAX_FOLDER_ENTRIES} `{suffix}` files; only {MAX_FOLDER_ENTRIES} were looked at, so a file of npc's among the others is not removed (remove files there to let npc see them all)",
                        folder.display()
                    )],
                    error: None,
                });
            }
            names
        }
        .into_iter()
            .filter_map(|n| n.strip_suffix(&suffix).map(str::to_string))
            .filter(|stem| !stem.is_empty())
            .collect(),
        Err(_) if wanted.is_empty() => Vec::new(),
        Err(e) => {
            out.push(Planned::failed(
                folder.to_path_buf(),
                "agent files".into(),
                format!("{e}; nothing is written there"),
            ));
            return out;
        }
    };
    for stem in existing {
        if wanted.contains_key(&stem) {
            continue;
        }
        let path = folder.join(format!("{stem}.{ext}"));
        if let Ok(Some(text)) = repo.read_existing(&path, MAX_MANAGED_FILE_BYTES, Links::Refuse)
            && format.is_ours(&text)
        {
            out.push(Planned {
                path,
                what: format!("npc's `{stem}`, no longer in the manifest"),
                before: Some(text),
                after: None,
                notes: Vec::new(),
                error: None,
            });
        }
    }
    for (stem, (what, text)) in wanted {
        let path = folder.join(format!("{stem}.{ext}"));
        let mut planned = Planned {
            path: path.clone(),
            what: what.clone(),
            before: None,
            after: Some(text.clone()),
            notes: Vec::new(),
            error: None,
        };
        match repo.read_existing(&path, MAX_MANAGED_FILE_BYTES, Links::Refuse) {
            Ok(None) => {}
            Ok(Some(before)) if format.is_ours(&before) => planned.before = Some(before),
            Ok(Some(before)) => {
                planned.notes.push(format!(
                    "`{}` is not npc's; it is left alone (rename the manifest entry, or delete the file to let npc write it)",
                    path.display()
                ));
                planned.after = Some(before.clone());
                planned.before = Some(before);
            }
            Err(e) => planned.error = Some(format!("{e}; it is left alone")),
        }
        out.push(planned);
    }
    out.retain(|p| p.is_change() || p.error.is_some() || !p.notes.is_empty());
    out
}

/// [`plan_folder`], with `failed` (files whose text could not be made)
/// kept as they are: nothing is planned for their paths but the failure.
pub fn plan_folder_with_failures(
    repo: &Root,
    folder: &Path,
    format: Format,
    wanted: &Wanted,
    failed: Vec<Planned>,
) -> Vec<Planned> {
    let mut planned = plan_folder(repo, folder, format, wanted);
    planned.retain(|p| !failed.iter().any(|f| f.path == p.path));
    planned.extend(failed);
    planned
}

/// Helpers for the tests of the modules that plan whole files.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::Path;

    use super::Planned;

    /// The planned files as one text, for snapshots.
    pub fn shown(planned: &[Planned]) -> String {
        let mut shown = String::new();
        for p in planned {
            shown.push_str(&format!(
                "== {} ({})\n{}",
                p.path.display(),
                p.what,
                p.after.as_deref().unwrap_or("<removed>\n")
            ));
        }
        shown
    }

    /// Write each planned file's new text under `dir`.
    pub fn write_all(dir: &Path, planned: &[Planned]) {
        for p in planned {
            let path = dir.join(&p.path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, p.after.as_deref().unwrap()).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(items: &[(&str, &str)]) -> Wanted {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), ("x".to_string(), v.to_string())))
            .collect()
    }

    #[test]
    fn markers_are_recognised_only_at_the_top() {
        let md = Format::markdown("name: a\n", "body");
        assert!(Format::Markdown.is_ours(&md));
        assert!(md.ends_with("---\n\nbody\n"), "{md}");
        assert!(!Format::Markdown.is_ours(&format!("---\nname: a\n{MANAGED_LINE}\n---\n")));
        assert!(!Format::Markdown.is_ours(&format!("---\n{MANAGED_LINE} and more\n")));
        let toml = Format::toml("prompt = \"x\"\n");
        assert!(Format::Toml.is_ours(&toml));
        assert!(!Format::Toml.is_ours(&format!("x = 1\n{MANAGED_LINE}\n")));
    }

    #[test]
    fn npc_files_are_written_replaced_and_removed_user_files_kept() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Root::new(dir.path()).unwrap();
        let folder = Path::new(".claude/commands");
        let a = Format::markdown("description: a\n", "A");
        let plan = plan_folder(&repo, folder, Format::Markdown, &wanted(&[("a", &a)]));
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].before, None);
        std::fs::create_dir_all(dir.path().join(folder)).unwrap();
        std::fs::write(dir.path().join(folder).join("a.md"), &a).unwrap();
        std::fs::write(dir.path().join(folder).join("mine.md"), "---\nx: 1\n---\n").unwrap();
        // Unchanged: nothing planned.
        assert!(plan_folder(&repo, folder, Format::Markdown, &wanted(&[("a", &a)])).is_empty());
        // The user's file of the same name is never touched.
        let mine = plan_folder(&repo, folder, Format::Markdown, &wanted(&[("mine", &a)]));
        let kept = mine.iter().find(|p| p.path.ends_with("mine.md")).unwrap();
        assert!(!kept.is_change());
        assert!(kept.notes[0].contains("not npc's"), "{:?}", kept.notes);
        // Dropped from the manifest: npc's file goes, the user's stays.
        let gone = plan_folder(&repo, folder, Format::Markdown, &Wanted::new());
        assert_eq!(gone.len(), 1);
        assert!(gone[0].path.ends_with("a.md"));
        assert_eq!(gone[0].after, None);
    }

    #[test]
    fn a_folder_linked_out_of_the_repository_is_never_written_or_listed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(
            outside.path().join("x.md"),
            Format::markdown("description: x\n", "X"),
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join(".claude")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join(".claude/commands")).unwrap();
        let repo = Root::new(dir.path()).unwrap();
        let folder = Path::new(".claude/commands");
        // Nothing wanted: the outside file is not seen, so not removed.
        assert!(plan_folder(&repo, folder, Format::Markdown, &Wanted::new()).is_empty());
        let a = Format::markdown("description: a\n", "A");
        let plan = plan_folder(&repo, folder, Format::Markdown, &wanted(&[("a", &a)]));
        assert!(
            plan.iter().all(|p| p.error.is_some() || !p.is_change()),
            "{plan:?}"
        );
        assert!(plan.iter().any(|p| p.error.is_some()), "{plan:?}");
    }

    #[test]
    fn a_folder_past_the_entry_bound_says_so_and_still_plans_what_it_saw() {
        let dir = tempfile::tempdir().unwrap();
        let folder = Path::new(".claude/agents");
        std::fs::create_dir_all(dir.path().join(folder)).unwrap();
        for i in 0..=MAX_FOLDER_ENTRIES {
            std::fs::write(
                dir.path().join(folder).join(format!("u{i:05}.md")),
                "mine\n",
            )
            .unwrap();
        }
        let repo = Root::new(dir.path()).unwrap();
        let a = Format::markdown("description: a\n", "A");
        let plan = plan_folder(&repo, folder, Format::Markdown, &wanted(&[("a", &a)]));
        let note = plan
            .iter()
            .find(|p| p.path == folder)
            .unwrap_or_else(|| panic!("{plan:?}"));
        assert!(!note.is_change());
        assert!(note.notes[0].contains("more than 4096"), "{:?}", note.notes);
        assert!(
            plan.iter()
                .any(|p| p.path.ends_with("a.md") && p.is_change())
        );
    }
}
