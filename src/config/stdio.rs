//! A stdio upstream's configuration (DESIGN §12): the program, its working
//! directory and environment, and the bounds of its processes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::file::Kind;
use super::raw::RawUpstream;
use super::{at, ms, ConfigError, LegacyClientMode, Outside, Source, Upstream, UpstreamGeneration};

/// What a stdio upstream runs, and how many of it.
#[derive(Clone, PartialEq, Eq)]
pub struct StdioCommand {
    /// The program and its arguments (no shell reads them).
    pub argv: Vec<String>,
    pub cwd: Option<PathBuf>,
    /// The program's environment besides PATH, HOME, LANG and TMPDIR.
    pub env: Vec<(String, EnvValue)>,
    /// Live processes, spares and stopping ones included.
    pub max_processes: usize,
    pub idle_timeout: Duration,
    pub start_timeout: Duration,
    pub spare_processes: usize,
}

/// Where an environment variable's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    /// Written in the file: not secret (a path, a flag).
    Plain(String),
    /// A secret, read when the gateway starts and on each reload.
    Secret(Source),
}

/// The variables a child takes from the gateway's own environment.
pub const INHERITED: [&str; 4] = ["PATH", "HOME", "LANG", "TMPDIR"];

impl std::fmt::Debug for StdioCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioCommand")
            .field("argv", &self.argv)
            .field("cwd", &self.cwd)
            .field("env", &self.env.iter().map(|(name, _)| name).collect::<Vec<_>>())
            .field("max_processes", &self.max_processes)
            .finish_non_exhaustive()
    }
}

impl StdioCommand {
    /// The command as `check-config` shows it: argv, working directory and
    /// the environment's names with where each value comes from (never a value).
    pub fn describe(&self) -> String {
        let mut out = self.argv.iter().map(|a| shell_quoted(a)).collect::<Vec<_>>().join(" ");
        if let Some(cwd) = &self.cwd {
            out.push_str(&format!(" (in {})", cwd.display()));
        }
        for (name, value) in &self.env {
            let from = match value {
                EnvValue::Plain(_) => "<redacted>".to_string(),
                EnvValue::Secret(source) => format!("<from {source}>"),
            };
            out.push_str(&format!(" {name}={from}"));
        }
        out
    }

    /// The environment a child gets: the listed variables, then those of
    /// [`INHERITED`] the gateway has and the list does not name. An error
    /// names the variable whose value cannot be had, never a value.
    pub fn environment(&self) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::with_capacity(self.env.len() + INHERITED.len());
        for (name, value) in &self.env {
            let value = match value {
                EnvValue::Plain(v) => v.clone(),
                EnvValue::Secret(source) => {
                    source.read(Kind::Secret).map_err(|e| format!("environment variable {name}: {e}"))?
                }
            };
            out.push((name.clone(), value.trim_end_matches(['\n', '\r']).to_string()));
        }
        for name in INHERITED {
            if self.env.iter().all(|(n, _)| n != name) {
                if let Some(v) = std::env::var_os(name).and_then(|v| v.into_string().ok()) {
                    out.push((name.to_string(), v));
                }
            }
        }
        Ok(out)
    }

    /// Whether the working directory is there (`check-config`, offline).
    pub fn check_cwd(&self) -> Result<(), String> {
        match &self.cwd {
            Some(cwd) if !cwd.is_dir() => Err(format!("cwd {} is not a directory", cwd.display())),
            _ => Ok(()),
        }
    }

    /// Whether the program can be found and run (`check-config`, offline):
    /// a path is checked as it is; a bare name is looked up on PATH.
    pub fn check_program(&self) -> Result<PathBuf, String> {
        use std::os::unix::fs::PermissionsExt;
        let program = &self.argv[0];
        let executable = |p: &std::path::Path| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        };
        if program.contains('/') {
            let path = match &self.cwd {
                Some(cwd) if !program.starts_with('/') => cwd.join(program),
                _ => PathBuf::from(program),
            };
            return match executable(&path) {
                true => Ok(path),
                false => Err(format!("{} is not an executable file", path.display())),
            };
        }
        let path = self.env.iter().find(|(n, _)| n == "PATH").and_then(|(_, v)| match v {
            EnvValue::Plain(p) => Some(p.clone()),
            EnvValue::Secret(_) => None,
        });
        let path = path.or_else(|| std::env::var("PATH").ok()).unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|p| executable(p))
            .ok_or_else(|| format!("`{program}` is not found on PATH"))
    }
}

fn shell_quoted(arg: &str) -> String {
    let plain =
        !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:@+,%".contains(&b));
    match plain {
        true => arg.to_string(),
        false => format!("'{}'", arg.replace('\'', "'\\''")),
    }
}

/// The first key set on `u` that only a stdio upstream takes.
pub(super) fn only_beside_command(u: &RawUpstream) -> Option<&'static str> {
    [
        ("cwd", u.cwd.is_some()),
        ("env", u.env.is_some()),
        ("max_processes", u.max_processes.is_some()),
        ("process_idle_timeout_ms", u.process_idle_timeout_ms.is_some()),
        ("start_timeout_ms", u.start_timeout_ms.is_some()),
        ("spare_processes", u.spare_processes.is_some()),
    ]
    .into_iter()
    .find_map(|(key, set)| set.then_some(key))
}

/// A stdio upstream: `command` and what goes with it; keys that only make
/// sense over HTTP are refused, naming their line.
pub(super) fn upstream(
    u: &RawUpstream,
    text: &str,
    outside: &Outside,
    pool_idle: Duration,
) -> Result<Upstream, ConfigError> {
    let err = |key: &str, why: &str| ConfigError(format!("{}upstream `{}`: {why}", at(text, key), u.name));
    let http_only = [
        ("url", u.url.is_some()),
        ("urls", u.urls.is_some()),
        ("headers", u.headers.is_some()),
        ("connect_timeout_ms", u.connect_timeout_ms.is_some()),
        ("forward_authorization", u.forward_authorization.is_some()),
        ("audience", u.audience.is_some()),
    ];
    if let Some((key, _)) = http_only.iter().find(|(_, set)| *set) {
        return Err(err(key, &format!("`{key}` is for HTTP upstreams, not beside `command`")));
    }
    let argv = u.command.clone().unwrap_or_default();
    if argv.is_empty() || argv[0].is_empty() {
        return Err(err("command", "`command` needs the program (argv: [\"program\", \"arg\", …])"));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(err("command", "`command` has a NUL byte"));
    }
    let legacy_clients = match u.legacy_clients.as_deref() {
        None | Some("translate") => LegacyClientMode::Translate,
        Some(_) => return Err(err(
            "legacy_clients",
            "legacy_clients of a stdio upstream is \"translate\" (no session can be relayed to a process)",
        )),
    };
    let generation = match u.generation.as_deref() {
        None | Some("legacy") => UpstreamGeneration::Legacy,
        Some("modern") => UpstreamGeneration::Modern,
        Some(other) => {
            return Err(err(
                "generation",
                &format!("a stdio upstream's generation is \"legacy\" (default) or \"modern\", not `{other}` (it is not probed)"),
            ))
        }
    };
    let mut env = Vec::new();
    for (name, spec) in u.env.iter().flatten() {
        let bad = |why: &str| err(name, &format!("env `{name}`: {why}"));
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(bad("not a variable name"));
        }
        let text_of = |k: &str| spec.get(k).and_then(toml::Value::as_str).map(str::to_string);
        let keys_ok = spec.as_table().is_some_and(|t| {
            t.len() == 1 && t.keys().all(|k| ["value", "value_env", "value_file"].contains(&k.as_str()))
        });
        let value = match (keys_ok, text_of("value"), text_of("value_env"), text_of("value_file")) {
            (true, Some(v), None, None) => EnvValue::Plain(v),
            (true, None, Some(var), None) => EnvValue::Secret(Source::Env(var)),
            (true, None, None, Some(file)) => EnvValue::Secret(Source::File(file.into())),
            _ => {
                return Err(bad(
                    "needs exactly one of { value = \"…\" } (not secret), { value_env = \"VAR\" } or \
                     { value_file = \"path\" }",
                ))
            }
        };
        if matches!(&value, EnvValue::Plain(v) if v.contains('\0')) {
            return Err(bad("the value has a NUL byte"));
        }
        if let EnvValue::Secret(source) = &value {
            let what = format!("upstream `{}` env {name}", u.name);
            outside.read(&what, source.clone(), Kind::Secret).map_err(|e| bad(&e))?;
        }
        env.push((name.clone(), value));
    }
    let positive = |key: &str, v: Option<usize>, default: usize| match v {
        Some(0) => Err(err(key, &format!("{key} must be at least 1"))),
        v => Ok(v.unwrap_or(default)),
    };
    let max_processes = positive("max_processes", u.max_processes, 16)?;
    let spare_processes = u.spare_processes.unwrap_or(0);
    if spare_processes >= max_processes {
        return Err(err("spare_processes", "spare_processes must be below max_processes"));
    }
    let command = StdioCommand {
        argv,
        cwd: u.cwd.as_ref().map(PathBuf::from),
        env,
        max_processes,
        idle_timeout: match u.process_idle_timeout_ms {
            // Shorter would be a process per call, the cold start each time.
            Some(ms) if ms < 1000 => {
                return Err(err("process_idle_timeout_ms", "process_idle_timeout_ms must be at least 1000"))
            }
            Some(ms) => Duration::from_millis(ms),
            None => pool_idle.max(Duration::from_secs(1)),
        },
        start_timeout: ms(u.start_timeout_ms, 30_000).max(Duration::from_millis(1)),
        spare_processes,
    };
    let protocol_version = u.protocol_version.clone().unwrap_or_else(|| super::LEGACY_VERSIONS[0].into());
    if !super::LEGACY_VERSIONS.contains(&protocol_version.as_str()) {
        return Err(err(
            "protocol_version",
            &format!("protocol_version must be one of {:?}", super::LEGACY_VERSIONS),
        ));
    }
    Ok(Upstream {
        name: u.name.clone(),
        urls: Vec::new(),
        generation,
        legacy_clients,
        protocol_version,
        connect_timeout: Duration::from_secs(5),
        response_timeout: ms(u.response_timeout_ms, 30_000),
        call_timeout: ms(u.call_timeout_ms, 600_000),
        max_concurrent_requests: match u.max_concurrent_requests {
            Some(0) => {
                return Err(err("max_concurrent_requests", "max_concurrent_requests must be at least 1"))
            }
            n => n,
        },
        headers: Vec::new(),
        forward_authorization: None,
        stdio: Some(Arc::new(command)),
    })
}
