//! A JWKS document read into verification keys, for [`super::jwt`]: a
//! policy's JWKS file when its verifier is built (and by `check-config`),
//! a JWKS URL's answer on each fetch.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};

/// One verification key of the JWKS.
pub struct Key {
    pub kid: Option<String>,
    pub key: DecodingKey,
    pub algorithm: Algorithm,
}

/// The keys of a JWKS document usable with `algorithms`. Symmetric (`oct`)
/// keys are never taken from a JWKS: HS256 uses the configured secret only.
pub fn parse_jwks(body: &[u8], algorithms: &[Algorithm]) -> Result<Vec<Key>, String> {
    let set: JwkSet = serde_json::from_slice(body).map_err(|e| format!("not a JWKS: {e}"))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        let algorithm = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
            AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
            _ => continue,
        };
        if !algorithms.contains(&algorithm) {
            continue;
        }
        if let Some(declared) = jwk.common.key_algorithm {
            if format!("{declared:?}") != format!("{algorithm:?}") {
                continue;
            }
        }
        let Ok(key) = DecodingKey::from_jwk(jwk) else { continue };
        keys.push(Key { kid: jwk.common.key_id.clone(), key, algorithm });
    }
    Ok(keys)
}
