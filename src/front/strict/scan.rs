//! The walk itself: one pass over the body's bytes, by hand. It accepts and
//! refuses exactly what serde_json's reader does (the same grammar, the same
//! string, escape and UTF-8 rules, numbers judged by serde_json itself
//! where their range is in doubt), in the same order, with the rules of
//! [`super`] on top; what it keeps of a message is what the gateway reads.
//! By hand because serde's visitors cost about ten times the bytes' worth
//! per member on the small bodies calls are, and every request pays it.

use std::borrow::Cow;

use serde_json::{Map, Number, Value};

use super::{other_case, Id, Item, Message, Names, Params, Place, Refusal, Shape, MAX_DEPTH, NAME_ECHO};
use crate::front::meta::PROTOCOL_VERSION;

const EOF: Refusal = Refusal::Malformed("the body ends before its JSON does");
const INVALID: Refusal = Refusal::Malformed("the body is not valid JSON");
const DEEP: Refusal = Refusal::Malformed("arrays and objects nested more than 127 deep");
const OUT_OF_RANGE: Refusal = Refusal::Malformed("a number outside the range of a double");
const SURROGATE: Refusal = Refusal::Malformed("a lone surrogate or a bad \\u escape in a string");
const BAD_UTF8: Refusal = Refusal::Malformed("invalid UTF-8");
const CONTROL: Refusal = Refusal::Malformed("a control character in a string");

/// Integers of at most this many digits are within a double's range
/// without asking (10^308 < f64::MAX).
const SAFE_DIGITS: usize = 308;

pub(super) fn walk(body: &[u8], trees: bool) -> Result<Message<'_>, Refusal> {
    // Checked once for the whole body, strings are then cut from it without
    // checking each; a body that is not UTF-8 has each string checked as
    // it is read, so that what is refused first is what serde_json refuses.
    let text = std::str::from_utf8(body).ok();
    let mut scan = Scan { body, text, at: 0, trees, items: Vec::new(), current: Item::default() };
    let found = scan.value(0, Place::Top, false)?;
    scan.skip_space();
    if scan.at != body.len() {
        return Err(INVALID);
    }
    let shape = match found {
        Found::Object => Shape::Object,
        Found::Array => Shape::Batch,
        _ => Shape::Other,
    };
    Ok(Message { shape, items: scan.items })
}

/// What kind of value was walked, with what the envelope reads of it; or
/// the value itself, where a tree is built.
enum Found<'a> {
    Null,
    Bool(bool),
    /// A number's text, checked to be within range.
    Number(&'a str),
    Str(Cow<'a, str>),
    Array,
    Object,
    Tree(Value),
}

impl<'a> Found<'a> {
    fn str(&self) -> Option<Cow<'a, str>> {
        match self {
            Found::Str(s) => Some(s.clone()),
            _ => None,
        }
    }

    fn id(&self) -> Id {
        match self {
            Found::Null => Id::Null,
            Found::Str(s) => Id::Usable(Value::String(s.to_string())),
            // Checked when walked: it has a value.
            Found::Number(text) => number(text).map_or(Id::Other, |n| Id::Usable(Value::Number(n))),
            _ => Id::Other,
        }
    }

    fn is_object(&self) -> bool {
        matches!(self, Found::Object | Found::Tree(Value::Object(_)))
    }

    /// The value of a member or element of a tree being built.
    fn into_value(self) -> Value {
        match self {
            Found::Tree(v) => v,
            Found::Null => Value::Null,
            Found::Bool(b) => Value::Bool(b),
            Found::Str(s) => Value::String(s.into_owned()),
            Found::Number(text) => number(text).map_or(Value::Null, Value::Number),
            // Only trees are built below a tree: nothing else reaches here.
            Found::Array | Found::Object => Value::Null,
        }
    }
}

struct Scan<'a> {
    body: &'a [u8],
    /// The body, when it is UTF-8.
    text: Option<&'a str>,
    at: usize,
    /// Whether `params` is built as a tree.
    trees: bool,
    items: Vec<Item<'a>>,
    /// The message being walked (messages never nest: only a body or a
    /// batch element is one).
    current: Item<'a>,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.body.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// One value; `depth`: the arrays and objects around it; `build`: it
    /// is `params` or inside it, and a tree is asked for.
    fn value(&mut self, depth: usize, place: Place, build: bool) -> Result<Found<'a>, Refusal> {
        self.skip_space();
        let Some(first) = self.peek() else { return Err(EOF) };
        match first {
            b'{' => {
                self.at += 1;
                self.object(depth + 1, place, build)
            }
            b'[' => {
                self.at += 1;
                self.array(depth + 1, place, build)
            }
            b'"' => {
                self.at += 1;
                Ok(Found::Str(self.string()?))
            }
            b'-' | b'0'..=b'9' => {
                let text = self.number_text()?;
                if build {
                    return Ok(Found::Tree(Value::Number(number(text)?)));
                }
                in_range(text)?;
                Ok(Found::Number(text))
            }
            b't' => self.word(b"true").map(|()| Found::Bool(true)),
            b'f' => self.word(b"false").map(|()| Found::Bool(false)),
            b'n' => self.word(b"null").map(|()| Found::Null),
            _ => Err(INVALID),
        }
    }

    fn object(&mut self, depth: usize, place: Place, build: bool) -> Result<Found<'a>, Refusal> {
        if depth > MAX_DEPTH {
            return Err(DEEP);
        }
        let envelope = matches!(place, Place::Top | Place::BatchItem);
        if envelope {
            self.current = Item { object: true, ..Item::default() };
        }
        let unique = place.unique();
        // Not in an `Option`: the list is a few hundred bytes, made in
        // place rather than moved.
        let mut names = Names::default();
        let mut tree = build.then(Map::new);
        let mut first = true;
        loop {
            self.skip_space();
            match self.peek() {
                None => return Err(EOF),
                Some(b'}') => {
                    self.at += 1;
                    break;
                }
                Some(b'"') if first => {}
                Some(b',') if !first => {
                    self.at += 1;
                    self.skip_space();
                    match self.peek() {
                        None => return Err(EOF),
                        Some(b'"') => {}
                        Some(_) => return Err(INVALID),
                    }
                }
                Some(_) => return Err(INVALID),
            }
            first = false;
            self.at += 1;
            let name = self.string()?;
            if let Some(place) = unique {
                if !names.insert(&name) {
                    let name: String = name.chars().take(NAME_ECHO).collect();
                    return Err(Refusal::Repeated { place, name });
                }
            }
            if envelope && other_case(&name) {
                return Err(Refusal::OtherCase { name: name.chars().take(NAME_ECHO).collect() });
            }
            self.skip_space();
            match self.peek() {
                None => return Err(EOF),
                Some(b':') => self.at += 1,
                Some(_) => return Err(INVALID),
            }
            let member = place.member(&name);
            let found = self.value(depth, member, build || (member == Place::Params && self.trees))?;
            self.keep(place, &name, &found);
            match (&mut tree, found) {
                (Some(tree), found) => {
                    tree.insert(name.into_owned(), found.into_value());
                }
                (None, Found::Tree(Value::Object(params))) if member == Place::Params => {
                    self.current.tree = Some(params);
                }
                (None, _) => {}
            }
        }
        if envelope {
            let item = std::mem::take(&mut self.current);
            self.items.push(item);
        }
        Ok(tree.map_or(Found::Object, |t| Found::Tree(Value::Object(t))))
    }

    fn array(&mut self, depth: usize, place: Place, build: bool) -> Result<Found<'a>, Refusal> {
        if depth > MAX_DEPTH {
            return Err(DEEP);
        }
        let top = place == Place::Top;
        let element = if top { Place::BatchItem } else { Place::Inside };
        let mut tree = build.then(Vec::new);
        let mut first = true;
        loop {
            self.skip_space();
            match self.peek() {
                None => return Err(EOF),
                Some(b']') => {
                    self.at += 1;
                    break;
                }
                Some(b',') if !first => {
                    self.at += 1;
                    self.skip_space();
                    match self.peek() {
                        None => return Err(EOF),
                        Some(b']') => return Err(INVALID),
                        Some(_) => {}
                    }
                }
                Some(_) if first => {}
                Some(_) => return Err(INVALID),
            }
            first = false;
            let found = self.value(depth, element, build)?;
            // A batch element that is not an object is a message still (an
            // invalid one); an object pushed itself.
            if top && !matches!(found, Found::Object) {
                self.items.push(Item::default());
            }
            if let Some(tree) = &mut tree {
                tree.push(found.into_value());
            }
        }
        Ok(tree.map_or(Found::Array, |t| Found::Tree(Value::Array(t))))
    }

    /// Keeps what the gateway reads of a member of an object at `place`.
    fn keep(&mut self, place: Place, name: &str, found: &Found<'a>) {
        let item = &mut self.current;
        match (place, name) {
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

    /// `true`, `false` or `null`, its first byte seen.
    fn word(&mut self, word: &[u8]) -> Result<(), Refusal> {
        for &expected in &word[1..] {
            self.at += 1;
            match self.peek() {
                None => return Err(EOF),
                Some(b) if b == expected => {}
                Some(_) => return Err(INVALID),
            }
        }
        self.at += 1;
        Ok(())
    }

    /// A number's text, by JSON's grammar (range not yet judged).
    fn number_text(&mut self) -> Result<&'a str, Refusal> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            None => return Err(EOF),
            Some(b'0') => {
                self.at += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(INVALID);
                }
            }
            Some(b'1'..=b'9') => self.digits(),
            Some(_) => return Err(INVALID),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.some_digits()?;
        }
        // ASCII by construction.
        self.slice(start, self.at).map_err(|_| INVALID)
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Result<(), Refusal> {
        match self.peek() {
            None => Err(EOF),
            Some(b'0'..=b'9') => {
                self.digits();
                Ok(())
            }
            Some(_) => Err(INVALID),
        }
    }

    /// A string, its opening quote read: borrowed from the body unless it
    /// holds escapes.
    fn string(&mut self) -> Result<Cow<'a, str>, Refusal> {
        let body = self.body;
        let start = self.at;
        let mut i = plain_run(body, start);
        while let Some(&b) = body.get(i) {
            match b {
                b'"' => {
                    self.at = i + 1;
                    return self.slice(start, i).map(Cow::Borrowed);
                }
                b'\\' => return self.escaped(start, i).map(Cow::Owned),
                0..0x20 => return Err(CONTROL),
                _ => i += 1,
            }
        }
        Err(EOF)
    }

    /// The body's bytes `start..end` as text.
    fn slice(&self, start: usize, end: usize) -> Result<&'a str, Refusal> {
        match self.text {
            Some(text) => text.get(start..end).ok_or(BAD_UTF8),
            None => std::str::from_utf8(&self.body[start..end]).map_err(|_| BAD_UTF8),
        }
    }

    /// The rest of a string from its first escape at `i`.
    fn escaped(&mut self, start: usize, mut i: usize) -> Result<String, Refusal> {
        let body = self.body;
        let mut out = Vec::with_capacity(i - start + 16);
        out.extend_from_slice(&body[start..i]);
        loop {
            let Some(&b) = body.get(i) else { return Err(EOF) };
            i += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    let Some(&e) = body.get(i) else { return Err(EOF) };
                    i += 1;
                    let byte = match e {
                        b'"' | b'\\' | b'/' => e,
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => {
                            let c = unicode_escape(body, &mut i)?;
                            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                            continue;
                        }
                        _ => return Err(INVALID),
                    };
                    out.push(byte);
                }
                0..0x20 => return Err(CONTROL),
                _ => out.push(b),
            }
        }
        self.at = i;
        String::from_utf8(out).map_err(|_| BAD_UTF8)
    }
}

/// The character of a `\u` escape whose `u` was read at `*i - 1`: a
/// surrogate only as the first of a pair.
fn unicode_escape(body: &[u8], i: &mut usize) -> Result<char, Refusal> {
    let n = hex4(body, i)?;
    let c = match n {
        0xDC00..=0xDFFF => return Err(SURROGATE),
        0xD800..=0xDBFF => {
            for expected in [b'\\', b'u'] {
                match body.get(*i) {
                    None => return Err(EOF),
                    Some(&b) if b == expected => *i += 1,
                    Some(_) => return Err(SURROGATE),
                }
            }
            let low = hex4(body, i)?;
            if !(0xDC00..=0xDFFF).contains(&low) {
                return Err(SURROGATE);
            }
            0x1_0000 + (((n - 0xD800) << 10) | (low - 0xDC00))
        }
        n => n,
    };
    char::from_u32(c).ok_or(SURROGATE)
}

/// Where the run of bytes from `i` that need no look (no quote, backslash
/// or control character) ends, eight at a time, or where the last whole
/// eight end; the byte there is looked at.
fn plain_run(body: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_in = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    while let Some(chunk) = body.get(i..i + 8) {
        let v = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let special =
            v.wrapping_sub(ONES * 0x20) & !v & HIGH | zero_in(v ^ (ONES * 0x22)) | zero_in(v ^ (ONES * 0x5c));
        if special != 0 {
            // The lowest flag is exact (no borrow reaches below the first
            // byte that sets one): the first byte that needs a look.
            return i + (special.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i
}

fn hex4(body: &[u8], i: &mut usize) -> Result<u32, Refusal> {
    let Some(digits) = body.get(*i..*i + 4) else { return Err(EOF) };
    let mut n = 0;
    for &d in digits {
        let v = (d as char).to_digit(16).ok_or(INVALID)?;
        n = n * 16 + v;
    }
    *i += 4;
    Ok(n)
}

/// A number's value, as serde_json reads it (a plain integer that fits is
/// read here; any other by serde_json, so that the tree holds what it would).
fn number(text: &str) -> Result<Number, Refusal> {
    if text.len() <= 19 && text.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = text.parse::<u64>() {
            return Ok(n.into());
        }
    }
    serde_json::from_str::<Number>(text).map_err(|_| OUT_OF_RANGE)
}

/// Refuses a number outside a double's range (judged by serde_json, unless
/// it is an integer short enough to be within it).
fn in_range(text: &str) -> Result<(), Refusal> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.len() <= SAFE_DIGITS && digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(());
    }
    number(text).map(|_| ())
}
