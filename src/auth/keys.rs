//! Static API keys, looked up: built from a key file's keys as the
//! configuration read them ([`crate::config::keys`]). A presented key is
//! hashed; the digests sharing its first 8 bytes (an index, so a lookup does
//! not grow with the key count) are compared with it in constant time. What
//! the index's timing can tell is about digests of keys, which do not give
//! the keys back.

use std::collections::HashMap;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use crate::config::keys::{check_id, ApiKey as Key, ApiKeys, MAX_KEYS};

/// The keys of one policy, indexed.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    keys: Arc<[Key]>,
    /// The first 8 bytes of each digest → the keys with them.
    index: HashMap<[u8; 8], Vec<usize>>,
}

impl Keys {
    /// Indexes `keys` (shared with the configuration, not copied).
    pub fn new(keys: &ApiKeys) -> Keys {
        let mut index: HashMap<[u8; 8], Vec<usize>> = HashMap::new();
        for (i, key) in keys.0.iter().enumerate() {
            index.entry(prefix(&key.digest)).or_default().push(i);
        }
        Keys { keys: keys.0.clone(), index }
    }

    /// Parses a key file and indexes it; the error names the line.
    pub fn parse(text: &str) -> Result<Keys, String> {
        ApiKeys::parse(text).map(|keys| Keys::new(&keys))
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

/// The line of a key file for a key with this id.
pub fn file_line(id: &str, key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    format!("{id} {}", crate::seal::hex(&digest))
}

fn prefix(digest: &[u8; 32]) -> [u8; 8] {
    digest[..8].try_into().expect("8 of 32 bytes")
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
        let dup = format!("{}\n{}", file_line("a", "x"), file_line("a", "y"));
        assert!(Keys::parse(&dup).unwrap_err().contains("line 2"));
    }
}
