//! The life of a call paused on questions (MRTR): parking it with an
//! `input_required` round, resuming it on the client's retry, and declining
//! what it waits for when the retry never comes.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::call::{self, Done, InFlight};
use super::mrtr::{self, ParkedFlow};
use super::{state, translate, Ctx, Legacy};
use crate::error::Error;
use crate::metrics::{MethodLabels, Metrics, ReasonLabels};
use crate::reply::Reply;

/// Longest time an abandoned flow's upstream stream is read after its
/// questions were declined, so the upstream can finish its call cleanly.
const ABANDON_DRAIN: Duration = Duration::from_secs(30);

impl ParkedFlow {
    /// Reads the upstream's stream on, for the call `cx` (the original or a retry).
    async fn read_on(&mut self, legacy: &Legacy, cx: Ctx<'_>, reply: &mut Reply) -> Done {
        let flight = InFlight {
            call: cx.call,
            session: &self.session,
            wire: &self.wire,
            upstream_id: self.upstream_id,
            progress_token: self.progress_token.clone(),
            keepalive: legacy.keepalive,
            deadline: self.deadline,
            metrics: &legacy.metrics,
        };
        call::read_stream(&flight, &mut self.stream, reply).await
    }

    /// Declines every pending question on the client's behalf.
    async fn decline_pending(&mut self, metrics: &Metrics) {
        for question in std::mem::take(&mut self.pending).into_values() {
            let msg = json!({"id": question.upstream_id, "method": question.method});
            let _ = self
                .session
                .transport
                .post(&self.wire, &mrtr::decline(&msg))
                .await;
            metrics
                .upstream_requests_declined
                .get_or_create(&MethodLabels {
                    route: self.session.key.route.clone(),
                    method: question.method,
                })
                .inc();
        }
    }

    /// Declines what an abandoned flow waits for, then reads its stream to the
    /// end (declining anything else it asks) so the upstream finishes cleanly.
    async fn abandon(mut self, metrics: Metrics) {
        self.decline_pending(&metrics).await;
        let until = (tokio::time::Instant::now() + ABANDON_DRAIN).min(self.deadline);
        let drain = async {
            while let Ok(msg) = self.stream.next().await {
                let is_request = msg.get("method").is_some() && msg.get("id").is_some();
                if is_request {
                    call::respond_upstream(&self.session, &self.wire, &msg).await;
                } else if msg.get("id").and_then(Value::as_u64) == Some(self.upstream_id) {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout_at(until, drain).await;
    }
}

impl Legacy {
    fn rejected(&self, cx: Ctx<'_>, why: state::Rejected) -> Error {
        self.metrics
            .request_state_rejected
            .get_or_create(&ReasonLabels {
                route: cx.route.path.clone(),
                reason: why.reason(),
            })
            .inc();
        why.error()
    }

    fn count_parked(&self) {
        self.metrics.parked_flows_open.set(self.parked.len() as i64);
    }

    /// A retry: finds the paused call, hands the answers to the upstream, and
    /// reads on to the result or the next round. Nothing is sent upstream
    /// unless the `requestState` opens, matches the retry and its flow is parked.
    pub(super) async fn resume(
        &self,
        cx: Ctx<'_>,
        blob: &Value,
        reply: &mut Reply,
    ) -> Result<Option<Done>, Error> {
        let Value::String(blob) = blob else {
            return Err(self.rejected(cx, state::Rejected::Invalid));
        };
        if !cx.call.method.allows_input() {
            return Err(self.rejected(cx, state::Rejected::WrongRequest));
        }
        let digest = state::params_digest(&cx.call.params);
        let expect = state::Expect {
            route: &cx.route.path,
            method: cx.call.method.as_str(),
            principal: &cx.caller.principal,
            name: cx.call.name.as_deref(),
            params_digest: &digest,
            now_ms: state::now_ms(),
        };
        let st = state::open(&self.sealer, blob, &expect).map_err(|why| self.rejected(cx, why))?;
        if st.re {
            check_url_answers(&st, cx.call)?;
            return Ok(None);
        }
        let Some((mut flow, expires)) = self.parked.take(&st.f) else {
            return Err(self.rejected(cx, state::Rejected::FlowGone));
        };
        self.count_parked();
        if flow.round != st.rd {
            self.put_back(st.f, flow, expires);
            return Err(self.rejected(cx, state::Rejected::StaleRound));
        }
        let answers = match answers(&flow, cx.call) {
            Ok(a) => a,
            Err(e) => {
                self.put_back(st.f, flow, expires);
                return Err(e);
            }
        };
        for (key, result) in answers {
            let question = flow
                .pending
                .remove(&key)
                .expect("answered keys are pending");
            let response = json!({"jsonrpc": "2.0", "id": question.upstream_id, "result": result});
            if let Err(e) = flow.session.transport.post(&flow.wire, &response).await {
                tracing::warn!(?e, "could not deliver an answer upstream");
                return Err(Error::OutcomeUnknown);
            }
        }
        let done = if flow.pending.is_empty() {
            flow.read_on(self, cx, reply).await
        } else {
            // Some answers are missing: ask for them again in a new round.
            Done::Input(Vec::new())
        };
        Ok(Some(self.conclude(cx, Some(st.f), flow, done, reply).await))
    }

    /// A 2025-11-25 upstream's -32042 (URL elicitation required) as a round of
    /// URL-mode elicitations; the retry re-issues the call (nothing is parked,
    /// and `notifications/elicitation/complete` is never passed on).
    pub(super) fn url_round(&self, cx: Ctx<'_>, init: &Value, data: Option<&Value>) -> Done {
        let elicitations = data
            .and_then(|d| d.get("elicitations"))
            .and_then(Value::as_array);
        let (Some(elicitations), true) = (
            elicitations.filter(|e| !e.is_empty()),
            cx.call.method.allows_input(),
        ) else {
            return Done::Failed(Error::UpstreamInvalid("URL elicitation required"));
        };
        let declared = cx
            .call
            .meta
            .capabilities
            .get("elicitation")
            .and_then(|e| e.get("url"));
        if declared.is_none() {
            return Done::Failed(Error::MissingCapability(
                json!({"elicitation": {"url": {}}}),
            ));
        }
        let mut requests = Map::new();
        let mut keys = std::collections::BTreeMap::new();
        for (i, e) in elicitations.iter().enumerate() {
            let key = format!("elicitation_{}", i + 1);
            let mut params = e.clone();
            if let Some(p) = params.as_object_mut() {
                p.insert("mode".into(), json!("url"));
            }
            requests.insert(
                key.clone(),
                mrtr::input_request("elicitation/create", Some(&params)),
            );
            keys.insert(key, Value::Null);
        }
        let now = state::now_ms();
        let st = state::FlowState {
            r: cx.route.path.clone(),
            sid: None,
            ver: None,
            own: self.instance.clone(),
            f: super::random_id(),
            k: keys,
            p: cx.caller.principal.clone(),
            m: cx.call.method.as_str().to_string(),
            n: cx.call.name.clone(),
            a: state::params_digest(&cx.call.params),
            iat: now,
            exp: now + self.parked.ttl().as_millis() as u64,
            rd: 1,
            re: true,
        };
        self.metrics
            .mrtr_rounds
            .get_or_create(&MethodLabels {
                route: cx.route.path.clone(),
                method: cx.call.method.as_str().to_string(),
            })
            .inc();
        Done::Result(translate::input_required(
            init,
            Value::Object(requests),
            state::seal(&self.sealer, &st),
        ))
    }

    /// Puts a flow back after a retry that could not use it (wrong round,
    /// malformed answers): the legitimate retry may still come.
    fn put_back(&self, id: String, flow: ParkedFlow, expires: tokio::time::Instant) {
        if let Err(flow) = self.parked.park_until(id, flow, expires) {
            tokio::spawn(flow.abandon(self.metrics.clone()));
        }
        self.count_parked();
    }

    /// Finishes a flow's turn: parks it on a new round of questions, or shapes
    /// its final answer. When the parking lot is full, the questions are
    /// declined on the client's behalf and the upstream's outcome is read instead.
    pub(super) async fn conclude(
        &self,
        cx: Ctx<'_>,
        flow_id: Option<String>,
        mut flow: ParkedFlow,
        mut done: Done,
        reply: &mut Reply,
    ) -> Done {
        loop {
            let Done::Input(questions) = done else {
                return self.shape(cx, &flow.session, &flow.wire, done);
            };
            flow.add_questions(questions);
            match self.park_round(cx, flow_id.clone(), flow) {
                Ok(result) => return Done::Result(result),
                Err(back) => flow = *back,
            }
            flow.decline_pending(&self.metrics).await;
            done = flow.read_on(self, cx, reply).await;
        }
    }

    /// Parks `flow` for a new round and returns the `input_required` result;
    /// gives the flow back when the parking lot is full.
    fn park_round(
        &self,
        cx: Ctx<'_>,
        flow_id: Option<String>,
        mut flow: ParkedFlow,
    ) -> Result<Map<String, Value>, Box<ParkedFlow>> {
        if self.parked.is_full() {
            return Err(Box::new(flow));
        }
        flow.round += 1;
        let id = flow_id.unwrap_or_else(super::random_id);
        let now = state::now_ms();
        let st = state::FlowState {
            r: cx.route.path.clone(),
            sid: flow.wire.id.clone(),
            ver: flow.wire.version.clone(),
            own: self.instance.clone(),
            f: id.clone(),
            k: flow
                .pending
                .iter()
                .map(|(k, q)| (k.clone(), q.upstream_id.clone()))
                .collect(),
            p: cx.caller.principal.clone(),
            m: cx.call.method.as_str().to_string(),
            n: cx.call.name.clone(),
            a: state::params_digest(&cx.call.params),
            iat: now,
            exp: now + self.parked.ttl().as_millis() as u64,
            rd: flow.round,
            re: false,
        };
        let requests = flow.input_requests();
        let init = flow.session.init.clone();
        self.parked.park(id, flow).map_err(Box::new)?;
        self.count_parked();
        self.metrics
            .mrtr_rounds
            .get_or_create(&MethodLabels {
                route: cx.route.path.clone(),
                method: cx.call.method.as_str().to_string(),
            })
            .inc();
        Ok(translate::input_required(
            &init,
            requests,
            state::seal(&self.sealer, &st),
        ))
    }

    /// Declines the questions of parked flows whose TTL passed, until shutdown;
    /// then declines every flow still parked.
    pub async fn run_flow_reaper(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let period =
            (self.parked.ttl() / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let expired = self.parked.expired();
            if expired.is_empty() {
                continue;
            }
            self.count_parked();
            for flow in expired {
                let route = Metrics::route(&flow.session.key.route);
                self.metrics
                    .parked_flows_expired
                    .get_or_create(&route)
                    .inc();
                tokio::spawn(flow.abandon(self.metrics.clone()));
            }
        }
        let left = self.parked.drain();
        self.count_parked();
        futures_util::future::join_all(left.into_iter().map(|f| f.abandon(self.metrics.clone())))
            .await;
    }
}

/// A URL round's answers must be well-formed elicitation results (consent only:
/// whether the user finished is the upstream's to judge on the re-issued call).
fn check_url_answers(st: &state::FlowState, call: &crate::front::Call) -> Result<(), Error> {
    let Some(Value::Object(responses)) = call.params.get("inputResponses") else {
        return Ok(());
    };
    let question = mrtr::Question {
        upstream_id: Value::Null,
        method: "elicitation/create".into(),
        request: Value::Null,
    };
    for key in st.k.keys() {
        if let Some(answer) = responses.get(key) {
            mrtr::legacy_answer(key, &question, answer)?;
        }
    }
    Ok(())
}

/// The retry's answers to the flow's pending questions, as legacy results.
/// Missing answers are left pending; unknown keys are ignored.
fn answers(flow: &ParkedFlow, call: &crate::front::Call) -> Result<Vec<(String, Value)>, Error> {
    let Some(Value::Object(responses)) = call.params.get("inputResponses") else {
        return Ok(Vec::new());
    };
    flow.pending
        .iter()
        .filter_map(|(key, question)| {
            let answer = responses.get(key)?;
            Some(mrtr::legacy_answer(key, question, answer).map(|r| (key.clone(), r)))
        })
        .collect()
}
