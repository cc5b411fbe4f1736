//! The operator's fleet calls: make or change a fleet, read it, end it, drain or evict one of
//! its members (`/v1/fleets`, docs/API.md "Fleets").

use std::time::Duration;

use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::book::MemberState;
use crate::client::segment;
use crate::model::{to_u64_string, u64_string};
use crate::{Client, Result};

/// What a fleet shares: `PUT /v1/fleets/{fleet}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetSpec {
    /// The resources (ordinary `/v1` names; at most 10,000).
    pub resources: Vec<String>,
    /// How long a member has to release a resource moved away from it before the service
    /// revokes it (whole milliseconds are sent; `None`: the service's default, 5 s).
    pub drain: Option<Duration>,
    /// The most hand-offs in flight at once (`None`: the service's default).
    pub max_moves: Option<u32>,
}

impl FleetSpec {
    /// A fleet of `resources`, with the service's drain time and churn budget.
    pub fn new<I, S>(resources: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            resources: resources.into_iter().map(Into::into).collect(),
            drain: None,
            max_moves: None,
        }
    }

    /// Members get `drain` to release a resource moved away from them.
    pub fn drain(mut self, drain: Duration) -> Self {
        self.drain = Some(drain);
        self
    }

    /// At most `max_moves` hand-offs in flight at once.
    pub fn max_moves(mut self, max_moves: u32) -> Self {
        self.max_moves = Some(max_moves);
        self
    }

    fn body(&self) -> Value {
        let mut body = Map::new();
        body.insert("resources".into(), json!(self.resources));
        if let Some(drain) = self.drain {
            let ms = u64::try_from(drain.as_millis()).unwrap_or(u64::MAX);
            body.insert("drain_ms".into(), json!(ms));
        }
        if let Some(moves) = self.max_moves {
            body.insert("max_moves".into(), json!(moves));
        }
        Value::Object(body)
    }
}

/// A fleet as written by `PUT /v1/fleets/{fleet}`. Serializes as the proxy's JSON.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct FleetWritten {
    /// The fleet.
    pub fleet: String,
    /// Its resources, as written.
    pub resources: Vec<String>,
    /// The drain time in force, in milliseconds.
    pub drain_ms: u64,
    /// The churn budget in force.
    pub max_moves: u64,
    /// The etcd revision that wrote it.
    #[serde(deserialize_with = "u64_string", serialize_with = "to_u64_string")]
    pub revision: u64,
}

/// A fleet as it stands (`GET /v1/fleets/{fleet}`, never secrets). Serializes as the proxy's
/// JSON.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct FleetView {
    /// The fleet.
    pub fleet: String,
    /// Its resources, in name order.
    pub resources: Vec<String>,
    /// How long a member has to release a resource moved away from it, in milliseconds.
    pub drain_ms: u64,
    /// The most hand-offs in flight at once.
    pub max_moves: u64,
    /// The etcd revision it was read at.
    #[serde(deserialize_with = "u64_string", serialize_with = "to_u64_string")]
    pub revision: u64,
    /// Its members, in name order.
    pub members: Vec<FleetMember>,
    /// The resources no member holds now (free, between a release and the next grant, or held
    /// outside the fleet), in name order.
    pub unassigned: Vec<String>,
}

/// A member as a reader of the fleet sees it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct FleetMember {
    /// Its name.
    pub member: String,
    /// Its share's weight.
    pub weight: u32,
    /// Where it stands.
    pub state: MemberState,
    /// What it holds and is assigned, in name order.
    pub held: Vec<String>,
    /// What it holds and must give up, in name order.
    pub releasing: Vec<String>,
}

/// `202` of a drain.
#[derive(Debug, Deserialize)]
pub(crate) struct Standing {
    pub(crate) state: MemberState,
}

/// `/v1/fleets/{fleet}`, the fleet as one segment.
pub(crate) fn fleet_path(fleet: &str) -> String {
    format!("/v1/fleets/{}", segment(fleet))
}

/// `/v1/fleets/{fleet}/members/{member}`.
pub(crate) fn member_path(fleet: &str, member: &str) -> String {
    format!("{}/members/{}", fleet_path(fleet), segment(member))
}

impl Client {
    /// Makes or changes `fleet` (the caller needs `acquire` on every resource; only the
    /// principal that made a fleet may change it).
    pub async fn put_fleet(&self, fleet: &str, spec: &FleetSpec) -> Result<FleetWritten> {
        self.call(
            self.request(Method::PUT, &fleet_path(fleet))
                .json(&spec.body()),
        )
        .await
    }

    /// `fleet` as it stands, or `None` when there is no such fleet.
    pub async fn get_fleet(&self, fleet: &str) -> Result<Option<FleetView>> {
        match self
            .call(self.request(Method::GET, &fleet_path(fleet)))
            .await
        {
            Ok(view) => Ok(Some(view)),
            Err(e) if e.slug() == Some("no-fleet") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Ends `fleet`: every grant it made is released before it returns (the members' sessions
    /// stay). Idempotent.
    pub async fn delete_fleet(&self, fleet: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &fleet_path(fleet)))
            .await
            .map(drop)
    }

    /// Drains `member` as an operator (`acquire` on every resource of the fleet): it hands
    /// everything off and is given nothing new. Its state after the call.
    pub async fn drain_member(&self, fleet: &str, member: &str) -> Result<MemberState> {
        let standing: Standing = self
            .call(self.request(
                Method::POST,
                &format!("{}/drain", member_path(fleet, member)),
            ))
            .await?;
        Ok(standing.state)
    }

    /// Evicts `member` (an operator: `acquire` on every resource of the fleet): its grants end
    /// at once (the next grant of each is fenced past them), and it is given nothing until it
    /// joins again.
    pub async fn evict_member(&self, fleet: &str, member: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &member_path(fleet, member)))
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_sends_only_what_it_sets() {
        assert_eq!(
            FleetSpec::new(["a", "b"]).body(),
            json!({"resources": ["a", "b"]})
        );
        assert_eq!(
            FleetSpec::new(Vec::<String>::new())
                .drain(Duration::from_millis(2500))
                .max_moves(3)
                .body(),
            json!({"resources": [], "drain_ms": 2500, "max_moves": 3})
        );
        assert_eq!(member_path("a/b", "m 1"), "/v1/fleets/a%2Fb/members/m%201");
    }

    #[test]
    fn a_fleet_view_reads_and_prints_as_the_api_writes_it() {
        let text = r#"{"fleet":"aisles","resources":["a","b"],"drain_ms":5000,"max_moves":10,"revision":"77","members":[{"member":"r1","weight":1,"state":"active","held":["a"],"releasing":[]}],"unassigned":["b"]}"#;
        let view: FleetView = serde_json::from_str(text).unwrap();
        assert_eq!(view.members[0].state, MemberState::Active);
        assert_eq!(serde_json::to_string(&view).unwrap(), text);
    }
}
