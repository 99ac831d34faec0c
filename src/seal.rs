//! Sealing: values the gateway hands to clients and must get back unaltered
//! are encrypted and authenticated with AES-256-GCM. What is sealed, for
//! which purpose and with which checks is [`crate::sealed`]'s.
//!
//! Blob: `base64url( version ‖ key-id length ‖ key id ‖ salt(16) ‖ nonce(12) ‖ ciphertext )`.
//! Each blob is sealed under a sub-key derived with HKDF-SHA256 from the named
//! key and a fresh random salt, so the random 96-bit nonce is never the only
//! thing standing between two seals under one key (the ~2^32 random-nonce budget
//! applies per sub-key, i.e. per blob). The newest key seals; every key opens.

use std::sync::Arc;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use arc_swap::ArcSwap;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hkdf::Hkdf;
use rand::RngCore;
use sha2::Sha256;

/// A sealing key (named by id in the config, its bytes from outside the
/// routing file); its bytes never appear in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct SealKey {
    pub id: String,
    pub bytes: [u8; 32],
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SealKey({}, <redacted>)", self.id)
    }
}

const VERSION: u8 = 1;
/// The id of the random key of a process started without keys.
const EPHEMERAL: &str = "ephemeral";
const SALT_LEN: usize = 16;
const NONCE_LEN: usize = 12;
const INFO: &[u8] = b"sessionless seal v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("malformed")]
    Malformed,
    #[error("unknown key")]
    UnknownKey,
    #[error("failed authentication")]
    Forged,
}

impl SealError {
    pub fn reason(self) -> &'static str {
        match self {
            SealError::Malformed => "malformed",
            SealError::UnknownKey => "unknown_key",
            SealError::Forged => "forged",
        }
    }
}

/// Lowercase hex of `bytes` (digests and ids in tokens, labels and files).
#[inline]
pub fn hex(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    hex_into(bytes, &mut out);
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// Lowercase hex of `bytes` into `out`, which is twice as long.
pub fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (b, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
}

/// Unix time in seconds: the clock sealed expiries are written in.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub struct Sealer {
    /// Newest first; replaced whole by a reload.
    keys: ArcSwap<Vec<SealKey>>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.keys.load().iter().map(|k| k.id.clone())).finish()
    }
}

impl Sealer {
    /// `keys` newest first; with none, a random key that lives as long as this process.
    pub fn new(keys: Vec<SealKey>) -> Sealer {
        let keys = if keys.is_empty() {
            let mut bytes = [0u8; 32];
            rand::thread_rng().fill_bytes(&mut bytes);
            vec![SealKey { id: EPHEMERAL.into(), bytes }]
        } else {
            keys
        };
        Sealer { keys: ArcSwap::from_pointee(keys) }
    }

    /// Puts `keys` (newest first, at least one) in place of the current
    /// ones (a reload): the first seals from now on, every one opens.
    /// Whatever is being sealed or opened meanwhile uses the old set whole.
    pub fn replace(&self, mut keys: Vec<SealKey>) {
        if keys.is_empty() {
            return;
        }
        // The per-process key of a start without keys still opens what it
        // sealed (it never seals again).
        if let Some(ephemeral) = self.keys.load().iter().find(|k| k.id == EPHEMERAL) {
            if !keys.iter().any(|k| k.id == EPHEMERAL) {
                keys.push(ephemeral.clone());
            }
        }
        self.keys.store(Arc::new(keys));
    }

    /// The ids of the keys, newest first.
    pub fn key_ids(&self) -> Vec<String> {
        self.keys.load().iter().map(|k| k.id.clone()).collect()
    }

    fn cipher(key: &SealKey, salt: &[u8]) -> Aes256Gcm {
        let hk = Hkdf::<Sha256>::new(Some(salt), &key.bytes);
        let mut sub = [0u8; 32];
        hk.expand(INFO, &mut sub).expect("32 bytes is a valid HKDF length");
        Aes256Gcm::new((&sub).into())
    }

    /// Seals `plaintext`, bound to `aad` (which must be given again to open).
    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> String {
        let keys = self.keys.load();
        let key = &keys[0];
        let id = key.id.as_bytes();
        let mut salt_nonce = [0u8; SALT_LEN + NONCE_LEN];
        rand::thread_rng().fill_bytes(&mut salt_nonce);
        let (salt, nonce) = salt_nonce.split_at(SALT_LEN);
        let ct = Self::cipher(key, salt)
            .encrypt(Nonce::from_slice(nonce), Payload { msg: plaintext, aad })
            .expect("AES-GCM encryption does not fail for in-memory buffers");
        let mut out = Vec::with_capacity(2 + id.len() + salt_nonce.len() + ct.len());
        out.push(VERSION);
        out.push(id.len() as u8);
        out.extend_from_slice(id);
        out.extend_from_slice(&salt_nonce);
        out.extend_from_slice(&ct);
        URL_SAFE_NO_PAD.encode(out)
    }

    pub fn open(&self, aad: &[u8], blob: &str) -> Result<Vec<u8>, SealError> {
        self.open_first(&[aad], blob).map(|(_, plaintext)| plaintext)
    }

    /// Opens `blob` under the first of `aads` it was sealed with: that one's
    /// index, and the plaintext. The sub-key is derived once; each associated
    /// data tried costs one tag check.
    pub fn open_first(&self, aads: &[&[u8]], blob: &str) -> Result<(usize, Vec<u8>), SealError> {
        let raw = URL_SAFE_NO_PAD.decode(blob).map_err(|_| SealError::Malformed)?;
        let (&version, rest) = raw.split_first().ok_or(SealError::Malformed)?;
        let (&id_len, rest) = rest.split_first().ok_or(SealError::Malformed)?;
        if version != VERSION || rest.len() < id_len as usize + SALT_LEN + NONCE_LEN + 16 {
            return Err(SealError::Malformed);
        }
        let (id, rest) = rest.split_at(id_len as usize);
        let (salt, rest) = rest.split_at(SALT_LEN);
        let (nonce, ct) = rest.split_at(NONCE_LEN);
        let keys = self.keys.load();
        let key = keys.iter().find(|k| k.id.as_bytes() == id).ok_or(SealError::UnknownKey)?;
        let cipher = Self::cipher(key, salt);
        aads.iter()
            .enumerate()
            .find_map(|(i, &aad)| {
                cipher.decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad }).ok().map(|p| (i, p))
            })
            .ok_or(SealError::Forged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, b: u8) -> SealKey {
        SealKey { id: id.into(), bytes: [b; 32] }
    }

    #[test]
    fn round_trip_and_binding() {
        let s = Sealer::new(vec![key("k1", 1)]);
        let blob = s.seal(b"route", b"hello");
        assert_eq!(s.open(b"route", &blob).unwrap(), b"hello");
        assert_eq!(s.open(b"other", &blob), Err(SealError::Forged));
        assert_ne!(s.seal(b"route", b"hello"), blob, "fresh salt and nonce per seal");
    }

    #[test]
    fn every_single_bit_flip_is_rejected() {
        let s = Sealer::new(vec![key("k1", 1)]);
        let raw = URL_SAFE_NO_PAD.decode(s.seal(b"a", b"payload")).unwrap();
        for i in 0..raw.len() * 8 {
            let mut bad = raw.clone();
            bad[i / 8] ^= 1 << (i % 8);
            assert!(s.open(b"a", &URL_SAFE_NO_PAD.encode(&bad)).is_err(), "bit {i}");
        }
    }

    #[test]
    fn rotation_keeps_old_blobs_and_unknown_keys_fail() {
        let old = Sealer::new(vec![key("k1", 1)]);
        let blob = old.seal(b"", b"x");
        let rotated = Sealer::new(vec![key("k2", 2), key("k1", 1)]);
        assert_eq!(rotated.open(b"", &blob).unwrap(), b"x");
        let fresh = rotated.seal(b"", b"y");
        assert_eq!(old.open(b"", &fresh), Err(SealError::UnknownKey));
        assert_eq!(old.open(b"", "!!"), Err(SealError::Malformed));
    }

    #[test]
    fn open_first_names_the_associated_data_that_opened() {
        let s = Sealer::new(vec![key("k1", 1)]);
        let blob = s.seal(b"b", b"x");
        assert_eq!(s.open_first(&[b"a", b"b", b"c"], &blob), Ok((1, b"x".to_vec())));
        assert_eq!(s.open_first(&[b"a", b"c"], &blob), Err(SealError::Forged));
        assert_eq!(s.open_first(&[], &blob), Err(SealError::Forged));
    }
}
