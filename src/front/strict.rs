//! The one strict reading of a client body (DESIGN §10), whatever generation
//! sent it and whichever path it takes, the legacy relay included.
//!
//! The rules are I-JSON's (RFC 7493): valid UTF-8, no lone surrogate in any
//! string or member name, every number within a double's range (`1e400` is
//! refused; numbers are still forwarded as their raw text, so integers above
//! 2^53 survive), arrays and objects nested at most [`MAX_DEPTH`] deep, and no
//! repeated member name in the objects the gateway reads: the envelope,
//! `params`, `params._meta` and `params.arguments` (of every batch item),
//! names compared case-folded; and no member of a message named as a
//! JSON-RPC member in another case (`Method`).
//!
//! Two parsers that read one body differently are how a denied call gets
//! through: the gateway checks one reading and the upstream acts on another.
//! A body these rules accept reads the same in every JSON parser, so what the
//! gateway checked (the method, the tool, prompt or URI a call names) is what
//! the upstream runs. What this walk found ([`Message`]) is what
//! authorization, rate limits and the relay read; they never parse the body
//! themselves.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde_json::{Map, Value};

use crate::error::Error;

mod scan;

/// The deepest nesting of arrays and objects, the body's own counting as
/// one: what serde_json's tree reader takes, so no later reading of an
/// accepted body can fail on depth.
pub const MAX_DEPTH: usize = 127;

/// Above this many members an object's names are checked through a hash
/// set; below, a scan of a short list is faster.
const SCAN_NAMES: usize = 16;

/// The longest member name repeated back to the client in a refusal.
const NAME_ECHO: usize = 64;

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not I-JSON (400/-32700): what is wrong, in words.
    Malformed(&'static str),
    /// A member name given twice in an object the gateway reads (400/-32600).
    Repeated { place: &'static str, name: String },
    /// A message member named as a JSON-RPC member is, in another case
    /// (`"Method"`): a case-insensitive decoder reads it as that member,
    /// where the gateway read none (400/-32600).
    OtherCase { name: String },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Malformed(why) => f.write_str(why),
            Refusal::Repeated { place, name } => write!(f, "member \"{name}\" given twice in {place}"),
            Refusal::OtherCase { name } => {
                write!(f, "member \"{name}\" of the message is a JSON-RPC member in another case")
            }
        }
    }
}

impl Refusal {
    /// The error a client is answered with: 400 and -32700, or -32600 for a
    /// repeated name (valid JSON, but not a request the gateway can read one way).
    pub fn error(&self) -> Error {
        match self {
            Refusal::Malformed(why) => Error::Malformed(why),
            Refusal::Repeated { .. } | Refusal::OtherCase { .. } => Error::InvalidRequest(self.to_string()),
        }
    }
}

/// What the body is, as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One JSON object: one message.
    Object,
    /// An array: a batch (2025-03-26), one [`Item`] per element.
    Batch,
    /// Valid JSON that is neither (a number, a string, …).
    Other,
}

/// A JSON-RPC `id` as the client sent it.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Id {
    #[default]
    Absent,
    Null,
    /// A string or a number: echoed in answers.
    Usable(Value),
    /// Anything else (an object, an array, a boolean).
    Other,
}

/// `params` as the client sent it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Params {
    #[default]
    Absent,
    Object,
    /// Present and not an object.
    Other,
}

/// What one message (the body, or one element of a batch) carries, as far
/// as the gateway reads it. Strings borrow from the body unless they hold
/// escapes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Item<'a> {
    /// A JSON object (a batch element may be anything).
    pub object: bool,
    /// `jsonrpc`, when a string.
    pub jsonrpc: Option<Cow<'a, str>>,
    pub id: Id,
    /// `method`, when a string.
    pub method: Option<Cow<'a, str>>,
    /// A `method` member of any type.
    pub has_method: bool,
    /// A `result` or `error` member: an answer to a server's request.
    pub answer: bool,
    pub params: Params,
    /// `params.name`, when a string.
    pub name: Option<Cow<'a, str>>,
    /// `params.uri`, when a string.
    pub uri: Option<Cow<'a, str>>,
    /// `params._meta["io.modelcontextprotocol/protocolVersion"]`, when a string.
    pub meta_version: Option<Cow<'a, str>>,
    /// That member, of any type: a 2026-07-28 marker (DESIGN §9).
    pub has_meta_version: bool,
    /// `params` as a tree, when the read was asked to build it ([`read_tree`])
    /// and it is an object: what a translated call carries on.
    pub tree: Option<Map<String, Value>>,
}

impl Item<'_> {
    /// A request: a method and an id.
    pub fn is_request(&self) -> bool {
        self.method.is_some() && self.id != Id::Absent
    }

    /// The tool or prompt name, or the resource URI, a call method names
    /// (`None` when that member is missing or not a string).
    pub fn called(&self) -> Option<&str> {
        match self.method.as_deref()? {
            "tools/call" | "prompts/get" => self.name.as_deref(),
            _ => self.uri.as_deref(),
        }
    }
}

/// A body the rules accept: its shape and its messages.
#[derive(Debug, Clone, PartialEq)]
pub struct Message<'a> {
    pub shape: Shape,
    /// One for an object, one per element for a batch, none otherwise.
    pub items: Vec<Item<'a>>,
}

impl<'a> Message<'a> {
    /// The single message of a body that is one object.
    pub fn single(&self) -> Option<&Item<'a>> {
        match self.shape {
            Shape::Object => self.items.first(),
            _ => None,
        }
    }
}

/// Reads a client body under the rules above, walking every byte once.
pub fn read(body: &[u8]) -> Result<Message<'_>, Refusal> {
    scan::walk(body, false)
}

/// [`read`], building each message's `params` as a tree in the same walk
/// ([`Item::tree`]): a 2026 client's call is read once, not validated here
/// and parsed again.
pub fn read_tree(body: &[u8]) -> Result<Message<'_>, Refusal> {
    scan::walk(body, true)
}

/// Where in the message a value sits: what is read of it, and whether its
/// member names must be unique.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Top,
    BatchItem,
    Params,
    Meta,
    Arguments,
    Inside,
}

impl Place {
    /// The object's name in a refusal; `None` where repeats are not checked.
    fn unique(self) -> Option<&'static str> {
        match self {
            Place::Top | Place::BatchItem => Some("the message"),
            Place::Params => Some("params"),
            Place::Meta => Some("params._meta"),
            Place::Arguments => Some("params.arguments"),
            Place::Inside => None,
        }
    }

    /// Where a member of this object goes.
    fn member(self, name: &str) -> Place {
        match (self, name) {
            (Place::Top | Place::BatchItem, "params") => Place::Params,
            (Place::Params, "_meta") => Place::Meta,
            (Place::Params, "arguments") => Place::Arguments,
            _ => Place::Inside,
        }
    }
}

/// Names every message has: one bit each when seen, not kept in the list.
const COMMON: [&str; 6] = ["jsonrpc", "id", "method", "params", "result", "error"];

/// The member names of one object seen so far: the common ones as bits,
/// others in a short list kept inline (no allocation for the objects
/// requests carry), then a set.
struct Names<'n> {
    common: u8,
    few: [Option<Cow<'n, str>>; SCAN_NAMES],
    len: usize,
    many: HashSet<Cow<'n, str>>,
}

impl Default for Names<'_> {
    fn default() -> Self {
        Names { common: 0, few: [const { None }; SCAN_NAMES], len: 0, many: HashSet::new() }
    }
}

impl<'n> Names<'n> {
    /// Whether `name` is new, its case folded: two names that differ only
    /// in case (or by a letter that folds to another, `ſ` to `s`, the Kelvin
    /// sign to `k`) are one name here, as they are to a decoder that matches
    /// names case-insensitively (Go's `encoding/json`: the last one wins
    /// there, so `{"name":"echo","Name":"delete_user"}` would run what the
    /// gateway did not check). A `Cow`, not a `str`: a name kept stays
    /// borrowed from the body.
    #[allow(clippy::ptr_arg)]
    fn insert(&mut self, name: &Cow<'n, str>) -> bool {
        let name = &folded(name);
        if let Some(at) = COMMON.iter().position(|c| *c == name.as_ref()) {
            let bit = 1 << at;
            let new = self.common & bit == 0;
            self.common |= bit;
            return new;
        }
        if self.len < SCAN_NAMES {
            if self.few[..self.len].iter().flatten().any(|n| n == name) {
                return false;
            }
            self.few[self.len] = Some(name.clone());
            self.len += 1;
            return true;
        }
        if self.many.is_empty() {
            self.many.extend(self.few.iter_mut().filter_map(Option::take));
        }
        self.many.insert(name.clone())
    }
}

/// Whether a message member's `name` is a JSON-RPC member's in another
/// case (`Method`, `PARAMS`): one such member alone is no repeat, yet a
/// decoder that matches names case-insensitively (Go's `encoding/json`)
/// reads `{"id":1,"result":{},"Method":"tools/call","params":…}` as a
/// call the gateway saw as an answer, and relays unchecked.
fn other_case(name: &str) -> bool {
    !COMMON.contains(&name) && COMMON.contains(&folded(&Cow::Borrowed(name)).as_ref())
}

/// `name` with its case folded (see [`Names::insert`]): borrowed when it
/// is already (lowercase ASCII, as nearly every name is).
fn folded<'n>(name: &Cow<'n, str>) -> Cow<'n, str> {
    if name.bytes().all(|b| b.is_ascii() && !b.is_ascii_uppercase()) {
        return name.clone();
    }
    let mut out = String::with_capacity(name.len());
    for c in name.chars().flat_map(char::to_lowercase) {
        // Letters whose simple case folding differs from their lowercase.
        out.push(match c {
            'ſ' => 's',
            'ς' => 'σ',
            'ϐ' => 'β',
            'ϑ' => 'θ',
            'ϕ' => 'φ',
            'ϖ' => 'π',
            'ϰ' => 'κ',
            'ϱ' => 'ρ',
            'ϵ' => 'ε',
            'ẛ' => 'ṡ',
            '\u{1fbe}' | '\u{345}' => 'ι',
            'µ' => 'μ',
            'ᲀ' => 'в',
            'ᲁ' => 'д',
            'ᲂ' => 'о',
            'ᲃ' => 'с',
            'ᲄ' | 'ᲅ' => 'т',
            'ᲆ' => 'ъ',
            'ᲇ' => 'ѣ',
            'ᲈ' => 'ꙋ',
            other => other,
        });
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests;
