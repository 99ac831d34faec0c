//! `sessionless check-config FILE`: the routing file checked offline, by the
//! same validation the gateway runs, with what it names outside itself
//! (keys, secrets, TLS and auth files) listed instead of required.

use std::fmt::Write;
use std::path::Path;
use std::sync::Arc;

use super::{parse, read_file, validate, AuthKind, Config, ConfigError, Continuity, Need, Outside, Route};
use super::{LegacyClientMode, UpstreamGeneration};

/// A routing file checked without what it names outside itself.
pub struct Checked {
    /// The file's table; keys, secrets and TLS that are missing here are
    /// left out, so it is for reading (and `--probe`), never for running.
    config: Config,
    needs: Vec<Need>,
}

impl Checked {
    /// Checks a routing file offline; errors name the file and line.
    pub fn from_file(path: &Path) -> Result<Checked, ConfigError> {
        let text = read_file(path)?;
        Checked::from_toml(&text).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }

    pub fn from_toml(text: &str) -> Result<Checked, ConfigError> {
        let outside = Outside::optional();
        let config = validate(parse(text)?, text, &outside)?;
        // A stdio upstream's program must be there and executable (checked offline).
        for r in
            config.routes.iter().flat_map(|r| std::iter::once(r).chain(r.members.iter().map(|m| &m.route)))
        {
            if let Some(command) = &r.upstream.stdio {
                command.check_cwd().and_then(|()| command.check_program().map(drop)).map_err(|why| {
                    ConfigError(format!("upstream `{}`: its command cannot be run: {why}", r.upstream.name))
                })?;
            }
        }
        Ok(Checked { config, needs: outside.into_needs() })
    }

    pub fn routes(&self) -> &[Arc<Route>] {
        &self.config.routes
    }

    /// The environment variables and files the gateway will read at start.
    pub fn needs(&self) -> &[Need] {
        &self.needs
    }

    /// Whatever the file says, with its defaults; keys, secrets and TLS
    /// this machine lacks are absent from it.
    pub fn file_only(&self) -> &Config {
        &self.config
    }

    /// What `check-config` prints: listeners, the routing table, and what
    /// the file needs at run time (present or absent here; never a value).
    pub fn report(&self) -> String {
        let c = &self.config;
        let mut out = String::new();
        let _ = writeln!(out, "listen {}", c.listen);
        if let Some(cluster) = &c.cluster {
            let _ = writeln!(out, "cluster internal listener {}", cluster.internal_listen);
        }
        let _ = writeln!(out, "drain_timeout_ms {}", c.drain_timeout.as_millis());
        out.push_str(&routing_table(&c.routes));
        if self.needs.is_empty() {
            out.push_str("needs at run time: nothing outside the file\n");
        } else {
            out.push_str("needs at run time:\n");
            for n in &self.needs {
                let state = match (&n.missing, n.optional) {
                    (None, _) => "present".to_string(),
                    (Some(_), true) => "absent (a default applies)".to_string(),
                    (Some(why), false) => format!("ABSENT ({why})"),
                };
                let _ = writeln!(out, "  {}  {}: {state}", n.source, n.what);
            }
        }
        out
    }
}

/// The resolved routes, one line each: host (`*`: any), path, upstream,
/// its instances, generation, continuity, auth policy, rules.
pub fn routing_table(routes: &[Arc<Route>]) -> String {
    let header = ["host", "route", "upstream", "urls", "generation", "continuity", "auth", "rules"];
    // A federated route is one row per member (its rules are the route's).
    let onto_one = routes.iter().flat_map(|r| match r.federated() {
        false => vec![(r, r)],
        true => r.members.iter().map(|m| (r, &m.route)).collect(),
    });
    let rows: Vec<[String; 8]> = onto_one
        .map(|(route, r)| {
            let u = &r.upstream;
            let urls: Vec<String> = match &u.stdio {
                Some(command) => vec![format!("stdio: {}", command.describe())],
                None => u.urls.iter().map(ToString::to_string).collect(),
            };
            let generation = match (u.generation, u.legacy_clients) {
                (UpstreamGeneration::Auto, LegacyClientMode::Relay) => "auto",
                (UpstreamGeneration::Auto, LegacyClientMode::Translate) => "auto (legacy clients translated)",
                (UpstreamGeneration::Legacy, LegacyClientMode::Relay) => "legacy",
                (UpstreamGeneration::Legacy, LegacyClientMode::Translate) => {
                    "legacy (legacy clients translated onto pooled sessions)"
                }
                (UpstreamGeneration::Modern, LegacyClientMode::Relay) => "modern",
                (UpstreamGeneration::Modern, LegacyClientMode::Translate) => {
                    "modern (legacy clients translated)"
                }
            };
            let continuity = match (r.continuity, r.replay_tools.is_empty()) {
                (Continuity::Replay, _) => "replay".to_string(),
                (Continuity::Park, true) => "park".to_string(),
                (Continuity::Park, false) => format!("park (replay: {})", r.replay_tools.join(",")),
            };
            let auth = match &r.auth {
                None => "none".to_string(),
                Some(p) => match &p.kind {
                    AuthKind::None => "none".to_string(),
                    AuthKind::ApiKeys(_) => format!("{} (api_key)", p.name),
                    AuthKind::Jwt(_) => format!("{} (jwt)", p.name),
                },
            };
            [
                r.host.clone().unwrap_or_else(|| "*".into()),
                r.path.clone(),
                match r.member_of {
                    Some(_) => format!("member {}", u.name),
                    None => u.name.clone(),
                },
                urls.join(" "),
                generation.to_string(),
                continuity,
                auth,
                route.rules.len().to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let padded: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:w$}")).collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    out
}
