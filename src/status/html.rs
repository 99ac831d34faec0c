//! The status page as HTML: one document, its style inline, no script and
//! nothing fetched (the CSP says so to the browser). Every value that comes
//! from the configuration or the outside is escaped.

use std::fmt::Write as _;

use super::{ConfigState, Page, RouteState, UpstreamState};

/// The page's Content-Security-Policy: its inline style, nothing else.
pub const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; \
                       frame-ancestors 'none'";

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.4em 0 .4em}h3{font-size:1em;margin:1em 0 .3em}\
table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}\
th{background:#f4f4f4}dt{font-weight:600;float:left;clear:left;width:12em}dd{margin:0 0 .2em 12em}\
ul{margin:0;padding-left:1.1em}.up{color:#176f2c}.down{color:#b00020;font-weight:600}\
.muted{color:#666}code{font-size:.95em}";

/// The whole document.
pub fn render(page: &Page) -> String {
    let mut out = String::with_capacity(8 * 1024);
    out.push_str("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let _ = writeln!(out, "<title>sessionless {} status</title>", esc(page.version));
    let _ = writeln!(out, "<style>{STYLE}</style>\n</head>\n<body>");
    header(&mut out, page);
    gateway(&mut out, page);
    let _ = writeln!(out, "<section id=\"routes\">\n<h2>Routes ({})</h2>", page.routes.len());
    for r in &page.routes {
        route(&mut out, r);
    }
    out.push_str("</section>\n<footer class=\"muted\"><p>The same as JSON: <code>curl -H 'Accept: \
                  application/json' …/status</code>. Counts since start unless said otherwise.</p></footer>\n");
    out.push_str("</body>\n</html>\n");
    out
}

fn header(out: &mut String, page: &Page) {
    let _ = writeln!(out, "<header>\n<h1>sessionless <span id=\"version\">{}</span></h1>", esc(page.version));
    let state = match page.draining {
        true => "<strong class=\"down\">draining</strong>: new calls are refused while paused ones finish",
        false => "<span class=\"up\">serving</span>",
    };
    let _ = writeln!(
        out,
        "<p id=\"state\">{state}; started {} (up {}).</p>\n</header>",
        utc(page.started_at),
        duration(page.uptime_s)
    );
}

fn gateway(out: &mut String, page: &Page) {
    out.push_str("<section id=\"gateway\">\n<h2>Gateway</h2>\n<dl>\n");
    for l in &page.listeners {
        let scheme = if l.tls { "https" } else { "http" };
        let _ = writeln!(
            out,
            "<dt>{} listener</dt><dd class=\"listener\"><code>{scheme}://{}</code></dd>",
            if l.kind == "public" { "Public" } else { "Internal (cluster)" },
            esc(&l.address.to_string())
        );
    }
    config(out, &page.config);
    let _ = writeln!(out, "<dt>Parked flows</dt><dd id=\"parked-flows\">{}</dd>", page.parked_flows);
    let _ = writeln!(out, "<dt>Pooled sessions</dt><dd id=\"pooled-sessions\">{}</dd>", page.pooled_sessions);
    let _ = writeln!(out, "<dt>Client connections</dt><dd>{}</dd>", page.client_connections);
    out.push_str("</dl>\n</section>\n");
}

fn config(out: &mut String, c: &ConfigState) {
    let _ = writeln!(
        out,
        "<dt>Config generation</dt><dd><span id=\"config-generation\">{}</span> \
         <span class=\"muted\">(loaded {}; reloads: {} applied, {} rejected)</span></dd>",
        c.generation,
        utc(c.loaded_at),
        c.reloads_applied,
        c.reloads_rejected
    );
    out.push_str("<dt>Last reload</dt><dd id=\"last-reload\">");
    match &c.last_reload {
        None => out.push_str("<span class=\"muted\">none since start</span>"),
        Some(r) => {
            let class = if r.outcome == "applied" { "up" } else { "down" };
            let _ =
                write!(out, "<span class=\"{class}\">{}</span> {}: {}", r.outcome, utc(r.at), esc(&r.detail));
        }
    }
    out.push_str("</dd>\n");
}

fn route(out: &mut String, r: &RouteState) {
    let _ = writeln!(out, "<article class=\"route\" data-route=\"{}\">", esc(&r.route));
    let kind = if r.federated { " <span class=\"muted\">(federated)</span>" } else { "" };
    let _ = writeln!(out, "<h3><code>{}</code>{kind}</h3>", esc(&r.route));
    let auth = r.auth.as_deref().map_or("none".to_string(), |a| format!("<code>{}</code>", esc(a)));
    let _ = writeln!(out, "<p class=\"muted\">auth: {auth}; continuity: {}</p>", r.continuity);
    out.push_str(
        "<table>\n<thead><tr><th>upstream</th><th>kind</th><th>generation</th><th>state</th>\
         <th>instances</th><th>pooled sessions</th><th>errors (last 5 min)</th><th>upstream requests</th></tr></thead>\n<tbody>\n",
    );
    for u in &r.upstreams {
        upstream(out, u);
    }
    out.push_str("</tbody>\n</table>\n</article>\n");
}

fn upstream(out: &mut String, u: &UpstreamState) {
    let _ =
        write!(out, "<tr class=\"upstream\" data-upstream=\"{}\" data-state=\"{}\">", esc(&u.name), u.state);
    let _ = write!(out, "<td><code>{}</code></td>", esc(&u.name));
    match (&u.command, u.processes) {
        (Some(command), Some(n)) => {
            let max = u.max_processes.map(|m| format!(" of {m}")).unwrap_or_default();
            let _ = write!(out, "<td>stdio: <code>{}</code>, {n}{max} processes</td>", esc(command));
        }
        _ => out.push_str("<td>http</td>"),
    }
    let how = match (u.generation_setting, u.generation) {
        ("auto", "unknown") => "not probed yet, or unreachable",
        ("auto", _) => "probed",
        _ => "configured",
    };
    let _ =
        write!(out, "<td class=\"generation\">{} <span class=\"muted\">({how})</span></td>", u.generation);
    let breaker = if u.breaker_open { " (breaker open)" } else { "" };
    let _ = write!(out, "<td class=\"state {}\">{}{breaker}</td>", u.state, u.state);
    let _ = write!(out, "<td>{} up, {} down<ul>", u.instances_up, u.instances_down);
    for i in &u.instances {
        let (class, word) = if i.up { ("up", "up") } else { ("down", "down") };
        let _ = write!(out, "<li class=\"{class}\"><code>{}</code> {word}</li>", esc(&i.instance));
    }
    out.push_str("</ul></td>");
    let _ = write!(out, "<td>{}</td><td class=\"errors\">{}</td><td>", u.pooled_sessions, u.errors_last_5m);
    let nonzero: Vec<String> =
        u.requests.iter().filter(|(_, n)| **n > 0).map(|(k, n)| format!("{}: {n}", esc(k))).collect();
    match nonzero.is_empty() {
        true => out.push_str("<span class=\"muted\">none</span>"),
        false => out.push_str(&nonzero.join(", ")),
    }
    out.push_str("</td></tr>\n");
}

/// `text` with the characters that mean something in HTML (in text and in
/// quoted attributes) replaced.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Unix time as `2026-12-03 10:15:00 UTC` (the civil calendar from days:
/// Howard Hinnant's `civil_from_days`).
fn utc(unix: u64) -> String {
    let (days, secs) = ((unix / 86_400) as i64, unix % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02} UTC")
}

/// Seconds as `3 d 4 h`, `5 min 2 s`.
fn duration(secs: u64) -> String {
    match secs {
        s if s >= 86_400 => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
        s if s >= 3600 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{} min {} s", s / 60, s % 60),
        s => format!("{s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_html_reads() {
        assert_eq!(esc("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
        assert_eq!(esc("/mcp"), "/mcp");
    }

    #[test]
    fn dates_and_durations() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_796_299_199), "2026-12-03 11:59:59 UTC");
        assert_eq!(duration(59), "59 s");
        assert_eq!(duration(3_725), "1 h 2 min");
        assert_eq!(duration(90_000), "1 d 1 h");
    }
}
