//! Judging one answer to a hostile request: what it may never carry, and what it may never say
//! about a lease of the proxies' own.

use lease_proxy_testkit::v3_hostile::{find_needle, Request};
use serde_json::Value;

/// One finding in an answer; `lease` is the proxy lease it concerns, if any, so that a finding
/// about a lease later seen marked as `/v3`'s can be dropped (see [`super::traffic`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The lease the finding is about.
    pub lease: Option<i64>,
    /// What was wrong, with the request and the answer.
    pub message: String,
}

/// What [`check_answer`] found in one answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// What was wrong (nothing, in a correct run).
    pub findings: Vec<Finding>,
    /// How many statements about a proxy lease the answer made and the check judged (a
    /// time-to-live or keepalive result, a successful revoke, put or lock naming one): shows
    /// the lease checks were not vacuous.
    pub judged: u64,
}

/// The endpoint of a `/v3` path: `lease/revoke` for `/v3beta/kv/lease/revoke`.
pub(super) fn endpoint(path: &str) -> &str {
    let rest = path
        .strip_prefix("/v3/")
        .or_else(|| path.strip_prefix("/v3beta/"))
        .or_else(|| path.strip_prefix("/v3alpha/"))
        .unwrap_or(path);
    rest.strip_prefix("kv/lease/")
        .map_or(rest, |_| &rest["kv/".len()..])
}

/// A JSON int64 as the gateway writes it (a string; absent means 0).
pub(super) fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn short(s: &str) -> String {
    const MAX: usize = 300;
    match s.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

/// Checks one answer to a generated request.
///
/// - no answer, whatever its status, carries any of `needles` (sentinel keys and values, holder
///   records, raw or base64);
/// - a successful `lease/revoke` (either spelling) never names a lease for which `native` holds:
///   for those the proxy must answer etcd's 404 "requested lease not found";
/// - a successful `lease/timetolive` about such a lease says what etcd says of an unknown lease:
///   `TTL` `-1`, no `grantedTTL`, no keys;
/// - no line of a successful `lease/keepalive` renews such a lease (its `TTL` is absent: 0);
/// - no successful `kv/put` or `lock/lock` uses such a lease.
///
/// Failures (4xx refusals, 5xx under faults) change nothing and are not judged beyond the
/// needles.
pub fn check_answer(
    request: &Request,
    status: u16,
    text: &str,
    needles: &[Vec<u8>],
    native: &dyn Fn(i64) -> bool,
) -> Verdict {
    let (path, body, named) = (&request.path, &request.body, &request.leases);
    let mut found = Vec::new();
    let mut judged = 0;
    let context = || {
        format!(
            "{path} {} → {status} {}",
            short(&format!("{body:?}")),
            short(text)
        )
    };
    if let Some(needle) = find_needle(text.as_bytes(), needles) {
        found.push(Finding {
            lease: None,
            message: format!(
                "an answer carried {:?} from outside the namespace: {}",
                String::from_utf8_lossy(needle),
                context()
            ),
        });
    }
    if !(200..300).contains(&status) {
        return Verdict {
            findings: found,
            judged,
        };
    }
    let answers: Vec<Value> = serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .map_while(Result::ok)
        .collect();
    match endpoint(path) {
        "lease/revoke" => {
            for &id in named.iter().filter(|id| native(**id)) {
                judged += 1;
                found.push(Finding {
                    lease: Some(id),
                    message: format!("a proxy lease ({id}) was revoked: {}", context()),
                });
            }
        }
        "kv/put" | "lock/lock" => {
            for &id in named.iter().filter(|id| native(**id)) {
                judged += 1;
                found.push(Finding {
                    lease: Some(id),
                    message: format!("a key was attached to a proxy lease ({id}): {}", context()),
                });
            }
        }
        "lease/timetolive" => {
            for answer in &answers {
                let id = int(&answer["ID"]);
                if !native(id) {
                    continue;
                }
                judged += 1;
                let unknown = int(&answer["TTL"]) == -1
                    && int(&answer["grantedTTL"]) == 0
                    && answer.get("keys").is_none();
                if !unknown {
                    found.push(Finding {
                        lease: Some(id),
                        message: format!(
                            "a proxy lease ({id}) was shown through /v3: {}",
                            context()
                        ),
                    });
                }
            }
        }
        "lease/keepalive" => {
            for answer in &answers {
                let result = &answer["result"];
                let id = int(&result["ID"]);
                if !native(id) {
                    continue;
                }
                judged += 1;
                if int(&result["TTL"]) != 0 {
                    found.push(Finding {
                        lease: Some(id),
                        message: format!("a proxy lease ({id}) was renewed: {}", context()),
                    });
                }
            }
        }
        _ => {}
    }
    Verdict {
        findings: found,
        judged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_proxy_testkit::v3_hostile::{needle_pair, needles};

    /// `bytes` in base64, as `/v3` answers carry values.
    fn encode(bytes: &[u8]) -> String {
        String::from_utf8_lossy(&needle_pair(bytes)[0]).into_owned()
    }

    const NATIVE: i64 = 7_587_887_654_321;

    fn native(id: i64) -> bool {
        id == NATIVE
    }

    fn check(path: &str, named: &[i64], status: u16, text: &str) -> Vec<Finding> {
        let request = Request {
            path: path.to_owned(),
            body: "{}".to_owned(),
            leases: named.to_vec(),
        };
        check_answer(&request, status, text, &needles(), &native).findings
    }

    #[test]
    fn an_answer_carrying_a_needle_is_a_violation() {
        let leak = format!(
            r#"{{"kvs":[{{"key":"eA==","value":"{}"}}]}}"#,
            encode(b"PLANTED-outside")
        );
        let found = check("/v3/kv/range", &[], 200, &leak);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].message.contains(&encode(b"PLANTED-outside")),
            "{found:?}"
        );
        assert_eq!(found[0].lease, None);
        // Raw, and in an error answer too.
        assert_eq!(
            check("/v3/kv/range", &[], 400, "bad key HIDDEN-nul").len(),
            1
        );
        assert!(check("/v3/kv/range", &[], 200, r#"{"kvs":[]}"#).is_empty());
    }

    #[test]
    fn proxy_leases_must_look_unknown() {
        let id = NATIVE.to_string();
        // What the proxy answers today for a foreign lease.
        assert!(check("/v3/lease/revoke", &[NATIVE], 404, r#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#).is_empty());
        let unknown = format!(r#"{{"header":{{"revision":"3"}},"ID":"{id}","TTL":"-1"}}"#);
        assert!(check("/v3/lease/timetolive", &[NATIVE], 200, &unknown).is_empty());
        let not_renewed = format!(r#"{{"result":{{"header":{{}},"ID":"{id}"}}}}"#);
        assert!(check("/v3/lease/keepalive", &[NATIVE], 200, &not_renewed).is_empty());

        // And what they must not.
        let found = check(
            "/v3beta/kv/lease/revoke",
            &[NATIVE],
            200,
            r#"{"header":{}}"#,
        );
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].lease, Some(NATIVE));
        let shown = format!(r#"{{"ID":"{id}","TTL":"41","grantedTTL":"60"}}"#);
        assert_eq!(check("/v3/lease/timetolive", &[], 200, &shown).len(), 1);
        let renewed = format!(r#"{{"result":{{"ID":"{id}","TTL":"60"}}}}"#) + "\n" + &not_renewed;
        assert_eq!(check("/v3/lease/keepalive", &[], 200, &renewed).len(), 1);
        assert_eq!(check("/v3/kv/put", &[NATIVE], 200, "{}").len(), 1);
        assert_eq!(check("/v3/lock/lock", &[NATIVE], 200, "{}").len(), 1);
        // Other leases, and failures, are not judged.
        assert!(check("/v3/kv/put", &[5], 200, "{}").is_empty());
        assert!(check("/v3/kv/put", &[NATIVE], 503, "{}").is_empty());
    }

    #[test]
    fn endpoints_in_every_spelling() {
        assert_eq!(endpoint("/v3/kv/lease/revoke"), "lease/revoke");
        assert_eq!(endpoint("/v3beta/lease/keepalive"), "lease/keepalive");
        assert_eq!(endpoint("/v3/kv/put"), "kv/put");
    }
}
