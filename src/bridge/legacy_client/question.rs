//! Questions a 2026 upstream asks (`input_required`), pushed to a legacy
//! client as server-initiated requests on the SSE answer to its POST.
//!
//! Each pushed request's JSON-RPC id is a sealed token ([`crate::sealed`],
//! purpose [`Purpose::Question`]) naming the replica that holds the stream (its instance
//! id and internal address), the round, the input key, the route, the
//! principal, the session and an expiry. The client's answer may reach any
//! replica: it opens the id, refuses an answer posted on another session
//! (even of the same principal), and delivers the answer to the waiting
//! round here or forwards it, signed and with its session, to the replica
//! named (never to an address the client chose: the id is sealed), which
//! checks the session again. Rounds wait in [`Rounds`], each holding a place
//! of the shared parking places (global and per-principal caps).

use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::seal::Sealer;
use crate::sealed::{self, Bindings, Claims, Owner, Purpose, Rejected, Sealed};

/// What a pushed question's id holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuestionId {
    /// The replica holding the client's stream: instance id, internal address.
    #[serde(rename = "o")]
    pub owner: String,
    #[serde(rename = "oa", default, skip_serializing_if = "Option::is_none")]
    pub owner_address: Option<String>,
    /// The round and the upstream's input key.
    #[serde(rename = "f")]
    pub round: String,
    #[serde(rename = "k")]
    pub key: String,
    /// Route and principal the session belongs to.
    #[serde(rename = "r")]
    pub route: String,
    #[serde(rename = "p")]
    pub principal: String,
    /// The session the question was pushed on
    /// ([`Translated::session`](crate::bridge::session_token::Translated::session)).
    /// An id sealed by an older build has none: it still opens (a rolling
    /// upgrade keeps the rounds in flight), unbound, until its short expiry.
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Expiry, Unix seconds.
    #[serde(rename = "exp")]
    pub expires: u64,
}

impl Claims for QuestionId {
    const PURPOSE: Purpose = Purpose::Question;

    fn bindings(&self) -> Bindings<'_> {
        Bindings {
            route: &self.route,
            principal: &self.principal,
            method: None,
            expires_ms: Some(self.expires.saturating_mul(1000)),
            instance: None,
            owner: Some(Owner { instance: &self.owner, address: self.owner_address.as_deref() }),
        }
    }

    fn v1_aad(_: &sealed::Expect<'_>) -> Vec<u8> {
        b"legacy-question\0v1".to_vec()
    }
}

/// The id of a question; refused when it would be too long (the upstream
/// chose the input key).
pub fn mint(sealer: &Sealer, q: &QuestionId) -> Result<String, Rejected> {
    Sealed::seal(sealer, q)
}

/// Opens an answer's id, for `route` and `principal`, now. Its session is
/// the caller's to check ([`QuestionId::asked_on`]): a refusal for another
/// session is counted apart.
pub fn open(sealer: &Sealer, id: &str, route: &str, principal: &str) -> Result<QuestionId, Rejected> {
    let expect = sealed::Expect { route, principal, method: "", now_ms: sealed::now_ms() };
    Sealed::<QuestionId>::open(sealer, id, &expect).map(Sealed::into_claims)
}

impl QuestionId {
    /// Whether the question was pushed on `session` (`None`: a forwarded
    /// answer that came without one, which cannot be checked). An id from
    /// an older build names no session and is taken on any of its
    /// principal's.
    pub fn asked_on(&self, session: Option<&str>) -> bool {
        self.session.as_deref().is_none_or(|s| session == Some(s))
    }
}

/// A client's answer to one question: its `result`, or its `error`.
#[derive(Debug, Clone)]
pub struct Answer {
    pub key: String,
    pub outcome: Result<Value, Value>,
}

/// Rounds waiting for their answers on this replica.
#[derive(Default)]
pub struct Rounds {
    waiting: Mutex<HashMap<String, mpsc::Sender<Answer>>>,
}

/// A round registered in [`Rounds`]; unregistered when dropped.
pub struct Waiting<'a> {
    rounds: &'a Rounds,
    id: String,
    pub answers: mpsc::Receiver<Answer>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.rounds.waiting.lock().expect("rounds lock").remove(&self.id);
    }
}

impl Rounds {
    /// Registers round `id`, expecting at most `questions` answers.
    pub fn wait(&self, id: String, questions: usize) -> Waiting<'_> {
        let (tx, rx) = mpsc::channel(questions.max(1));
        self.waiting.lock().expect("rounds lock").insert(id.clone(), tx);
        Waiting { rounds: self, id, answers: rx }
    }

    /// Hands an answer to its round; `false` when no such round waits here
    /// (it ended) or it already has as many answers as it asked questions.
    pub fn deliver(&self, round: &str, answer: Answer) -> bool {
        let tx = self.waiting.lock().expect("rounds lock").get(round).cloned();
        tx.is_some_and(|tx| tx.try_send(answer).is_ok())
    }

    pub fn len(&self) -> usize {
        self.waiting.lock().expect("rounds lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SealKey;

    #[test]
    fn an_id_opens_only_for_its_route_and_principal() {
        let sealer = Sealer::new(vec![SealKey { id: "k".into(), bytes: [5; 32] }]);
        let q = QuestionId {
            owner: "gw-a".into(),
            owner_address: Some("10.0.0.1:9000".into()),
            round: "round".into(),
            key: "name".into(),
            route: "/mcp".into(),
            principal: "alice".into(),
            session: Some("session-a".into()),
            expires: crate::seal::unix_now() + 60,
        };
        let id = mint(&sealer, &q).unwrap();
        assert_eq!(open(&sealer, &id, "/mcp", "alice"), Ok(q.clone()));
        assert_eq!(open(&sealer, &id, "/mcp", "mallory"), Err(Rejected::OtherPrincipal));
        assert_eq!(open(&sealer, &id, "/other", "alice"), Err(Rejected::OtherRoute));
        assert!(q.asked_on(Some("session-a")));
        assert!(!q.asked_on(Some("session-b")), "another session of the same principal");
        assert!(!q.asked_on(None), "no session to check");
        // Sealed by a build that did not bind the session (a rolling
        // upgrade): opens, for its principal only, on any of its sessions.
        let unbound = serde_json::json!({"o": "gw-a", "f": "round", "k": "name", "r": "/mcp",
            "p": "alice", "exp": q.expires});
        let unbound = sealer.seal(b"legacy-question\0v1", unbound.to_string().as_bytes());
        let old = open(&sealer, &unbound, "/mcp", "alice").expect("an older id opens");
        assert!(old.asked_on(Some("session-b")) && old.asked_on(None));
        assert_eq!(open(&sealer, &unbound, "/mcp", "mallory"), Err(Rejected::OtherPrincipal));
        let expired = mint(&sealer, &QuestionId { expires: 1, ..q.clone() }).unwrap();
        assert_eq!(open(&sealer, &expired, "/mcp", "alice"), Err(Rejected::Expired));
        let session = sealer.seal(b"legacy-session\0v1", b"{}");
        assert_eq!(
            open(&sealer, &session, "/mcp", "alice"),
            Err(Rejected::Forged),
            "another purpose's token"
        );
        assert_eq!(open(&sealer, &"A".repeat(5000), "/mcp", "alice"), Err(Rejected::TooLarge));
        let long_key = QuestionId { key: "k".repeat(1024), ..q };
        assert_eq!(mint(&sealer, &long_key), Err(Rejected::TooLarge));
    }

    #[tokio::test]
    async fn answers_reach_only_a_round_that_waits() {
        let rounds = Rounds::default();
        let answer = |k: &str| Answer { key: k.into(), outcome: Ok(Value::Null) };
        assert!(!rounds.deliver("r1", answer("a")), "no such round");
        let mut waiting = rounds.wait("r1".into(), 1);
        assert!(rounds.deliver("r1", answer("a")));
        assert!(!rounds.deliver("r1", answer("b")), "no more answers than questions");
        assert_eq!(waiting.answers.recv().await.unwrap().key, "a");
        drop(waiting);
        assert_eq!(rounds.len(), 0);
        assert!(!rounds.deliver("r1", answer("a")), "a round that ended takes nothing");
    }

    #[test]
    fn ids_sealed_before_formats_had_versions_still_open() {
        use crate::sealed::v1_fixtures as v1;
        let q = open(&v1::sealer(), v1::QUESTION, "/mcp", "alice").expect("opens");
        assert_eq!((q.owner.as_str(), q.owner_address.as_deref()), ("gw-a", Some("10.0.0.1:9000")));
        assert_eq!((q.round.as_str(), q.key.as_str(), q.expires), ("round", "name", 4_000_000_000));
        assert!(q.asked_on(Some("session-a")) && !q.asked_on(Some("session-b")));
        assert_eq!(open(&v1::sealer(), v1::QUESTION, "/mcp", "bob"), Err(Rejected::OtherPrincipal));
        let fresh = mint(&v1::sealer(), &q).unwrap();
        assert_eq!(v1::sealer().open(Purpose::Question.aad(), &fresh).unwrap()[0], crate::sealed::FORMAT);
    }
}
