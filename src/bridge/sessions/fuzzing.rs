//! What the fuzz targets reach inside the legacy bridge: the upstream HTTP/1.1
//! client over an in-memory stream, and the openers of sealed values.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};

use super::state::{self, Expect, FlowState};
use super::{cursor, Caller};
use crate::config::{Config, Route, SealKey};
use crate::front::{Call, Message};
use crate::seal::Sealer;
use crate::upstream::h1;
use crate::upstream::SessionWire;

/// A response as the h1 client read it, body and all.
pub struct H1Response {
    pub status: u16,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// Sends a bodiless `method` request over `io` and reads the whole response.
/// The error is the parser's own message for a refused head or body, so a
/// target can tell a deliberate refusal from a broken read.
pub async fn h1_exchange<S>(method: &str, io: S) -> Result<H1Response, String>
where
    S: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static,
{
    static CLIENT: OnceLock<h1::Client> = OnceLock::new();
    let client = CLIENT.get_or_init(|| {
        let tls = Arc::new(crate::upstream::transport::rustls_config());
        let settings = h1::Settings {
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::ZERO,
            max_idle: 0,
        };
        h1::Client::new(&"http://upstream.invalid/mcp".parse().expect("a URL"), tls, settings).expect("http")
    });
    let resp = client.send_over(Box::new(io), method, &[], b"").await.map_err(|e| match e {
        h1::Error::Invalid(what) => what.to_string(),
        e => e.to_string(),
    })?;
    let headers = resp.raw_headers().map(|(n, v)| (n.to_ascii_lowercase(), v.to_vec())).collect();
    let status = resp.status;
    let body = resp.body.collect().await.map_err(|e| e.to_string())?.to_bytes().to_vec();
    Ok(H1Response { status, headers, body })
}

/// A sealer (two keys, as after a rotation) and one request to open
/// `requestState` and cursors against.
pub struct Seals {
    sealer: Sealer,
    route: Arc<Route>,
    call: Call,
    caller: Caller,
    state: FlowState,
}

impl Default for Seals {
    fn default() -> Seals {
        let config = Config::single("http://127.0.0.1:1/mcp", "127.0.0.1:0".parse().expect("an address"))
            .expect("a valid config");
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "ask", "arguments": {"x": 1}, "_meta": {
                "io.modelcontextprotocol/protocolVersion": crate::front::SUPPORTED_VERSIONS[0],
                "io.modelcontextprotocol/clientCapabilities": {}}}});
        let mut headers = http::HeaderMap::new();
        headers.insert("mcp-protocol-version", crate::front::SUPPORTED_VERSIONS[0].parse().expect("ascii"));
        headers.insert("mcp-method", "tools/call".parse().expect("ascii"));
        headers.insert("mcp-name", "ask".parse().expect("ascii"));
        let call = match crate::front::parse(&headers, body.to_string().as_bytes()) {
            Ok(Message::Call(call)) => *call,
            other => panic!("the fixture request is valid: {other:?}"),
        };
        let caller = Caller {
            principal: "anonymous".into(),
            headers,
            body: Default::default(),
            forwarded: false,
            access: None,
        };
        let state = FlowState {
            route: "/mcp".into(),
            instance: String::new(),
            session_id: Some("s".into()),
            session_version: None,
            owner: "gw".into(),
            owner_address: None,
            upstream_id: Some(1),
            last_event_id: None,
            flow: "flow".into(),
            questions: Default::default(),
            principal: caller.principal.clone(),
            method: "tools/call".into(),
            name: call.name.clone(),
            params_digest: state::params_digest(&call.params),
            issued_ms: 0,
            expires_ms: u64::MAX,
            round: 1,
            reissue: false,
            answers: None,
        };
        // Keys of this process only: a blob sealed by an earlier run (kept in
        // a corpus) must not open.
        let sealer = Sealer::new(vec![
            SealKey { id: "new".into(), bytes: rand::random() },
            SealKey { id: "old".into(), bytes: rand::random() },
        ]);
        Seals { sealer, route: config.routes[0].clone(), call, caller, state }
    }
}

impl Seals {
    /// A freshly sealed `requestState` that [`Seals::open_state`] accepts.
    pub fn seal_state(&self) -> String {
        state::seal(&self.sealer, &self.state).expect("the fixture state fits")
    }

    /// A freshly sealed cursor that [`Seals::open_cursor`] accepts.
    pub fn seal_cursor(&self) -> String {
        let wire = SessionWire { id: Some("s".into()), version: None, owner: None };
        cursor::seal(
            &self.sealer,
            &self.route,
            &self.call,
            &self.caller,
            "http://127.0.0.1:1/mcp",
            &wire,
            "next",
        )
        .expect("the fixture cursor fits")
    }

    /// Whether `blob` opens as this request's `requestState`.
    pub fn open_state(&self, blob: &str) -> bool {
        let expect = Expect {
            route: &self.route.id,
            method: self.call.method.as_str(),
            principal: &self.caller.principal,
            name: self.call.name.as_deref(),
            params_digest: &self.state.params_digest,
            now_ms: state::now_ms(),
        };
        state::open(&self.sealer, blob, &expect).is_ok()
    }

    /// A freshly sealed legacy session id that [`Seals::open_session`] accepts.
    pub fn seal_session(&self) -> String {
        crate::bridge::session_token::issue(&self.sealer, &self.session_claims())
            .expect("the fixture token fits")
    }

    /// Whether `blob` opens as the legacy session id of this route and principal.
    pub fn open_session(&self, blob: &str) -> bool {
        let c = self.session_claims();
        crate::bridge::session_token::open(&self.sealer, blob, &c.route, &c.principal, 1).is_ok()
    }

    fn session_claims(&self) -> crate::bridge::session_token::Claims {
        crate::bridge::session_token::Claims {
            route: self.route.id.clone(),
            instance: self.route.upstream.urls[0].to_string(),
            upstream_session: Some("s".into()),
            version: Some("2025-11-25".into()),
            principal: self.caller.principal.clone(),
            issued: 0,
            expires: u64::MAX,
            translated: None,
        }
    }

    /// Whether `blob`, as `params.cursor`, opens as this request's cursor.
    pub fn open_cursor(&self, blob: &str) -> bool {
        let mut call = self.call.clone();
        call.params.insert("cursor".into(), Value::String(blob.into()));
        matches!(cursor::open(&self.sealer, &self.route, &call, &self.caller), Ok(Some(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixture_opens_its_own_blobs_only() {
        let seals = Seals::default();
        let (state, cursor) = (seals.seal_state(), seals.seal_cursor());
        assert!(seals.open_state(&state) && seals.open_cursor(&cursor));
        assert!(!seals.open_state(&cursor) && !seals.open_cursor(&state), "each is bound to its use");
        let session = seals.seal_session();
        assert!(seals.open_session(&session));
        assert!(!seals.open_session(&state) && !seals.open_state(&session) && !seals.open_cursor(&session));
        assert!(!Seals::default().open_state(&state), "another process's keys do not open it");
    }
}
