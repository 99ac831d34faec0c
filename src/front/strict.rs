//! The one strict reading of a client body (DESIGN §10), whatever generation
//! sent it and whichever path it takes, the legacy relay included.
//!
//! The rules are I-JSON's (RFC 7493): valid UTF-8, no lone surrogate in any
//! string or member name, every number within a double's range (`1e400` is
//! refused; numbers are still forwarded as their raw text, so integers above
//! 2^53 survive), arrays and objects nested at most [`MAX_DEPTH`] deep, and no
//! repeated member name in the objects the gateway reads: the envelope,
//! `params`, `params._meta` and `params.arguments` (of every batch item).
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

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::meta::PROTOCOL_VERSION;
use crate::error::Error;

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
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Malformed(why) => f.write_str(why),
            Refusal::Repeated { place, name } => write!(f, "member \"{name}\" given twice in {place}"),
        }
    }
}

impl Refusal {
    /// The error a client is answered with: 400 and -32700, or -32600 for a
    /// repeated name (valid JSON, but not a request the gateway can read one way).
    pub fn error(&self) -> Error {
        match self {
            Refusal::Malformed(why) => Error::Malformed(why),
            Refusal::Repeated { .. } => Error::InvalidRequest(self.to_string()),
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
    walk(body, false)
}

/// [`read`], building each message's `params` as a tree in the same walk
/// ([`Item::tree`]): a 2026 client's call is read once, not validated here
/// and parsed again.
pub fn read_tree(body: &[u8]) -> Result<Message<'_>, Refusal> {
    walk(body, true)
}

fn walk(body: &[u8], trees: bool) -> Result<Message<'_>, Refusal> {
    let mut walk = Walk { refusal: None, items: Vec::new(), current: Item::default(), batch: false, trees };
    let mut de = serde_json::Deserializer::from_slice(body);
    let found = Node { walk: &mut walk, depth: 0, place: Place::Top, build: false }
        .deserialize(&mut de)
        .and_then(|found| de.end().map(|()| found));
    match (found, walk.refusal) {
        (_, Some(refusal)) => Err(refusal),
        (Err(e), None) => Err(Refusal::Malformed(malformed(&e))),
        (Ok(found), None) => {
            let shape = match found {
                Found::Object => Shape::Object,
                Found::Array if walk.batch => Shape::Batch,
                _ => Shape::Other,
            };
            Ok(Message { shape, items: walk.items })
        }
    }
}

/// serde_json's own refusals, in words a client can act on.
fn malformed(e: &serde_json::Error) -> &'static str {
    let text = e.to_string();
    if text.starts_with("recursion limit exceeded") {
        "arrays and objects nested more than 127 deep"
    } else if text.starts_with("number out of range") {
        "a number outside the range of a double"
    } else if text.contains("surrogate") || text.contains("hex escape") {
        "a lone surrogate or a bad \\u escape in a string"
    } else if text.starts_with("invalid unicode code point") {
        "invalid UTF-8"
    } else if text.contains("control character") {
        "a control character in a string"
    } else if e.is_eof() {
        "the body ends before its JSON does"
    } else {
        "the body is not valid JSON"
    }
}

/// The state of one walk: the messages found, and a refusal of this
/// module's own (serde only carries strings).
struct Walk<'de> {
    refusal: Option<Refusal>,
    items: Vec<Item<'de>>,
    /// The message being walked.
    current: Item<'de>,
    batch: bool,
    /// Whether `params` is built as a tree.
    trees: bool,
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

/// What kind of value was walked, with the scalars the envelope reads; or
/// the value itself, where a tree is built.
enum Found<'de> {
    Null,
    Bool,
    Number(Number),
    Str(Cow<'de, str>),
    Array,
    Object,
    Tree(Value),
}

impl<'de> Found<'de> {
    fn str(&self) -> Option<Cow<'de, str>> {
        match self {
            Found::Str(s) => Some(s.clone()),
            Found::Tree(Value::String(s)) => Some(Cow::Owned(s.clone())),
            _ => None,
        }
    }

    fn id(&self) -> Id {
        match self {
            Found::Null => Id::Null,
            Found::Str(s) => Id::Usable(Value::String(s.to_string())),
            Found::Number(n) => Id::Usable(Value::Number(n.clone())),
            _ => Id::Other,
        }
    }

    fn is_object(&self) -> bool {
        matches!(self, Found::Object | Found::Tree(Value::Object(_)))
    }

    /// The value of a member of a tree being built.
    fn into_value(self) -> Value {
        match self {
            Found::Tree(v) => v,
            Found::Null => Value::Null,
            // Only trees are built below a tree: nothing else reaches here.
            _ => Value::Null,
        }
    }
}

/// One value to walk.
struct Node<'w, 'de> {
    walk: &'w mut Walk<'de>,
    /// Arrays and objects around this value.
    depth: usize,
    place: Place,
    /// Whether this value is built as a tree (it is `params` or inside it).
    build: bool,
}

impl<'de> DeserializeSeed<'de> for Node<'_, 'de> {
    type Value = Found<'de>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Found<'de>, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Node<'_, 'de> {
    fn refuse<E: de::Error>(&mut self, refusal: Refusal) -> E {
        self.walk.refusal.get_or_insert(refusal);
        E::custom("refused")
    }

    fn deeper<E: de::Error>(&mut self) -> Result<usize, E> {
        let depth = self.depth + 1;
        if depth > MAX_DEPTH {
            return Err(self.refuse(Refusal::Malformed("arrays and objects nested more than 127 deep")));
        }
        Ok(depth)
    }

    fn child(&mut self, place: Place, depth: usize) -> Node<'_, 'de> {
        let build = self.build || (place == Place::Params && self.walk.trees);
        Node { walk: self.walk, depth, place, build }
    }
}

impl<'de> Visitor<'de> for Node<'_, 'de> {
    type Value = Found<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Found<'de>, E> {
        Ok(if self.build { Found::Tree(Value::Null) } else { Found::Null })
    }

    fn visit_bool<E>(self, b: bool) -> Result<Found<'de>, E> {
        Ok(if self.build { Found::Tree(Value::Bool(b)) } else { Found::Bool })
    }

    fn visit_u64<E>(self, n: u64) -> Result<Found<'de>, E> {
        Ok(self.number(n.into()))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Found<'de>, E> {
        Ok(self.number(n.into()))
    }

    fn visit_f64<E: de::Error>(mut self, n: f64) -> Result<Found<'de>, E> {
        // serde_json refuses an infinite number itself; this is the guard.
        match Number::from_f64(n) {
            Some(n) => Ok(self.number(n)),
            None => Err(self.refuse(Refusal::Malformed("a number outside the range of a double"))),
        }
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Found<'de>, E> {
        Ok(if self.build { Found::Tree(Value::String(s.to_owned())) } else { Found::Str(Cow::Borrowed(s)) })
    }

    fn visit_str<E>(self, s: &str) -> Result<Found<'de>, E> {
        Ok(if self.build {
            Found::Tree(Value::String(s.to_owned()))
        } else {
            Found::Str(Cow::Owned(s.to_owned()))
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Found<'de>, A::Error> {
        let depth = self.deeper()?;
        let top = self.place == Place::Top;
        let place = if top { Place::BatchItem } else { Place::Inside };
        self.walk.batch |= top;
        let mut tree = self.build.then(Vec::new);
        while let Some(found) = seq.next_element_seed(self.child(place, depth))? {
            // A batch element that is not an object is a message still (an
            // invalid one); an object pushed itself.
            if top && !matches!(found, Found::Object) {
                self.walk.items.push(Item::default());
            }
            if let Some(tree) = &mut tree {
                tree.push(found.into_value());
            }
        }
        Ok(tree.map_or(Found::Array, |t| Found::Tree(Value::Array(t))))
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Found<'de>, A::Error> {
        let depth = self.deeper()?;
        let unique = self.place.unique();
        let envelope = matches!(self.place, Place::Top | Place::BatchItem);
        if envelope {
            self.walk.current = Item { object: true, ..Item::default() };
        }
        let mut names = Names::default();
        let mut tree = self.build.then(Map::new);
        while let Some(name) = map.next_key_seed(NameSeed)? {
            if let Some(place) = unique {
                if !names.insert(name.clone()) {
                    let name: String = name.chars().take(NAME_ECHO).collect();
                    return Err(self.refuse(Refusal::Repeated { place, name }));
                }
            }
            let found = map.next_value_seed(self.child(self.place.member(&name), depth))?;
            self.keep(&name, &found);
            match (&mut tree, found) {
                (Some(tree), found) => {
                    tree.insert(name.into_owned(), found.into_value());
                }
                (None, Found::Tree(Value::Object(params))) if envelope && name == "params" => {
                    self.walk.current.tree = Some(params);
                }
                (None, _) => {}
            }
        }
        if envelope {
            let item = std::mem::take(&mut self.walk.current);
            self.walk.items.push(item);
        }
        Ok(tree.map_or(Found::Object, |t| Found::Tree(Value::Object(t))))
    }
}

impl<'de> Node<'_, 'de> {
    /// Keeps what the gateway reads of a member just walked, in the message
    /// being walked (messages never nest: only a body or a batch element is one).
    fn keep(&mut self, name: &str, found: &Found<'de>) {
        let item = &mut self.walk.current;
        match (self.place, name) {
            (Place::Top | Place::BatchItem, "jsonrpc") => item.jsonrpc = found.str(),
            (Place::Top | Place::BatchItem, "id") => item.id = found.id(),
            (Place::Top | Place::BatchItem, "method") => {
                item.has_method = true;
                item.method = found.str();
            }
            (Place::Top | Place::BatchItem, "result" | "error") => item.answer = true,
            (Place::Top | Place::BatchItem, "params") => {
                item.params = if found.is_object() { Params::Object } else { Params::Other };
            }
            (Place::Params, "name") => item.name = found.str(),
            (Place::Params, "uri") => item.uri = found.str(),
            (Place::Meta, PROTOCOL_VERSION) => {
                item.has_meta_version = true;
                item.meta_version = found.str();
            }
            _ => {}
        }
    }

    /// A scalar number, as a tree where one is built.
    fn number(&self, n: Number) -> Found<'de> {
        if self.build {
            Found::Tree(Value::Number(n))
        } else {
            Found::Number(n)
        }
    }
}

/// A member name: borrowed from the body unless it holds escapes.
struct NameSeed;

impl<'de> DeserializeSeed<'de> for NameSeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Cow<'de, str>, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for NameSeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(s))
    }

    fn visit_str<E>(self, s: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s.to_owned()))
    }
}

/// The member names of one object seen so far: a short list kept inline
/// (no allocation for the objects requests carry), then a set.
struct Names<'n> {
    few: [Option<Cow<'n, str>>; SCAN_NAMES],
    len: usize,
    many: HashSet<Cow<'n, str>>,
}

impl Default for Names<'_> {
    fn default() -> Self {
        Names { few: [const { None }; SCAN_NAMES], len: 0, many: HashSet::new() }
    }
}

impl<'n> Names<'n> {
    /// Whether `name` is new.
    fn insert(&mut self, name: Cow<'n, str>) -> bool {
        if self.len < SCAN_NAMES {
            if self.few[..self.len].iter().flatten().any(|n| *n == name) {
                return false;
            }
            self.few[self.len] = Some(name);
            self.len += 1;
            return true;
        }
        if self.many.is_empty() {
            self.many.extend(self.few.iter_mut().filter_map(Option::take));
        }
        self.many.insert(name)
    }
}

#[cfg(test)]
mod tests;
