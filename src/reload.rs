//! What starts a reload: `SIGHUP` (the binary's signal handler calls
//! [`Reloader::reload`]) and changes to the routing file, watched with
//! `notify` (inotify). The watch is on the file's directory, so that an
//! editor's write-and-rename and a Kubernetes ConfigMap's symlink swap
//! (`..data`) are seen; a burst of events becomes one reload.
//!
//! A file that does not parse or validate is rejected, logged and counted
//! (`sessionless_config_reloads_total{outcome="rejected"}`); the running
//! configuration stays. Reading the files and building the next
//! configuration run on tokio's blocking threads, so requests (and
//! `/healthz`) are answered meanwhile, whatever the files hold.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::live::Reloaded;
use crate::server::Gateway;

/// Where the running configuration came from.
#[derive(Debug, Clone)]
pub struct Source {
    pub path: PathBuf,
    /// `--listen` from the command line, which wins over the file's.
    pub listen: Option<SocketAddr>,
    /// Whether a change to the file reloads it (else only `SIGHUP` and
    /// [`Reloader::reload`] do).
    pub watch: bool,
}

impl Source {
    /// Reads and validates the file (secrets included). Blocks: see
    /// [`Source::load_off_runtime`].
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut config = Config::from_file(&self.path)?;
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        Ok(config)
    }

    /// [`Source::load`] on a blocking thread: a key file of 100,000 lines
    /// or a slow disk holds no async worker.
    pub async fn load_off_runtime(&self) -> Result<Config, ConfigError> {
        let source = self.clone();
        tokio::task::spawn_blocking(move || source.load())
            .await
            .unwrap_or_else(|e| Err(ConfigError(format!("loading the configuration failed: {e}"))))
    }
}

/// Reloads a gateway from its source.
#[derive(Clone)]
pub struct Reloader {
    gateway: Arc<Gateway>,
    source: Source,
    /// One reload at a time, from reading the file to the swap: a file read
    /// earlier never lands after one read later.
    one: Arc<tokio::sync::Mutex<()>>,
}

impl Reloader {
    pub fn new(gateway: Arc<Gateway>, source: Source) -> Reloader {
        Reloader { gateway, source, one: Arc::default() }
    }

    /// Whether changes to the file reload it.
    pub fn watches(&self) -> bool {
        self.source.watch
    }

    /// Reads the file again and applies it, or keeps the running
    /// configuration and says why. Logs the outcome either way.
    pub async fn reload(&self, why: &str) -> Result<Reloaded, String> {
        let _one = self.one.lock().await;
        let outcome = match self.source.load_off_runtime().await {
            Ok(config) => self.gateway.reload(config).await,
            Err(e) => {
                self.gateway.reload_failed(&e.0);
                Err(e.0)
            }
        };
        match &outcome {
            Ok(report) if report.needs_restart.is_empty() => {
                tracing::info!(%why, %report, "configuration reloaded")
            }
            Ok(report) => tracing::warn!(%why, %report, "configuration reloaded, in part"),
            Err(e) => tracing::error!(%why, error = %e, "configuration rejected; the running one stays"),
        }
        outcome
    }

    /// Watches the file until `stop`: each burst of changes to it (or to
    /// the directory entries a ConfigMap swaps) is one reload.
    pub async fn watch(self, stop: CancellationToken) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        let file = self.source.path.file_name().map(ToOwned::to_owned);
        let dir = watched_dir(&self.source.path);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            let relevant = event.paths.iter().any(|p| {
                let name = p.file_name();
                name == file.as_deref() || name.is_some_and(|n| n.to_string_lossy().starts_with(".."))
            });
            if relevant && !event.kind.is_access() {
                // Full: a reload is pending already, which will read the file as it is then.
                let _ = tx.try_send(());
            }
        });
        let mut watcher = match watcher {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the configuration file; reload with SIGHUP");
                return;
            }
        };
        if let Err(e) = notify::Watcher::watch(&mut watcher, &dir, notify::RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the configuration's directory; reload with SIGHUP");
            return;
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                event = rx.recv() => if event.is_none() { return },
            }
            // Editors and ConfigMaps change a file in several steps.
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(SETTLE) => {}
            }
            while rx.try_recv().is_ok() {}
            let _ = self.reload("file changed").await;
        }
    }
}

/// The directory holding `path` (the current one for a bare file name).
fn watched_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// How long a burst of file events settles before the reload.
const SETTLE: Duration = Duration::from_millis(250);
