//! Differential: the one strict reading of a client body
//! (`front::strict`) against serde_json, on arbitrary bytes.
//!
//! - A body it accepts, serde_json parses too, to the same value: every
//!   message's `jsonrpc`, `id`, `method`, `params`, `params.name`,
//!   `params.uri` and `_meta` protocol version as the gateway read them, and
//!   `params` itself as the tree [`read_tree`] built. It has no lone
//!   surrogate and no number outside a double's range (serde_json refuses
//!   both), is nested at most 127 deep, and no object the rules name (the
//!   message, `params`, `params._meta`, `params.arguments`, of every batch
//!   item) holds two names that a case-insensitive decoder takes for one,
//!   nor a message a member such a decoder takes for a JSON-RPC one (`Method`).
//! - A body it refuses as malformed, serde_json refuses too; one it refuses
//!   for a repeated name (or a JSON-RPC member's in another case) is either
//!   not JSON or holds that name twice there (or such a member).
//! - `read` and `read_tree` agree on everything but the trees, and neither
//!   panics. Time and memory: `-timeout` and `-rss_limit_mb` (scripts/fuzz).
#![no_main]

mod common;

use common::{fold, Raw};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sessionless::front::strict::{self, Id, Item, Message, Params, Refusal, Shape};

const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

/// Every object the rules forbid repeats in, with its place as a refusal
/// names it: the message (or each batch element), `params`, `params._meta`,
/// `params.arguments`.
fn ruled(raw: &Raw) -> Vec<(&'static str, &[(String, Raw)])> {
    let mut out = Vec::new();
    for message in raw.messages() {
        let Raw::Object(members) = message else { continue };
        out.push(("the message", &members[..]));
        // Every member so named: a refused body may repeat them.
        for (_, params) in members.iter().filter(|(n, _)| n == "params") {
            let Raw::Object(p) = params else { continue };
            out.push(("params", &p[..]));
            for (key, place) in [("_meta", "params._meta"), ("arguments", "params.arguments")] {
                for (_, inner) in p.iter().filter(|(n, _)| n == key) {
                    if let Raw::Object(m) = inner {
                        out.push((place, &m[..]));
                    }
                }
            }
        }
    }
    out
}

/// The gateway's coarser reading of "the same name in another case": full
/// lowercase mappings (`İ` is `i̇` there). A refusal may rest on it.
fn lower(name: &str) -> String {
    name.to_lowercase()
}

/// Two names in `members` that `key` makes one.
fn twins<'m>(members: &'m [(String, Raw)], key: fn(&str) -> String) -> Option<(&'m str, &'m str)> {
    let keys: Vec<String> = members.iter().map(|(n, _)| key(n)).collect();
    for (i, k) in keys.iter().enumerate() {
        if let Some(j) = keys[..i].iter().position(|other| other == k) {
            return Some((&members[j].0, &members[i].0));
        }
    }
    None
}

/// What the gateway should have read of one message, from serde_json's tree.
fn expected(message: &Value, trees: bool) -> Item<'static> {
    let Value::Object(obj) = message else { return Item::default() };
    let str_of = |v: Option<&Value>| v.and_then(Value::as_str).map(|s| s.to_string().into());
    let params = obj.get("params");
    let p = params.and_then(Value::as_object);
    let meta = p.and_then(|p| p.get("_meta")).and_then(Value::as_object);
    Item {
        object: true,
        jsonrpc: str_of(obj.get("jsonrpc")),
        id: match obj.get("id") {
            None => Id::Absent,
            Some(Value::Null) => Id::Null,
            Some(v @ (Value::String(_) | Value::Number(_))) => Id::Usable(v.clone()),
            Some(_) => Id::Other,
        },
        method: str_of(obj.get("method")),
        has_method: obj.contains_key("method"),
        answer: obj.contains_key("result") || obj.contains_key("error"),
        params: match params {
            None => Params::Absent,
            Some(Value::Object(_)) => Params::Object,
            Some(_) => Params::Other,
        },
        name: str_of(p.and_then(|p| p.get("name"))),
        uri: str_of(p.and_then(|p| p.get("uri"))),
        meta_version: str_of(meta.and_then(|m| m.get(PROTOCOL_VERSION))),
        has_meta_version: meta.is_some_and(|m| m.contains_key(PROTOCOL_VERSION)),
        tree: p.filter(|_| trees).cloned(),
    }
}

fn expected_message(value: &Value, trees: bool) -> (Shape, Vec<Item<'static>>) {
    match value {
        Value::Object(_) => (Shape::Object, vec![expected(value, trees)]),
        Value::Array(items) => (Shape::Batch, items.iter().map(|i| expected(i, trees)).collect()),
        _ => (Shape::Other, Vec::new()),
    }
}

fn without_trees(mut msg: Message<'_>) -> Message<'_> {
    for item in &mut msg.items {
        item.tree = None;
    }
    msg
}

fn accepted(body: &[u8], read: Message<'_>, tree: Message<'_>) {
    let text = String::from_utf8_lossy(body);
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => panic!("accepted what serde_json refuses ({e}): {text:?}"),
    };
    for (msg, trees) in [(read, false), (tree, true)] {
        let (shape, items) = expected_message(&value, trees);
        assert_eq!(msg.shape, shape, "{text:?}");
        assert_eq!(msg.items, items, "read differently from serde_json: {text:?}");
    }
    let raw: Raw = serde_json::from_slice(body).expect("serde_json read it once");
    assert!(raw.depth() <= strict::MAX_DEPTH, "nested {} deep: {text:?}", raw.depth());
    for (place, members) in ruled(&raw) {
        if let Some((a, b)) = twins(members, fold) {
            panic!("accepted {a:?} and {b:?} in {place}: {text:?}");
        }
    }
    for message in raw.messages() {
        let Raw::Object(members) = message else { continue };
        if let Some((name, _)) = members.iter().find(|(n, _)| other_case(n)) {
            panic!("accepted {name:?}, a JSON-RPC member in another case: {text:?}");
        }
    }
}

/// The members of a JSON-RPC message.
const ENVELOPE: [&str; 6] = ["jsonrpc", "id", "method", "params", "result", "error"];

/// A message member a case-insensitive decoder reads as one of the
/// envelope's, though it is not spelt so.
fn other_case(name: &str) -> bool {
    !ENVELOPE.contains(&name) && ENVELOPE.iter().any(|e| fold(e) == fold(name))
}

fn refused(body: &[u8], refusal: &Refusal) {
    let text = String::from_utf8_lossy(body);
    let _ = (refusal.to_string(), refusal.error());
    match refusal {
        Refusal::Malformed(why) => {
            assert!(
                serde_json::from_slice::<Value>(body).is_err(),
                "refused ({why}) what serde_json reads: {text:?}"
            )
        }
        Refusal::Repeated { place, name } => {
            // Not JSON at all (the repeat came first): refused either way.
            let Ok(raw) = serde_json::from_slice::<Raw>(body) else { return };
            let found = ruled(&raw).into_iter().filter(|(p, _)| p == place).any(|(_, members)| {
                [fold as fn(&str) -> String, lower]
                    .into_iter()
                    .filter_map(|key| twins(members, key))
                    .any(|(_, b)| b.chars().take(64).eq(name.chars()))
            });
            assert!(found, "refused \"{name}\" as repeated in {place}, but it is not: {text:?}");
        }
        Refusal::OtherCase { name } => {
            let Ok(raw) = serde_json::from_slice::<Raw>(body) else { return };
            let found = raw.messages().into_iter().any(|message| match message {
                Raw::Object(members) => {
                    members.iter().any(|(n, _)| other_case(n) && n.chars().take(64).eq(name.chars()))
                }
                _ => false,
            });
            assert!(
                found,
                "refused \"{name}\" as a JSON-RPC member in another case, but it is not: {text:?}"
            );
        }
    }
}

fuzz_target!(|body: &[u8]| {
    let read = strict::read(body);
    let tree = strict::read_tree(body);
    match (read, tree) {
        (Ok(read), Ok(tree)) => {
            assert_eq!(read, without_trees(tree.clone()), "read and read_tree differ");
            accepted(body, read, tree);
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "read and read_tree refuse differently");
            refused(body, &a);
        }
        (a, b) => panic!("read and read_tree disagree: {a:?} / {b:?}"),
    }
});
