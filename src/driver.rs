//! The reconciler's component contract: what every component kind
//! implements ([`Driver`]: start, change in place, stop) and what it may use
//! ([`DriverContext`]); [`child_spec`] turns a manifest command into what
//! the supervisor runs. A kind implements [`TypedDriver`], over the config
//! of its own kind ([`KindConfig`]) with plain `async fn`s; the blanket
//! [`Driver`] impl boxes its futures and hands it its config, or answers
//! [`DriverError::WrongConfig`], so no driver downcasts by hand. The runtime drives components only through this
//! contract, and implementors (the MCP and trigger drivers, `panes::PaneHost`)
//! depend on it, never on the runtime.
//!
//! Architecture invariant: this room knows no component kind's insides and
//! nothing above it; a kind's own error reaches the runtime as
//! [`DriverError::Component`], in the kind's words.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::future::Future;

use futures_util::future::BoxFuture;

use crate::model::{CommandSpec, RestartPolicy};
use crate::plan::{ComponentId, Config};
use crate::supervisor::{
    ChildSpec, InputWiring, OutputWiring, StdioSpec, Supervisor, SupervisorError, log_path,
};

/// How long a started child must stay up before its start counts as good.
pub const READY_GRACE: Duration = Duration::from_millis(300);
/// Time between SIGTERM and SIGKILL when stopping a component's process.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// What drivers may use.
#[derive(Debug, Clone)]
pub struct DriverContext {
    pub repo: PathBuf,
    pub state_dir: PathBuf,
    pub supervisor: Supervisor,
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(transparent)]
    Supervisor(#[from] SupervisorError),
    #[error("`{id}` was given a config of another kind")]
    WrongConfig { id: String },
    /// A kind's own failure (a trigger's, …), in its own words.
    #[error(transparent)]
    Component(Box<dyn std::error::Error + Send + Sync>),
}

/// One component kind's behaviour.
pub trait Driver: Send + Sync {
    /// Bring the component up with `config`. Returns its pid when it is a process.
    fn start<'a>(
        &'a self,
        cx: &'a DriverContext,
        id: &'a ComponentId,
        config: &'a Config,
    ) -> BoxFuture<'a, Result<Option<u32>, DriverError>>;

    /// Apply a live change. The default records it (the new config is read
    /// at the next use).
    fn update<'a>(
        &'a self,
        _cx: &'a DriverContext,
        _id: &'a ComponentId,
        _old: &'a Config,
        _new: &'a Config,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async { Ok(()) })
    }

    /// Take the component down.
    fn stop<'a>(
        &'a self,
        cx: &'a DriverContext,
        id: &'a ComponentId,
    ) -> BoxFuture<'a, Result<(), DriverError>>;
}

/// The config of one component kind, taken out of a [`Config`]: what a
/// [`TypedDriver`] is given.
pub trait KindConfig: Sync {
    /// `config`, if it is of this kind.
    fn of(config: &Config) -> Option<&Self>;
}

/// Every kind's config: for a driver that serves several kinds.
impl KindConfig for Config {
    fn of(config: &Config) -> Option<&Self> {
        Some(config)
    }
}

macro_rules! kind_config {
    ($($variant:ident($ty:ty)),+ $(,)?) => {$(
        impl KindConfig for $ty {
            fn of(config: &Config) -> Option<&Self> {
                match config {
                    Config::$variant(c) => Some(c),
                    _ => None,
                }
            }
        }
    )+};
}

kind_config!(
    McpServer(crate::model::McpServer),
    Trigger(crate::model::Trigger),
    Pane(crate::model::Pane),
    PanePlugin(crate::model::PanePlugin),
);

/// A component kind's behaviour over its own config: what a kind
/// implements; the [`Driver`] the runtime holds comes with it.
pub trait TypedDriver: Send + Sync {
    /// The config this driver is given.
    type Config: KindConfig + ?Sized;

    /// Start `id`; its pid when it runs as one process.
    fn start(
        &self,
        cx: &DriverContext,
        id: &ComponentId,
        config: &Self::Config,
    ) -> impl Future<Output = Result<Option<u32>, DriverError>> + Send;

    /// Change `id` in place from `old` to `new` (nothing, unless a kind
    /// says otherwise).
    fn update(
        &self,
        _cx: &DriverContext,
        _id: &ComponentId,
        _old: &Self::Config,
        _new: &Self::Config,
    ) -> impl Future<Output = Result<(), DriverError>> + Send {
        async { Ok(()) }
    }

    /// Stop `id` and forget it.
    fn stop(
        &self,
        cx: &DriverContext,
        id: &ComponentId,
    ) -> impl Future<Output = Result<(), DriverError>> + Send;
}

/// The config of `id`'s kind in `config`, or [`DriverError::WrongConfig`]
/// (for a driver of several kinds, which takes them as [`Config`]).
pub fn kind_config<'a, C: KindConfig + ?Sized>(
    id: &ComponentId,
    config: &'a Config,
) -> Result<&'a C, DriverError> {
    C::of(config).ok_or_else(|| DriverError::WrongConfig { id: id.to_string() })
}

impl<T: TypedDriver> Driver for T {
    fn start<'a>(
        &'a self,
        cx: &'a DriverContext,
        id: &'a ComponentId,
        config: &'a Config,
    ) -> BoxFuture<'a, Result<Option<u32>, DriverError>> {
        Box::pin(async move { TypedDriver::start(self, cx, id, kind_config(id, config)?).await })
    }

    fn update<'a>(
        &'a self,
        cx: &'a DriverContext,
        id: &'a ComponentId,
        old: &'a Config,
        new: &'a Config,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let (old, new) = (kind_config(id, old)?, kind_config(id, new)?);
            TypedDriver::update(self, cx, id, old, new).await
        })
    }

    fn stop<'a>(
        &'a self,
        cx: &'a DriverContext,
        id: &'a ComponentId,
    ) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(TypedDriver::stop(self, cx, id))
    }
}

/// Start `id`'s child from `spec` and wait until it counts as up; its pid.
/// A record left by an earlier run of this id (stopped or failed) is
/// replaced.
pub async fn start_child(
    cx: &DriverContext,
    id: &ComponentId,
    spec: ChildSpec,
) -> Result<u32, DriverError> {
    let key = id.to_string();
    let _ = cx.supervisor.remove(&key).await;
    Ok(cx
        .supervisor
        .start_and_wait_ready(&key, spec, READY_GRACE)
        .await?)
}

/// Stop `id`'s child, if it has one, and forget it.
pub async fn stop_child(cx: &DriverContext, id: &ComponentId) -> Result<(), DriverError> {
    let key = id.to_string();
    if cx.supervisor.status(&key).is_some() {
        cx.supervisor.remove(&key).await?;
    }
    Ok(())
}

/// Resolve a command spec to what the supervisor runs. Secrets are exposed
/// here, and only here, because the child needs their values.
pub fn child_spec(
    cx: &DriverContext,
    id: &ComponentId,
    command: &CommandSpec,
    restart: RestartPolicy,
) -> ChildSpec {
    let cwd = command
        .cwd
        .as_ref()
        .map_or_else(|| cx.repo.clone(), |c| cx.repo.join(c.expose()));
    let log = log_path(&cx.state_dir, &id.to_string());
    ChildSpec {
        program: resolve_program(&cx.repo, &command.command),
        args: command
            .args
            .iter()
            .map(|a| a.expose().to_string())
            .collect(),
        env: command
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_string()))
            .collect(),
        cwd,
        restart,
        stop_grace: STOP_GRACE,
        // stdin stays open (a closed stdin ends most protocol children);
        // output goes to the component's log so nothing blocks.
        stdio: StdioSpec {
            stdin: InputWiring::Piped,
            stdout: OutputWiring::AppendTo(log.clone()),
            stderr: OutputWiring::AppendTo(log),
        },
        sandbox: None,
    }
}

/// A relative program path with a slash (`./bin/x`) is relative to the repository.
fn resolve_program(repo: &Path, program: &str) -> String {
    if program.contains('/') && !Path::new(program).is_absolute() {
        repo.join(program).display().to_string()
    } else {
        program.to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::model::Hook;
    use crate::plan::Kind;
    use crate::supervisor::BackoffPolicy;

    impl KindConfig for Vec<Hook> {
        fn of(config: &Config) -> Option<&Self> {
            match config {
                Config::Hooks(h) => Some(h),
                _ => None,
            }
        }
    }

    /// Records the hook counts it was given.
    #[derive(Default)]
    struct Counting(Mutex<Vec<usize>>);

    impl TypedDriver for Counting {
        type Config = Vec<Hook>;

        async fn start(
            &self,
            _: &DriverContext,
            _: &ComponentId,
            hooks: &Vec<Hook>,
        ) -> Result<Option<u32>, DriverError> {
            crate::stdx::lock(&self.0).push(hooks.len());
            Ok(Some(7))
        }

        async fn stop(&self, _: &DriverContext, _: &ComponentId) -> Result<(), DriverError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_typed_driver_gets_its_own_config_and_refuses_another_kind() {
        let (events, _rx) = tokio::sync::mpsc::unbounded_channel();
        let cx = DriverContext {
            repo: PathBuf::from("/nonexistent"),
            state_dir: PathBuf::from("/nonexistent/.npc"),
            supervisor: Supervisor::new(events, BackoffPolicy::default()),
        };
        let id = ComponentId::new(Kind::Hooks, "hooks");
        let driver = Counting::default();
        let as_driver: &dyn Driver = &driver;
        let pid = as_driver.start(&cx, &id, &Config::Hooks(Vec::new())).await;
        assert_eq!(pid.unwrap(), Some(7));
        assert_eq!(*crate::stdx::lock(&driver.0), [0]);
        let other = Config::Hooks(Vec::new());
        as_driver.update(&cx, &id, &other, &other).await.unwrap();
        let wrong = as_driver
            .start(
                &cx,
                &id,
                &Config::Project(crate::model::Project {
                    name: None,
                    state_dir: ".npc".into(),
                }),
            )
            .await;
        assert!(
            matches!(wrong, Err(DriverError::WrongConfig { ref id }) if id == "hooks.hooks"),
            "{wrong:?}"
        );
        assert_eq!(crate::stdx::lock(&driver.0).len(), 1, "never started");
    }
}
