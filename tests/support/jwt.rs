//! Test tokens: keys of each algorithm the gateway verifies (RS256 from a
//! fixed test-only key, ES256 and EdDSA generated per run, HS256 from a
//! secret), their JWKS, and claims to sign.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

/// A 2048-bit RSA key made for these tests only (PKCS#1 DER), and its public parts.
const RSA_DER: &str = "MIIEowIBAAKCAQEA6cMAa3TnQL7rozl1Y3jopTKnOY1hN3+udh2F3y1kZ5oQiADAz91yTLK/j8ViiOeoZi3xR+gfJb4ogPw90Psk/qBIq71eNvSRBkAS9QFSOujPspPBim3suvGVr0eCcNVnG/9ULcToJSb1zUdSqszbb8pOw4TMhBBOosrI7tE92C5xTQ2k57vfygILZ2so6k0RkWgClzvlXVk81K4YQfjL4UFwEPu5TlHrnquTooAsKZ3SAlvEnKTp2zUuXuLpexRFbx5SjEDT4AuQdvBo2Q0hUmQWwBYHhCIy83F/msjHP5csWLJqONjhZMHbqkBvoY0/iyAKWDepNqMdl0TC7NvrfwIDAQABAoIBAA1cPCQ9ceYibfyjO7wBXL1BsDW63d6P0/HOQtN8QwEk2LhdNVKWuSynCV8h4egp4qxhsyjv8a/KNthrEkFlHo/Vq1xIHiANSaijdYc+mcDiLioVBc/FSULErKXFntqXZ9A9f0XVEODmts+9DtLSPeHIHJ5SHbpCkFaqOQ0P38qrfjdte43sI2VIdoC/LOKdEBBIuXrx8XlW6W8/CbnokoK30HeXktIlIOK2KX7U80Vecq2U2UJ8BBPeLXff13KTRrSurGfyQkZay61187r7urnhCxHiNDA86zoCtgC3zH64HK8UdV9hf2bIbA6ntRI2FUB2XpvNeZp2NuuQf0/NEyECgYEA+uHggjlf5d53exE/+Gh7+OdKzMz8xTBO7EhkY1EkekrSsVzfSXe79mqfEqVbv2ojla2iwkRnml5ECPBqjBP5gKMVvcFVdu0bGE6tAEglBFGYz3pcecvPChyuieBateEwbpDQ0xu9RckKIha/ZUyDH1GMbsZeKdH/9XDwMVIarZECgYEA7oe4RAGOk2sbT83Rf+TDFbOybL1eYGbJ7Pr5vokbGJzy49VBhTQ+3FBLjMpO5+446rOSvxezzmQddO/N9QiCookwNzU4QnUQi0bLJxKSkH0KF293HeBYY/CfjlCTe+JbqiEzASyhlIbWuBzlGCTBFAt97/EpzH3HN5xnMKWvwA8CgYBZ22cfHU+ktF6U/KOt5DZq+uSGn/D0642JAZC7Jcfr6Tq3fe0XkkQHST76XbGTyH9AT/WYoQl+d77keL+gtlLJ6R+TXFixBNGMjjlWfYCMoHEb9taCZSYdmBJHncy/kg1XvJSe2DOdeBkiBoW80X+xSvMChhgZ4HZNwYq2D5MwkQKBgGF3LZEEPdj46/kI9bDXretBOQf7vQORHLNrvf7gESVWhF0aN6KRPZpSaPyHcgSNL86fP7g7nCoaeHrevf6A0rhNbFkysuFc6jyu2bYGfcLyhNwcnMSldhioKtpBDHKThLcYx7mUHhYNntEuZWIfKpHhPD1+AoFfZ7bOfs++8/h7AoGBAIrnE2UKUhQ4nbZWHHGmgZKZWAsxnqif0zMNYVMZ1DdIZtAbBelAmUByoDxUzpCRCN2AHh+/7y3Tuxpc4CSjCP3IMynraHnRMWhAdcrPiCR7xpXKJwt6Kd9+VmLWBH8jRp3TnFKctnF6nNnvo5KUnJIDcDF8T3+DgBv2hHF7L8YX";
const RSA_N: &str = "6cMAa3TnQL7rozl1Y3jopTKnOY1hN3-udh2F3y1kZ5oQiADAz91yTLK_j8ViiOeoZi3xR-gfJb4ogPw90Psk_qBIq71eNvSRBkAS9QFSOujPspPBim3suvGVr0eCcNVnG_9ULcToJSb1zUdSqszbb8pOw4TMhBBOosrI7tE92C5xTQ2k57vfygILZ2so6k0RkWgClzvlXVk81K4YQfjL4UFwEPu5TlHrnquTooAsKZ3SAlvEnKTp2zUuXuLpexRFbx5SjEDT4AuQdvBo2Q0hUmQWwBYHhCIy83F_msjHP5csWLJqONjhZMHbqkBvoY0_iyAKWDepNqMdl0TC7Nvrfw";
const RSA_E: &str = "AQAB";

pub const ISSUER: &str = "https://idp.test";
pub const AUDIENCE: &str = "https://gw.test/jwt";
pub const HS_SECRET: &str = "an-hs256-secret-of-at-least-32-bytes!!";

/// A signing key and its JWK.
pub struct Signer {
    pub kid: String,
    pub alg: Algorithm,
    key: EncodingKey,
    pub jwk: Value,
}

impl Signer {
    pub fn rsa(kid: &str) -> Signer {
        let der = STANDARD.decode(RSA_DER).unwrap();
        let jwk = json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": RSA_N, "e": RSA_E});
        Signer { kid: kid.into(), alg: Algorithm::RS256, key: EncodingKey::from_rsa_der(&der), jwk }
    }

    pub fn ec(kid: &str) -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = pair.public_key_raw();
        let (x, y) = (&raw[1..33], &raw[33..65]);
        let jwk = json!({"kty": "EC", "kid": kid, "crv": "P-256",
            "x": URL_SAFE_NO_PAD.encode(x), "y": URL_SAFE_NO_PAD.encode(y)});
        Signer {
            kid: kid.into(),
            alg: Algorithm::ES256,
            key: EncodingKey::from_ec_der(&pair.serialize_der()),
            jwk,
        }
    }

    pub fn ed(kid: &str) -> Signer {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let jwk = json!({"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(pair.public_key_raw())});
        Signer {
            kid: kid.into(),
            alg: Algorithm::EdDSA,
            key: EncodingKey::from_ed_der(&pair.serialize_der()),
            jwk,
        }
    }

    pub fn hs() -> Signer {
        let key = EncodingKey::from_secret(HS_SECRET.as_bytes());
        Signer { kid: String::new(), alg: Algorithm::HS256, key, jwk: Value::Null }
    }

    /// A token with these claims, signed by this key (with its kid).
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        if !self.kid.is_empty() {
            header.kid = Some(self.kid.clone());
        }
        jsonwebtoken::encode(&header, claims, &self.key).unwrap()
    }
}

/// A JWKS of these keys.
pub fn jwks(signers: &[&Signer]) -> String {
    json!({"keys": signers.iter().map(|s| s.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// Valid claims for `sub`, with `scope`.
pub fn claims(sub: &str, scope: &str) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "scope": scope, "iat": now(), "exp": now() + 600})
}

/// A token whose header says `alg: none`, unsigned.
pub fn unsigned(claims: &Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    format!("{header}.{}.", URL_SAFE_NO_PAD.encode(claims.to_string()))
}

/// An HS256 token signed with the RSA key's public modulus as the secret
/// and the RSA key's kid: the key-confusion attack.
pub fn confused(kid: &str, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.into());
    let secret = URL_SAFE_NO_PAD.decode(RSA_N).unwrap();
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(&secret)).unwrap()
}
