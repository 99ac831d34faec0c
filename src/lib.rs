//! sessionless: a gateway that puts a stateless MCP 2026-07-28 front door on
//! legacy, session-based MCP servers. See ARCHITECTURE.md for the request path.
#![forbid(unsafe_code)]

pub mod bridge;
pub mod config;
pub mod demo;
pub mod error;
pub mod front;
pub mod guard;
pub mod metrics;
pub mod park;
pub mod reply;
pub mod seal;
pub mod server;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::Config;

/// A running gateway.
pub struct Running {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    /// Stops accepting, drains open requests (up to the drain timeout), closes
    /// upstream sessions, and waits for all of it.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    /// Waits until the gateway stops (after `shutdown` from another handle).
    pub async fn wait(self) {
        let _ = self.task.await;
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// The MCP endpoint URL of the first route.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

/// Binds the listener and starts the gateway; returns once it accepts connections.
pub async fn run(config: Config) -> std::io::Result<Running> {
    let listener = TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let gateway = Arc::new(server::Gateway::new(config, shutdown.clone()));
    let reaper = tokio::spawn(gateway.legacy().pool().clone().run_reaper(shutdown.clone()));
    let flow_reaper = tokio::spawn(gateway.legacy().clone().run_flow_reaper(shutdown.clone()));
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        server::serve(gateway, listener, token).await;
        let _ = reaper.await;
        let _ = flow_reaper.await;
    });
    Ok(Running {
        addr,
        shutdown,
        task,
    })
}
