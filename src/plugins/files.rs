//! The loader's file system with plugin packages: [`PackageFiles`] reads
//! like `disk::DiskFiles` and also checks each package a manifest declares
//! (`crate::plugins::validate`, through the guarded layer at the package
//! root) and resolves it into the model's [`PackageView`]; it joins the
//! user registry's plugins too. [`load_path`] is the one loader every
//! command and the daemon use, so all of them see the same plugins.

use std::path::Path;

use crate::disk::{DiskFiles, load_path_with};
use crate::model::package::{PackageContents, PackageProblem, PackageView};
use crate::model::{Env, Files, Loaded, Manifest, PluginNotice, PluginSource};

/// [`DiskFiles`] plus plugin packages and the user registry.
#[derive(Debug, Clone)]
pub struct PackageFiles {
    pub disk: DiskFiles,
}

impl PackageFiles {
    /// Files relative to the manifest directory `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            disk: DiskFiles::new(root),
        }
    }
}

impl Files for PackageFiles {
    fn read_to_string(&self, path: &Path) -> std::io::Result<String> {
        self.disk.read_to_string(path)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.disk.is_dir(path)
    }
    fn is_git_repository(&self) -> Option<bool> {
        self.disk.is_git_repository()
    }
    fn check_dir(&self, path: &Path) -> std::io::Result<()> {
        self.disk.check_dir(path)
    }
    fn package(&self, entry: &str, dir: &Path) -> Option<PackageView> {
        let package = self
            .disk
            .guarded()
            .and_then(|root| root.sub_root(dir))
            .ok()?;
        Some(view(entry, &super::validate_root(&package)))
    }
    fn add_user_plugins(&self, manifest: &mut Manifest) {
        match super::resolve::registered() {
            Ok(users) => {
                super::resolve::user_plugins(manifest, &users, &|path| super::validate(path).ok())
            }
            Err(reason) => manifest.plugin_notices.push(PluginNotice::Dropped {
                id: "*".into(),
                source: PluginSource::User,
                path: super::registry::path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                reason,
            }),
        }
    }
}

/// Package `report` of plugin `entry` as the loader sees it.
pub fn view(entry: &str, report: &super::Report) -> PackageView {
    let contents =
        report
            .package
            .as_ref()
            .map(|pkg| match super::data::dir_of(&pkg.manifest.name) {
                Ok(data) => {
                    let (servers, skipped) = super::resolve::servers(entry, pkg, &data);
                    PackageContents::Resolved {
                        servers,
                        skipped,
                        parts: super::resolve::parts(pkg, &data),
                    }
                }
                Err(e) => PackageContents::NoDataDir {
                    reason: e.to_string(),
                    runs_something: !pkg.servers.is_empty()
                        || pkg.hooks.as_ref().is_some_and(|h| !h.is_empty()),
                },
            });
    PackageView {
        problems: report
            .problems
            .iter()
            .map(|p| PackageProblem {
                error: p.is_error(),
                place: p.place(),
                message: p.message.clone(),
                hint: p.hint.clone(),
            })
            .collect(),
        omitted: report.omitted,
        omitted_errors: report.omitted_errors,
        contents,
    }
}

/// Load the manifest at `path` with its plugin packages checked and the
/// user registry's plugins joined (see [`PackageFiles`]); files it
/// references resolve against its directory.
pub fn load_path(path: &Path, env: &dyn Env) -> std::io::Result<Loaded> {
    let files = PackageFiles::new(path.parent().unwrap_or(Path::new("")));
    load_path_with(path, env, &files)
}
