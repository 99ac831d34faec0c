//! Static API keys: a file of SHA-256 digests, one key per line
//! (`<key id> <sha256 hex of the key> [group,group…]`, `#` comments), so the
//! file holds no secret. A presented key is hashed; the digests sharing its
//! first 8 bytes (an index, so a lookup does not grow with the key count) are
//! compared with it in constant time. What the index's timing can tell is
//! about digests of keys, which do not give the keys back.

use std::collections::{HashMap, HashSet};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// One configured key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub id: String,
    digest: [u8; 32],
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keys {
    keys: Vec<Key>,
    /// The first 8 bytes of each digest → the keys with them.
    index: HashMap<[u8; 8], Vec<usize>>,
}

/// The most keys a file may hold (`config::file::Kind::ApiKeys` is sized for them).
pub const MAX_KEYS: usize = 100_000;

impl Keys {
    /// Parses a key file; the error names the line.
    pub fn parse(text: &str) -> Result<Keys, String> {
        let mut keys: Vec<Key> = Vec::new();
        // A set, not a scan of `keys`: 100,000 keys load in linear time.
        let mut ids: HashSet<&str> = HashSet::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let at = n + 1;
            let mut fields = line.split_whitespace();
            let (Some(id), Some(hex), groups) = (fields.next(), fields.next(), fields.next()) else {
                return Err(format!("line {at}: expected `<key id> <sha256 hex> [groups]`"));
            };
            if fields.next().is_some() {
                return Err(format!("line {at}: too many fields"));
            }
            check_id(id).map_err(|e| format!("line {at}: {e}"))?;
            let digest =
                decode_hex(hex).ok_or_else(|| format!("line {at}: the digest must be 64 hex digits"))?;
            if !ids.insert(id) {
                return Err(format!("line {at}: key id `{id}` is listed twice"));
            }
            let groups = groups.map(|g| g.split(',').map(str::to_string).collect()).unwrap_or_default();
            keys.push(Key { id: id.to_string(), digest, groups });
            if keys.len() > MAX_KEYS {
                return Err(format!("more than {MAX_KEYS} keys"));
            }
        }
        let mut index: HashMap<[u8; 8], Vec<usize>> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            index.entry(prefix(&key.digest)).or_default().push(i);
        }
        Ok(Keys { keys, index })
    }

    /// The key `presented` is, if any.
    pub fn find(&self, presented: &str) -> Option<&Key> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for &i in self.index.get(&prefix(&digest)).map(Vec::as_slice).unwrap_or_default() {
            if bool::from(self.keys[i].digest.ct_eq(&digest)) {
                found = Some(&self.keys[i]);
            }
        }
        found
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// A key id: 1 to 128 letters, digits, `-`, `_` or `.`.
pub fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty()
        || id.len() > 128
        || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err("a key id is 1 to 128 letters, digits, `-`, `_` or `.`".into());
    }
    Ok(())
}

/// The line of a key file for a key with this id.
pub fn file_line(id: &str, key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    format!("{id} {}", crate::seal::hex(&digest))
}

fn prefix(digest: &[u8; 32]) -> [u8; 8] {
    digest[..8].try_into().expect("8 of 32 bytes")
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_by_its_digest_and_nothing_else() {
        let text = format!(
            "# ops keys\n{} ops,admin\n\n{}  # ci\n",
            file_line("alice", "s3cret"),
            file_line("ci", "other")
        );
        let keys = Keys::parse(&text).unwrap();
        assert_eq!(keys.len(), 2);
        let alice = keys.find("s3cret").unwrap();
        assert_eq!(
            (alice.id.as_str(), alice.groups.clone()),
            ("alice", vec!["ops".to_string(), "admin".into()])
        );
        assert_eq!(keys.find("other").unwrap().id, "ci");
        assert!(keys.find("s3cret ").is_none());
        assert!(keys.find("").is_none());
    }

    #[test]
    fn bad_files_name_the_line() {
        assert!(Keys::parse("alice").unwrap_err().contains("line 1"));
        assert!(Keys::parse("alice abc").unwrap_err().contains("64 hex"));
        let dup = format!("{}\n{}", file_line("a", "x"), file_line("a", "y"));
        assert!(Keys::parse(&dup).unwrap_err().contains("line 2"));
        assert!(Keys::parse(&format!("{} g extra", file_line("a", "x"))).unwrap_err().contains("too many"));
        assert!(Keys::parse(&file_line("a b", "x")).is_err());
    }
}
