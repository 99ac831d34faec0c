//! The `sessionless` command: arguments, runtime, signals.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use base64::Engine;
use clap::{Parser, Subcommand, ValueEnum};
use rand::RngCore;
use sessionless::config::{Config, DEFAULT_LISTEN};

/// Measured in bench/run.sh: less CPU per request than glibc malloc at a
/// small cost in resident memory (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A gateway that lets MCP 2026-07-28 (stateless) clients use legacy,
/// session-based MCP servers.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    /// The upstream MCP endpoint, e.g. http://127.0.0.1:9000/mcp (served at /mcp; its generation probed).
    #[arg(long, value_name = "URL", conflicts_with = "config")]
    upstream: Option<String>,
    /// A TOML routing file (see config/); exclusive with --upstream.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080, or the file's server.listen].
    #[arg(long, value_name = "ADDR", value_parser = sessionless::config::listen_address)]
    listen: Option<SocketAddr>,
    /// Log lines on stderr: `text`, or `json` (one object a line).
    #[arg(long, value_enum, env = "SESSIONLESS_LOG_FORMAT", default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// One access line per request (route, method, cell, outcome, status,
    /// duration, request id, trace id) in the log format. Off by default:
    /// it costs CPU per request (BENCHMARKS.md).
    #[arg(long, env = "SESSIONLESS_ACCESS_LOG", global = true)]
    access_log: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Runs the gateway in front of a small built-in legacy MCP server, for a first try.
    Demo {
        /// Address for the gateway.
        #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN, value_parser = sessionless::config::listen_address)]
        listen: SocketAddr,
    },
    /// Runs only the built-in MCP server (endpoint /mcp): legacy by default.
    DemoUpstream {
        /// Address to listen on.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9000", value_parser = sessionless::config::listen_address)]
        listen: SocketAddr,
        /// The protocol it speaks: legacy (2025 sessions) or modern (2026-07-28 only, stateless).
        #[arg(long, value_enum, default_value_t = DemoGeneration::Legacy)]
        generation: DemoGeneration,
    },
    /// Prints a fresh random sealing key (base64url, 32 bytes) for an env var or key file.
    GenKey,
    /// Prints a fresh random API key for `ID` (line 1, for the client) and its
    /// line for an `api_key` policy's keys_file (line 2: the id and the key's SHA-256).
    HashKey {
        /// The key id (the principal is `key:<ID>`).
        id: String,
    },
    /// Validates a routing file offline (no key, secret or TLS file needed) and prints
    /// its routing table and the environment variables and files it needs at run time.
    CheckConfig {
        /// The TOML routing file.
        file: PathBuf,
        /// Also asks each upstream which protocol generation it speaks
        /// (a `server/discover` probe; a session it mints is deleted).
        #[arg(long)]
        probe: bool,
    },
    /// Exits 0 when URL answers 2xx within 5 s, else 1: a container health check
    /// (`sessionless health http://127.0.0.1:8080/healthz`) where there is no curl.
    Health {
        /// The URL to GET (http).
        url: String,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum DemoGeneration {
    Legacy,
    Modern,
}

/// Errors are printed as one line of words (the cause chain joined), never
/// with a backtrace, whatever `RUST_BACKTRACE` says: they are the user's to
/// fix, not the program's.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sessionless: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes to stdout (`println!` would panic on a closed pipe).
fn write_out(text: std::fmt::Arguments) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_fmt(text).and_then(|()| out.flush())
}

/// A one-shot command's output. A reader that closed the pipe
/// (`check-config FILE | head`) ends the program as it ends any Unix
/// filter: quietly, with the status of a SIGPIPE death (141), which a shell's
/// `pipefail` sees, rather than with a panic or a success it did not earn.
fn say(text: std::fmt::Arguments) {
    if let Err(e) = write_out(text) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("sessionless: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// How long the runtime's blocking threads (a DNS lookup, say) may hold the
/// exit once the gateway has stopped.
const RUNTIME_EXIT: std::time::Duration = std::time::Duration::from_secs(1);

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    logging(cli.log_format, cli.access_log);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let done = command(cli, &runtime);
    runtime.shutdown_timeout(RUNTIME_EXIT);
    done
}

fn command(cli: Cli, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::GenKey) => {
            let mut key = [0u8; 32];
            rand::thread_rng().fill_bytes(&mut key);
            say(format_args!("{}\n", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key)));
            Ok(())
        }
        Some(Command::HashKey { id }) => {
            let mut key = [0u8; 32];
            rand::thread_rng().fill_bytes(&mut key);
            let key = format!("sk-{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key));
            sessionless::auth::keys::check_id(&id).map_err(|e| anyhow::anyhow!("key id `{id}`: {e}"))?;
            say(format_args!("{key}\n{}\n", sessionless::auth::keys::file_line(&id, &key)));
            Ok(())
        }
        Some(Command::CheckConfig { file, probe }) => {
            let checked = sessionless::config::Checked::from_file(&file)?;
            // What the gateway builds from the file (TLS, JWKS files), built offline.
            sessionless::live::check(checked.file_only())
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            say(format_args!("{}: ok\n", file.display()));
            say(format_args!("{}", checked.report()));
            if probe {
                let config = checked.file_only();
                let found =
                    runtime.block_on(sessionless::probe_upstreams(config)).map_err(anyhow::Error::msg)?;
                for r in &found {
                    say(format_args!("{} -> {} ({}): {}\n", r.route, r.upstream, r.at, r.found));
                }
                let unusable = found.iter().filter(|r| !r.usable).count();
                if unusable > 0 {
                    bail!("{unusable} upstream(s) cannot be used (above: what each answered)");
                }
            }
            Ok(())
        }
        Some(Command::Health { url }) => {
            let status = runtime.block_on(health(&url))?;
            if !status.is_success() {
                bail!("{url}: {status}");
            }
            say(format_args!("{url}: {status}\n"));
            Ok(())
        }
        Some(Command::DemoUpstream { listen, generation }) => {
            runtime.block_on(demo_upstream(listen, generation))
        }
        Some(Command::Demo { listen }) => runtime.block_on(demo(listen)),
        None => {
            let (config, source) = match (&cli.upstream, &cli.config) {
                (Some(url), None) => {
                    (Config::single(url, cli.listen.unwrap_or(DEFAULT_LISTEN.parse()?))?, None)
                }
                (None, Some(file)) => {
                    let source =
                        sessionless::reload::Source { path: file.clone(), listen: cli.listen, watch: true };
                    (source.load()?, Some(source))
                }
                _ => bail!("give --upstream URL or --config FILE (see --help)"),
            };
            runtime.block_on(gateway(config, source))
        }
    }
}

/// Logs on stderr, without colour codes unless stderr is a terminal. The
/// access line per request (target `sessionless::access`) only with
/// `access_log`; `SESSIONLESS_LOG` replaces the default filter (and
/// `sessionless::access=info` in it turns the access line on).
fn logging(format: LogFormat, access_log: bool) {
    use std::io::IsTerminal;
    let default = if access_log { "info" } else { "info,sessionless::access=off" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("SESSIONLESS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => fmt.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => fmt.json().flatten_event(true).with_current_span(false).with_ansi(false).init(),
    }
}

async fn gateway(config: Config, source: Option<sessionless::reload::Source>) -> anyhow::Result<()> {
    // Before anything can be started or printed: a signal from then on drains.
    let signals = Signals::new().context("signal handlers")?;
    let urls = |r: &sessionless::config::Route| match &r.upstream.stdio {
        Some(command) => format!("stdio: {}", command.describe()),
        None => r.upstream.urls.iter().map(ToString::to_string).collect::<Vec<_>>().join(" "),
    };
    let routes: Vec<String> = config.routes.iter().map(|r| format!("{} -> {}", r.path, urls(r))).collect();
    let running = match source {
        // Reloaded when the file changes, and on SIGHUP.
        Some(source) => sessionless::run_from(source).await.map_err(|e| anyhow::anyhow!(e)),
        None => sessionless::run(config).await.map_err(Into::into),
    }
    .context("cannot start the gateway")?;
    #[cfg(unix)]
    if let Some(reloader) = running.reloader() {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                let _ = reloader.reload("SIGHUP").await;
            }
        });
    }
    eprintln!("sessionless listening on http://{} ({})", running.addr, routes.join(", "));
    if let Some(internal) = running.internal_addr {
        eprintln!("sessionless internal listener (cluster) on {internal}");
    }
    tokio::spawn(stop_on_signals(signals, running.stopper()));
    running.wait().await;
    eprintln!("sessionless: stopped");
    Ok(())
}

/// The first SIGINT or SIGTERM starts the drain and says what it waits
/// for; a second one stops now (every step after the drain cut to a second
/// at most); a third exits at once, whatever is left.
async fn stop_on_signals(mut signals: Signals, stopper: sessionless::Stopper) {
    signals.next().await;
    let draining = stopper.begin();
    eprintln!("sessionless: {draining}; press Ctrl-C again (or send SIGTERM) to stop now");
    signals.next().await;
    let left = stopper.now();
    match left == Default::default() {
        true => eprintln!("sessionless: stopping now"),
        false => eprintln!(
            "sessionless: stopping now; left undrained: {left} (paused calls are declined upstream)"
        ),
    }
    signals.next().await;
    eprintln!("sessionless: exiting at once (third signal); the shutdown was not finished");
    std::process::exit(130);
}

async fn health(url: &str) -> anyhow::Result<http::StatusCode> {
    let uri: http::Uri = url.parse().with_context(|| format!("not a URL: {url}"))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let get = client.get(uri);
    let answer = tokio::time::timeout(std::time::Duration::from_secs(5), get).await;
    Ok(answer.with_context(|| format!("{url}: no answer within 5 s"))??.status())
}

async fn demo_upstream(listen: SocketAddr, generation: DemoGeneration) -> anyhow::Result<()> {
    let mut signals = Signals::new().context("signal handlers")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (choose another address with --listen ADDR)"))?;
    let addr = listener.local_addr()?;
    let signal = async move { signals.next().await };
    match generation {
        DemoGeneration::Legacy => {
            eprintln!("sessionless demo upstream (legacy MCP) on http://{addr}/mcp");
            sessionless::demo::serve(listener, signal).await?;
        }
        DemoGeneration::Modern => {
            eprintln!("sessionless demo upstream (MCP 2026-07-28, stateless) on http://{addr}/mcp");
            let modern = sessionless::demo::Generation::Modern;
            sessionless::demo::serve_generation(listener, signal, modern).await?;
        }
    }
    Ok(())
}

async fn demo(listen: SocketAddr) -> anyhow::Result<()> {
    let signals = Signals::new().context("signal handlers")?;
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let upstream_url = format!("http://{}/mcp", upstream.local_addr()?);
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    let demo = tokio::spawn(sessionless::demo::serve(upstream, async move { stopped.cancelled().await }));
    let mut config = Config::single(&upstream_url, listen)?;
    // A demo stops quickly: its paused calls get a short drain.
    config.drain_timeout = DEMO_DRAIN;
    let running = sessionless::run(config).await.context("cannot start the gateway")?;
    let url = running.url("/mcp");
    // A server keeps serving when no one reads what it prints.
    let _ = write_out(format_args!(
        "sessionless demo: gateway on {url}, built-in legacy server on {upstream_url}\ntry:\n{}\n",
        demo_curls(&url)
    ));
    tokio::spawn(stop_on_signals(signals, running.stopper()));
    running.wait().await;
    eprintln!("sessionless: stopped");
    stop.cancel();
    let _ = demo.await;
    Ok(())
}

fn demo_curls(url: &str) -> String {
    // `extra_meta` goes into `_meta`; `caps` is the declared ClientCapabilities.
    let call = |method: &str, name: Option<&str>, params: &str, extra_meta: &str, caps: &str| {
        let name_header = name.map(|n| format!(" -H 'Mcp-Name: {n}'")).unwrap_or_default();
        format!(
            "  curl -sN {url} -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \\\n    \
             -H 'MCP-Protocol-Version: 2026-07-28' -H 'Mcp-Method: {method}'{name_header} \\\n    \
             -d '{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"{method}\",\"params\":{{{params}\"_meta\":{{{extra_meta}\
             \"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\
             \"io.modelcontextprotocol/clientCapabilities\":{caps}}}}}}}'\n"
        )
    };
    [
        "# what the server offers\n".to_string(),
        call("server/discover", None, "", "", "{}"),
        call("tools/list", None, "", "", "{}"),
        "# a tool call (JSON answer)\n".to_string(),
        call("tools/call", Some("echo"), r#""name":"echo","arguments":{"text":"hello"},"#, "", "{}"),
        "# progress notifications on an SSE answer\n".to_string(),
        call(
            "tools/call",
            Some("slow"),
            r#""name":"slow","arguments":{"steps":3},"#,
            r#""progressToken":"p1","#,
            "{}",
        ),
        "# a question for the user: an input_required round (retry with inputResponses + requestState)\n"
            .to_string(),
        call(
            "tools/call",
            Some("ask_user"),
            r#""name":"ask_user","arguments":{},"#,
            "",
            r#"{"elicitation":{}}"#,
        ),
    ]
    .concat()
}

/// The demo's drain: short, so that Ctrl-C after its `ask_user` curl does
/// not seem to hang.
const DEMO_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// SIGINT and SIGTERM, registered once so that none is missed between two.
struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Signals { int: signal(SignalKind::interrupt())?, term: signal(SignalKind::terminate())? })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
