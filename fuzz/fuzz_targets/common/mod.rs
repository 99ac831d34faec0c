//! What the targets share: JSON as a decoder other than the gateway's may
//! read it, every member of every object kept (repeats included, in order),
//! and names matched exactly or case-insensitively.
#![allow(dead_code)]

use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Appends a header when its bytes make a valid value (a fuzzed one may not).
pub fn add(headers: &mut HeaderMap, name: &'static str, value: &[u8]) {
    if let Ok(v) = HeaderValue::from_bytes(value) {
        headers.append(HeaderName::from_static(name), v);
    }
}

/// Mirrors the body's method, and its name (or URI), into `Mcp-Method` and
/// `Mcp-Name`, so that header validation lets the body through.
pub fn mirror(headers: &mut HeaderMap, body: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(body) else { return };
    if let Some(m) = v.get("method").and_then(Value::as_str) {
        add(headers, "mcp-method", m.as_bytes());
    }
    let params = v.get("params");
    if let Some(n) = params.and_then(|p| p.get("name").or(p.get("uri"))).and_then(Value::as_str) {
        add(headers, "mcp-name", n.as_bytes());
    }
}

/// Fuzzed values for `names`, in order, from `extra` split at 0x1f. (Only
/// when the input asks: splitting no bytes still yields one empty value.)
pub fn fuzzed(headers: &mut HeaderMap, names: &[&'static str], extra: &[u8]) {
    for (name, value) in names.iter().zip(extra.split(|&b| b == 0x1f)) {
        add(headers, name, value);
    }
}

/// A JSON value with every member of every object kept: what serde_json's
/// `Value` (the last repeat wins) cannot show.
pub enum Raw {
    Str(String),
    Scalar,
    Array(Vec<Raw>),
    Object(Vec<(String, Raw)>),
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Raw, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Raw, E> {
        Ok(Raw::Scalar)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Raw, E> {
        Ok(Raw::Scalar)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Raw, E> {
        Ok(Raw::Scalar)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Raw, E> {
        Ok(Raw::Scalar)
    }
    fn visit_str<E>(self, s: &str) -> Result<Raw, E> {
        Ok(Raw::Str(s.to_string()))
    }
    fn visit_unit<E>(self) -> Result<Raw, E> {
        Ok(Raw::Scalar)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Raw::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut members = Vec::new();
        while let Some(member) = map.next_entry::<String, Raw>()? {
            members.push(member);
        }
        Ok(Raw::Object(members))
    }
}

/// How a decoder picks a member by name.
#[derive(Debug, Clone, Copy)]
pub struct Reader {
    /// Names match case-insensitively (Go's `encoding/json` for struct fields).
    pub folds: bool,
    /// Of repeats, the last wins (serde_json's `Value`, Go), else the first.
    pub last: bool,
}

/// Every pairing: the readers an upstream may use.
pub const READERS: [Reader; 4] = [
    Reader { folds: false, last: true },
    Reader { folds: false, last: false },
    Reader { folds: true, last: true },
    Reader { folds: true, last: false },
];

impl Raw {
    pub fn depth(&self) -> usize {
        match self {
            Raw::Str(_) | Raw::Scalar => 0,
            Raw::Array(items) => 1 + items.iter().map(Raw::depth).max().unwrap_or(0),
            Raw::Object(members) => 1 + members.iter().map(|(_, v)| v.depth()).max().unwrap_or(0),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Raw::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The member named exactly `name`, the first of repeats.
    pub fn get(&self, name: &str) -> Option<&Raw> {
        self.member(name, Reader { folds: false, last: false })
    }

    /// The member `reader` takes for `name`.
    pub fn member(&self, name: &str, reader: Reader) -> Option<&Raw> {
        let Raw::Object(members) = self else { return None };
        let matches = |(n, _): &&(String, Raw)| {
            if reader.folds {
                fold(n) == fold(name)
            } else {
                n == name
            }
        };
        let found =
            if reader.last { members.iter().rev().find(matches) } else { members.iter().find(matches) };
        found.map(|(_, v)| v)
    }

    /// The messages of a body: the object, or each element of a batch.
    pub fn messages(&self) -> Vec<&Raw> {
        match self {
            Raw::Array(items) => items.iter().collect(),
            one => vec![one],
        }
    }
}

/// A character as a case-insensitive decoder matches it: Unicode simple
/// case folding (what Go's `encoding/json` and `bytes.EqualFold` use),
/// approximated by the one-character upper then lower mappings; the Turkish
/// dotted and dotless i fold to nothing else there.
pub fn fold_char(c: char) -> char {
    fn single(mut it: impl Iterator<Item = char>, or: char) -> char {
        match (it.next(), it.next()) {
            (Some(x), None) => x,
            _ => or,
        }
    }
    if matches!(c, 'İ' | 'ı') {
        return c;
    }
    let upper = single(c.to_uppercase(), c);
    single(upper.to_lowercase(), upper)
}

pub fn fold(name: &str) -> String {
    name.chars().map(fold_char).collect()
}
