//! Advertised names on a federated route (DESIGN §11): a member's tools and
//! prompts as `<member>__<name>`, its resource URIs as `<member>+<uri>`. A
//! name depends only on the member and the original, so every replica (and
//! every authorization rule) sees the same one. Every advertised tool and
//! prompt name matches `^[A-Za-z0-9_-]{1,64}$`; where `<member>__<name>`
//! would not, the name is shortened and cleaned and ends in a short hash of
//! the original, which only the member's own list can resolve back.

use sha2::{Digest, Sha256};

/// Between a member's name and a tool's or prompt's.
pub const SEPARATOR: &str = "__";
/// Between a member's name and a resource URI (a URI scheme character that
/// a member's name never holds).
pub const URI_SEPARATOR: char = '+';
/// The longest advertised name.
pub const MAX_NAME: usize = 64;
/// Hex digits of the original's hash that end a shortened name.
const HASH_DIGITS: usize = 8;

fn allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Whether `name` is a name the strictest clients accept.
pub fn acceptable(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len()) && name.bytes().all(allowed)
}

/// The name `member`'s tool or prompt `original` is advertised under.
pub fn advertised(member: &str, original: &str) -> String {
    let plain = format!("{member}{SEPARATOR}{original}");
    if acceptable(&plain) {
        return plain;
    }
    shortened(member, original)
}

/// `<member>__<cleaned original, cut>-<hash of the original>`.
fn shortened(member: &str, original: &str) -> String {
    let digest = Sha256::digest(original.as_bytes());
    let hash: String = digest.iter().take(HASH_DIGITS / 2).map(|b| format!("{b:02x}")).collect();
    let room = MAX_NAME - member.len() - SEPARATOR.len() - 1 - HASH_DIGITS;
    let cleaned: String =
        original.chars().map(|c| if c.is_ascii() && allowed(c as u8) { c } else { '_' }).take(room).collect();
    format!("{member}{SEPARATOR}{cleaned}-{hash}")
}

/// An advertised tool or prompt name, split: the member and the rest.
pub fn split(advertised: &str) -> Option<(&str, &str)> {
    let (member, rest) = advertised.split_once(SEPARATOR)?;
    crate::config::valid_member_name(member).then_some((member, rest))
}

/// Whether `rest` (what follows `<member>__`) may be a shortened name,
/// which only the member's list resolves; any other name is its own
/// original.
pub fn may_be_shortened(rest: &str) -> bool {
    let Some((_, hash)) = rest.rsplit_once('-') else { return false };
    hash.len() == HASH_DIGITS && hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The URI `member`'s resource `uri` is advertised under.
pub fn advertised_uri(member: &str, uri: &str) -> String {
    format!("{member}{URI_SEPARATOR}{uri}")
}

/// An advertised URI, split: the member and the member's own URI.
pub fn split_uri(advertised: &str) -> Option<(&str, &str)> {
    let (member, uri) = advertised.split_once(URI_SEPARATOR)?;
    crate::config::valid_member_name(member).then_some((member, uri))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_name_is_prefixed_and_resolves_by_itself() {
        assert_eq!(advertised("legacy", "echo"), "legacy__echo");
        assert_eq!(split("legacy__echo"), Some(("legacy", "echo")));
        assert!(!may_be_shortened("echo"));
        // The first separator splits: a tool's own `__` stays its own.
        assert_eq!(split("a__b__c"), Some(("a", "b__c")));
        assert_eq!(advertised("a", "b__c"), "a__b__c");
    }

    #[test]
    fn names_outside_the_strict_pattern_are_shortened_with_a_hash() {
        for original in ["files.read", "ünïcode", &"x".repeat(100), "a b", "slash/name"] {
            let name = advertised("tsref", original);
            assert!(acceptable(&name), "{name:?} from {original:?}");
            assert!(name.starts_with("tsref__"), "{name}");
            assert!(may_be_shortened(split(&name).unwrap().1), "{name} needs the list");
        }
        assert_ne!(advertised("m", "a.b"), advertised("m", "a,b"), "the hash tells cleaned twins apart");
        assert_eq!(advertised("m", "a.b"), advertised("m", "a.b"), "the same everywhere");
        let longest = advertised("abcdefghijklmnop", &"y".repeat(300));
        assert_eq!(longest.len(), MAX_NAME);
    }

    #[test]
    fn uris_carry_their_member() {
        assert_eq!(advertised_uri("legacy", "file:///a+b"), "legacy+file:///a+b");
        assert_eq!(split_uri("legacy+file:///a+b"), Some(("legacy", "file:///a+b")));
        assert_eq!(split_uri("file:///x"), None);
        assert_eq!(split_uri("Bad+x"), None, "not a member name");
        assert_eq!(split("Bad__x"), None);
    }
}
