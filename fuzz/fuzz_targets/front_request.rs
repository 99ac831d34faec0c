//! Whole client requests (method, headers, body) through the front door as
//! `Server::mcp` takes a POST (guard, the strict read, the generation, the
//! rules a legacy client's call meets, then its cell), on a route with
//! rules (deny tools `delete_*`, prompts `secret_*`, resources
//! `file:///secret/*`): what would be forwarded upstream names exactly what
//! the rules saw, however the upstream reads it.
//!
//! - A relayed legacy message goes upstream as its bytes: every reader
//!   (names matched exactly or case-insensitively, the first or the last of
//!   repeats: serde_json, Go's `encoding/json`, ...) finds in each message
//!   the same call method and tool, prompt or URI as the rules did, or no
//!   call where they saw none.
//! - A translated legacy request goes upstream as the typed call the
//!   legacy-client half builds: its method and `params.name` or `params.uri`
//!   are what the rules saw.
//! - A 2026 call goes upstream as its method and `params`: the name the
//!   rules check is the one in `params`, and the one the strict read found.
//!
//! Input: byte 0 holds flags, the rest is the body (and, with flag 0x80,
//! header values after its last NUL, split by 0x1f). Flags: 0x03 the HTTP
//! method (POST twice, GET, DELETE); 0x04 the route translates legacy
//! clients rather than relaying them; 0x08 an `Mcp-Session-Id`; 0x30 the
//! `MCP-Protocol-Version` (none, a legacy one, the 2026 one, 2025-03-26);
//! 0x40 mirror the body's method and name in `Mcp-Method` and `Mcp-Name`.
#![no_main]

mod common;

use std::sync::{Arc, LazyLock};

use common::{add, Raw, READERS};
use http::{HeaderMap, Method as Verb};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use sessionless::authz::{self, Rule, Target, View, Who};
use sessionless::config::Config;
use sessionless::front::generation::{self, ByHeaders, Generation};
use sessionless::front::legacy::{Kind, Peeked};
use sessionless::front::{self, strict, Method};

const FUZZED: [&str; 7] =
    ["mcp-protocol-version", "mcp-method", "mcp-name", "content-type", "origin", "mcp-session-id", "accept"];

struct Fixture {
    config: Config,
    view: View,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let config = Config::single("http://127.0.0.1:9/mcp", "127.0.0.1:8080".parse().expect("an address"))
        .expect("a config");
    let deny = Rule {
        allow: false,
        tools: vec!["delete_*".into()],
        prompts: vec!["secret_*".into()],
        resources: vec!["file:///secret/*".into()],
        ..Rule::default()
    };
    let view = View::new(Arc::from(vec![deny]), Who { principal: "anonymous".into(), ..Who::default() });
    Fixture { config, view }
});

/// A call as the rules see it: its method and tool, prompt or URI.
type Called = Option<(String, String)>;

/// What would go upstream.
enum Forwarded<'b> {
    Nothing,
    /// The client's bytes, relayed: with what the rules saw of each message.
    Bytes(&'b [u8], Vec<Called>),
    /// A call the gateway writes: its method and params, and what the rules saw.
    Call(Method, Map<String, Value>, Called),
}

fn request(flags: u8, body: &[u8], extra: &[u8]) -> (Verb, HeaderMap) {
    let verb = [Verb::POST, Verb::POST, Verb::GET, Verb::DELETE][usize::from(flags & 3)].clone();
    let mut headers = HeaderMap::new();
    add(&mut headers, "host", b"127.0.0.1:8080");
    if flags & 0x80 == 0 {
        add(&mut headers, "content-type", b"application/json");
    }
    if flags & 0x08 != 0 {
        add(&mut headers, "mcp-session-id", b"a-session");
    }
    let version = match (flags >> 4) & 3 {
        0 => None,
        1 => Some(generation::LEGACY_VERSIONS[0]),
        2 => Some(front::MODERN_VERSION),
        _ => Some("2025-03-26"),
    };
    if let Some(v) = version {
        add(&mut headers, "mcp-protocol-version", v.as_bytes());
    }
    if flags & 0x40 != 0 {
        common::mirror(&mut headers, body);
    }
    if flags & 0x80 != 0 {
        common::fuzzed(&mut headers, &FUZZED, extra);
    }
    (verb, headers)
}

fn called(item: &strict::Item<'_>) -> Called {
    match authz::legacy_target(item) {
        Target::Call(method, name) => Some((method.to_string(), name.to_string())),
        Target::Nothing | Target::Unreadable => None,
    }
}

/// The front door as `Server::mcp` runs a request, up to its cell: what it
/// would send upstream. (Auth, rate limits and sessions refuse more; they
/// never change what a forwarded message names.)
fn front_door<'b>(verb: &Verb, headers: &HeaderMap, body: &'b [u8], translates: bool) -> Forwarded<'b> {
    let f = &*FIXTURE;
    let by_headers = generation::by_headers(headers);
    let session_verb = (verb == Verb::GET || verb == Verb::DELETE) && by_headers == ByHeaders::Legacy;
    if session_verb || sessionless::guard::check(&f.config, None, verb, None, headers).is_err() {
        // A session's GET or DELETE sends no body; a refused request nothing.
        return Forwarded::Nothing;
    }
    let trees = by_headers != ByHeaders::Legacy || translates;
    let read = if trees { strict::read_tree(body) } else { strict::read(body) };
    let Ok(message) = read else { return Forwarded::Nothing };
    let generation = generation::of_post(headers, &message);
    let saw: Vec<Called> = message.items.iter().map(called).collect();
    if generation == Generation::Modern {
        let parsed = if trees { front::parse_read(headers, message) } else { front::parse(headers, body) };
        let Ok(front::Message::Call(call)) = parsed else { return Forwarded::Nothing };
        // The rules check `call.name` (`Server::dispatch`).
        let rules_saw = call.name.clone().map(|name| (call.method.as_str().to_string(), name));
        if call.name.as_ref().is_some_and(|n| !f.view.allows_call(call.method.as_str(), n)) {
            return Forwarded::Nothing;
        }
        // The strict read and the typed call agree on what is called.
        let strict_saw = saw.first().cloned().flatten();
        if let (Some(a), Some(b)) = (&strict_saw, &rules_saw) {
            assert_eq!(a, b, "the strict read and the typed call name different targets");
        }
        return Forwarded::Call(call.method, call.params, rules_saw);
    }
    if authz::legacy_denied(&f.view, &message).is_some() {
        return Forwarded::Nothing;
    }
    let Ok(peek) = Peeked::read(message) else { return Forwarded::Nothing };
    if !translates {
        // `legacy_relay::post`: no batch on a route with rules; an
        // `initialize` or any other message goes as it came.
        if peek.label == Kind::Batch {
            return Forwarded::Nothing;
        }
        return Forwarded::Bytes(body, saw);
    }
    // `legacy_client::Bridge::post` and `request`: answers, notifications,
    // `initialize` and `ping` stay here, batches and the methods without a
    // stateless form are refused; a call goes as a typed 2026 call.
    if matches!(peek.label, Kind::Batch | Kind::Response | Kind::Notification) || peek.initialize {
        return Forwarded::Nothing;
    }
    let Some(method) = peek.method.as_deref().and_then(Method::parse) else { return Forwarded::Nothing };
    if method == Method::SubscriptionsListen {
        return Forwarded::Nothing;
    }
    match sessionless::fuzzing::translated_call(method, peek.params) {
        Ok(call) => Forwarded::Call(call.method, call.params, saw.into_iter().next().flatten()),
        Err(_) => Forwarded::Nothing,
    }
}

/// The call a reader of the relayed bytes finds in one message.
fn read_call(message: &Raw, reader: common::Reader) -> Called {
    let method = message.member("method", reader)?.as_str()?;
    let key = match authz::kind_of_call(method)? {
        authz::Kind::Resource => "uri",
        authz::Kind::Tool | authz::Kind::Prompt => "name",
    };
    let params = message.member("params", reader)?;
    // No target: the rules refuse such a call; if it got here, say so.
    let name = params.member(key, reader).and_then(Raw::as_str).unwrap_or("<none>");
    Some((method.to_string(), name.to_string()))
}

fn check(forwarded: Forwarded<'_>) {
    match forwarded {
        Forwarded::Nothing => {}
        Forwarded::Bytes(body, saw) => {
            let raw: Raw = serde_json::from_slice(body).expect("relayed bytes are JSON");
            let messages = raw.messages();
            let text = String::from_utf8_lossy(body);
            for reader in READERS {
                for (i, message) in messages.iter().enumerate() {
                    let theirs = read_call(message, reader);
                    let ours = saw.get(i).cloned().flatten();
                    assert_eq!(ours, theirs, "relayed, read with {reader:?}: {text:?}");
                }
            }
        }
        Forwarded::Call(method, params, saw) => {
            let sent = method.name_key().map(|key| {
                let name = params.get(key).and_then(Value::as_str).unwrap_or("<none>");
                (method.as_str().to_string(), name.to_string())
            });
            // A call method the rules name: what is sent is what they saw.
            if authz::kind_of_call(method.as_str()).is_some() {
                assert_eq!(sent, saw, "a typed call names what the rules did not see");
            }
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let [flags, rest @ ..] = input else { return };
    let (body, extra) = match rest.iter().rposition(|&b| b == 0) {
        Some(i) if flags & 0x80 != 0 => (&rest[..i], &rest[i + 1..]),
        _ => (rest, &[][..]),
    };
    let (verb, headers) = request(*flags, body, extra);
    check(front_door(&verb, &headers, body, flags & 0x04 != 0));
});
