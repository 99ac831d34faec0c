//! An `api_key` policy's key file, validated into plain values: one key per
//! line (`<key id> <sha256 hex of the key> [group,group…]`, `#` comments),
//! so the file holds no secret. `crate::auth::keys` builds the lookup the
//! gateway answers requests with from these.

use std::collections::HashSet;
use std::sync::Arc;

/// The most keys a file may hold (`super::file::Kind::ApiKeys` is sized for them).
pub const MAX_KEYS: usize = 100_000;

/// One configured key: its id, the SHA-256 digest of the key, its groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub id: String,
    pub digest: [u8; 32],
    pub groups: Vec<String>,
}

/// The keys of one file, in its order; each id once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiKeys(pub Arc<[ApiKey]>);

impl ApiKeys {
    /// Parses a key file; the error names the line.
    pub fn parse(text: &str) -> Result<ApiKeys, String> {
        let mut keys: Vec<ApiKey> = Vec::new();
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
            keys.push(ApiKey { id: id.to_string(), digest, groups });
            if keys.len() > MAX_KEYS {
                return Err(format!("more than {MAX_KEYS} keys"));
            }
        }
        Ok(ApiKeys(keys.into()))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
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

    /// A line of a key file for `key` (what `crate::auth::keys::file_line` writes).
    fn line(id: &str, key: &str) -> String {
        use sha2::{Digest, Sha256};
        format!("{id} {}", crate::seal::hex(&Sha256::digest(key.as_bytes())))
    }

    #[test]
    fn bad_files_name_the_line() {
        assert!(ApiKeys::parse("alice").unwrap_err().contains("line 1"));
        assert!(ApiKeys::parse("alice abc").unwrap_err().contains("64 hex"));
        let dup = format!("{}\n{}", line("a", "x"), line("a", "y"));
        assert!(ApiKeys::parse(&dup).unwrap_err().contains("line 2"));
        assert!(ApiKeys::parse(&format!("{} g extra", line("a", "x"))).unwrap_err().contains("too many"));
        assert!(ApiKeys::parse(&line("a b", "x")).is_err());
    }

    #[test]
    fn comments_and_blank_lines_are_skipped_and_groups_read() {
        let keys = ApiKeys::parse(&format!(
            "# ops\n{} ops,admin\n\n{}  # ci\n",
            line("alice", "k"),
            line("ci", "o")
        ))
        .unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.0[0].groups, ["ops", "admin"]);
        assert!(keys.0[1].groups.is_empty());
    }
}
