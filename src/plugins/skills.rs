//! Agent Skills in a package: `skills/<name>/SKILL.md`, one level deep
//! only (§6.1). A `SKILL.md` starts with YAML frontmatter between `---`
//! lines holding `name` (1–64 characters `a-z`, `0-9`, `-`, no leading,
//! trailing or doubled `-`, equal to its folder's name) and `description`
//! (1–1024 characters); `license`, `compatibility` (≤ 500 characters),
//! `metadata` and `allowed-tools` are optional. A folder without `SKILL.md`
//! is not a skill, and a `SKILL.md` deeper than one level is not one
//! either: both are reported as warnings and ignored. A missing `skills/`
//! is not an error (§6.2). Every walk here is bounded.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::{Problem, Problems, SKILLS_DIR, pointer};
use crate::model::diagnostics::clip;
use crate::repofs::{Links, Root};

/// The file that makes a folder a skill.
pub const SKILL_FILE: &str = "SKILL.md";
/// Most entries of `skills/` looked at.
pub const MAX_SKILL_ENTRIES: usize = 1024;
/// Largest `SKILL.md` read.
pub const MAX_SKILL_BYTES: usize = 256 * 1024;
/// Largest frontmatter parsed (the text between the `---` lines).
pub const MAX_FRONTMATTER_BYTES: usize = 64 * 1024;
/// How deep below a skill folder nested `SKILL.md` files are looked for.
pub const MAX_NESTED_DEPTH: usize = 4;
/// Most directory entries looked at while looking for nested `SKILL.md` files.
pub const MAX_NESTED_ENTRIES: usize = 4096;
/// Longest `name`.
pub const MAX_NAME_CHARS: usize = 64;
/// Longest `description`.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
/// Longest `compatibility`.
pub const MAX_COMPATIBILITY_CHARS: usize = 500;
/// The frontmatter fields the Agent Skills format defines.
const FIELDS: [&str; 6] = [
    "name",
    "description",
    "license",
    "compatibility",
    "metadata",
    "allowed-tools",
];

/// One valid skill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skill {
    pub name: String,
    pub description: String,
    /// The skill's folder, relative to the package root (`skills/<name>`).
    pub dir: String,
}

/// Names of the entries of directory `rel` inside `root`, sorted, at most `limit`.
fn entries(root: &Root, rel: &Path, limit: usize) -> Option<Vec<String>> {
    let real = root.real_path(rel).ok()?;
    let mut names: Vec<String> = std::fs::read_dir(real)
        .ok()?
        .take(limit)
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    Some(names)
}

pub(crate) fn read(root: &Root, problems: &mut Problems) -> Vec<Skill> {
    let dir = Path::new(SKILLS_DIR);
    if !root.is_dir(dir) {
        return Vec::new();
    }
    let Some(names) = entries(root, dir, MAX_SKILL_ENTRIES + 1) else {
        return Vec::new();
    };
    if names.len() > MAX_SKILL_ENTRIES {
        problems.push(Problem::warning(
            SKILLS_DIR,
            "",
            format!("holds more than {MAX_SKILL_ENTRIES} entries; only the first are read"),
        ));
    }
    let mut budget = MAX_NESTED_ENTRIES;
    let mut skills = Vec::new();
    for name in names.into_iter().take(MAX_SKILL_ENTRIES) {
        let folder = dir.join(&name);
        if name.starts_with('.') || !root.is_dir(&folder) {
            continue;
        }
        let file = folder.join(SKILL_FILE);
        let shown = file.to_string_lossy().into_owned();
        nested(root, &folder, 1, &mut budget, problems);
        match root.read_existing(&file, MAX_SKILL_BYTES, Links::Follow) {
            Ok(None) => problems.push(
                Problem::warning(
                    &format!("{SKILLS_DIR}/{name}"),
                    "",
                    format!(
                        "`{SKILLS_DIR}/{}` has no `{SKILL_FILE}`; it is not a skill and is ignored",
                        clip(&name)
                    ),
                )
                .hint(format!(
                    "add `{SKILLS_DIR}/{}/{SKILL_FILE}` with `name` and `description` frontmatter",
                    clip(&name)
                )),
            ),
            Ok(Some(text)) => {
                if let Some(skill) = parse(&shown, &name, &text, problems) {
                    skills.push(skill);
                }
            }
            Err(e) => problems.push(Problem::error(
                &shown,
                "",
                format!("cannot be read: {}", e.reason),
            )),
        }
    }
    skills
}

/// Report `SKILL.md` files below `folder` (depth ≥ 1 under the skill's own).
fn nested(root: &Root, folder: &Path, depth: usize, budget: &mut usize, problems: &mut Problems) {
    if depth > MAX_NESTED_DEPTH || *budget == 0 {
        return;
    }
    let Some(names) = entries(root, folder, *budget) else {
        return;
    };
    *budget = budget.saturating_sub(names.len());
    for name in names {
        let path = folder.join(&name);
        if !root.is_dir(&path) {
            continue;
        }
        let inner = path.join(SKILL_FILE);
        if super::exists(root, &inner) {
            problems.push(
                Problem::warning(
                    &inner.to_string_lossy(),
                    "",
                    "a nested `SKILL.md` is not a skill; it is ignored",
                )
                .hint(format!(
                    "skills are `{SKILLS_DIR}/<name>/{SKILL_FILE}`, one level deep; move it up"
                )),
            );
        }
        nested(root, &path, depth + 1, budget, problems);
    }
}

/// The frontmatter of a `SKILL.md`: the YAML between the first two `---` lines.
fn frontmatter(text: &str) -> Option<&str> {
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))?;
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Some(&rest[..offset]);
        }
        offset += line.len();
    }
    None
}

fn parse(file: &str, folder: &str, text: &str, problems: &mut Problems) -> Option<Skill> {
    let hint =
        "start `SKILL.md` with `---`, then `name: ...` and `description: ...` lines, then `---`";
    let Some(yaml) = frontmatter(text) else {
        problems
            .push(Problem::error(file, "", "has no frontmatter between `---` lines").hint(hint));
        return None;
    };
    if yaml.len() > MAX_FRONTMATTER_BYTES {
        problems.push(Problem::error(
            file,
            "",
            format!("frontmatter is larger than {MAX_FRONTMATTER_BYTES} bytes"),
        ));
        return None;
    }
    let value: Value = match serde_norway::from_str(yaml) {
        Ok(v) => v,
        Err(e) => {
            problems.push(
                Problem::error(
                    file,
                    "",
                    format!("frontmatter is not valid YAML: {}", clip(&e.to_string())),
                )
                .hint(hint),
            );
            return None;
        }
    };
    let Some(map) = value.as_object() else {
        problems.push(
            Problem::error(file, "", "frontmatter must be a mapping of keys to values").hint(hint),
        );
        return None;
    };
    let mut ok = true;
    for key in map.keys().filter(|k| !FIELDS.contains(&k.as_str())) {
        problems.push(
            Problem::warning(file, pointer(&[key]), format!("unknown frontmatter field `{}` is ignored", clip(key)))
                .hint("Agent Skills define `name`, `description`, `license`, `compatibility`, `metadata` and `allowed-tools`"),
        );
    }
    let mut string = |key: &str, required: bool, max: usize| -> Option<String> {
        match map.get(key) {
            None if required => {
                problems.push(Problem::error(
                    file,
                    pointer(&[key]),
                    format!("`{key}` is required"),
                ));
                ok = false;
                None
            }
            None => None,
            Some(Value::String(s)) if (1..=max).contains(&s.chars().count()) => Some(s.clone()),
            Some(Value::String(_)) => {
                problems.push(Problem::error(
                    file,
                    pointer(&[key]),
                    format!("`{key}` must be 1 to {max} characters"),
                ));
                ok = false;
                None
            }
            Some(_) => {
                problems.push(Problem::error(
                    file,
                    pointer(&[key]),
                    format!("`{key}` must be a string"),
                ));
                ok = false;
                None
            }
        }
    };
    let name = string("name", true, MAX_NAME_CHARS);
    let description = string("description", true, MAX_DESCRIPTION_CHARS);
    string("license", false, usize::MAX);
    string("compatibility", false, MAX_COMPATIBILITY_CHARS);
    string("allowed-tools", false, usize::MAX);
    if map.get("metadata").is_some_and(|m| !m.is_object()) {
        problems.push(Problem::error(
            file,
            "/metadata",
            "`metadata` must be a mapping",
        ));
        ok = false;
    }
    if let Some(n) = &name {
        if !valid_name(n) {
            problems.push(
                Problem::error(
                    file,
                    "/name",
                    format!("`{}` is not a valid skill name", clip(n)),
                )
                .hint("use `a-z`, `0-9` and single inner `-`, such as `review-checklist`"),
            );
            ok = false;
        } else if n != folder {
            problems.push(
                Problem::error(
                    file,
                    "/name",
                    format!("`{}` differs from its folder `{}`", clip(n), clip(folder)),
                )
                .hint("rename the folder or the skill so both match"),
            );
            ok = false;
        }
    }
    if !ok {
        return None;
    }
    Some(Skill {
        name: name?,
        description: description?,
        dir: PathBuf::from(SKILLS_DIR)
            .join(folder)
            .to_string_lossy()
            .into_owned(),
    })
}

/// Agent Skills names: `a-z`, `0-9`, `-`; no leading, trailing or doubled `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontmatter_is_the_text_between_the_fences() {
        assert_eq!(frontmatter("---\nname: a\n---\nbody"), Some("name: a\n"));
        assert_eq!(
            frontmatter("---\r\nname: a\r\n---\r\n"),
            Some("name: a\r\n")
        );
        assert_eq!(frontmatter("---\n---\n"), Some(""));
        assert_eq!(frontmatter("name: a\n"), None);
        assert_eq!(frontmatter("---\nname: a\n"), None);
    }

    #[test]
    fn skill_names() {
        for good in ["a", "review-checklist", "x9"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "-a", "a-", "a--b", "A", "a_b", "a.b"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
