//! The etcd key layout (docs/DESIGN.md §2): every key the proxy writes, built from the one
//! `--etcd-prefix` here and nowhere else, so two parts of the proxy can never disagree on where
//! a record lives.

/// Where the proxy keeps its state in etcd, under one prefix (default `/lease-proxy/`).
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    prefix: String,
    holders: String,
    sessions: String,
    waiters: String,
    idempotency: String,
    principals: String,
    ended: String,
    fleets: String,
    fleet_owners: String,
    fleet_grants: String,
    fleets_ending: String,
}

impl Layout {
    /// The layout under `prefix` (`--etcd-prefix`, which ends with `/`).
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            holders: format!("{prefix}holders/"),
            sessions: format!("{prefix}sessions/"),
            waiters: format!("{prefix}waiters/"),
            idempotency: format!("{prefix}idempotency/"),
            principals: format!("{prefix}principals/"),
            ended: format!("{prefix}ended/"),
            fleets: format!("{prefix}fleets/"),
            fleet_owners: format!("{prefix}fleet-owners/"),
            fleet_grants: format!("{prefix}fleet-grants/"),
            fleets_ending: format!("{prefix}fleet-ending/"),
        }
    }

    /// `{prefix}holders/`: the ownership keys.
    pub(crate) fn holders(&self) -> &str {
        &self.holders
    }

    /// `{prefix}holders/{resource}`: the ownership key of `resource`.
    pub(crate) fn holder(&self, resource: &str) -> String {
        format!("{}{resource}", self.holders)
    }

    /// `{prefix}sessions/{id}`: the record of session `id`, on the session's lease.
    pub(crate) fn session(&self, id: i64) -> String {
        format!("{}{id}", self.sessions)
    }

    /// `{prefix}waiters/`: the wait lines, `{resource}/{lease}-{nonce}` each.
    pub(crate) fn waiters(&self) -> &str {
        &self.waiters
    }

    /// `{prefix}idempotency/{resource}`: the replay window of the resource's last keyed grant.
    pub(crate) fn idempotency(&self, resource: &str) -> String {
        format!("{}{resource}", self.idempotency)
    }

    /// `{prefix}principals/{principal}/`: the held-quota index of one principal.
    pub(crate) fn principal(&self, principal: &str) -> String {
        format!("{}{principal}/", self.principals)
    }

    /// `{prefix}principals/{principal}/{resource}`: the index key of one grant.
    pub(crate) fn principal_grant(&self, principal: &str, resource: &str) -> String {
        format!("{}{principal}/{resource}", self.principals)
    }

    /// `{prefix}ended/`: the markers that say why a grant ended.
    pub(crate) fn ended(&self) -> &str {
        &self.ended
    }

    /// `{prefix}ended/released/`: release markers, one per lease (and, for a fleet's grants,
    /// per lease and resource).
    pub(crate) fn released(&self) -> String {
        format!("{}released/", self.ended)
    }

    /// `{prefix}ended/closed/`: session close markers, one per session.
    pub(crate) fn closed(&self) -> String {
        format!("{}closed/", self.ended)
    }

    /// `{prefix}fleets/`: every fleet's keys, `{fleet}/…` each.
    pub(crate) fn fleets(&self) -> &str {
        &self.fleets
    }

    /// `{prefix}fleets/{fleet}/`: the keys of one fleet. A fleet's name follows the resource
    /// grammar (no `/`), so no fleet's keys lie under another's.
    pub(crate) fn fleet(&self, fleet: &str) -> String {
        format!("{}{fleet}/", self.fleets)
    }

    /// `{prefix}fleets/{fleet}/spec`: what the fleet shares (`fleet::records::SpecRecord`).
    pub(crate) fn fleet_spec(&self, fleet: &str) -> String {
        format!("{}{fleet}/spec", self.fleets)
    }

    /// `{prefix}fleets/{fleet}/assignment`: who should hold what, and the hand-offs' deadlines.
    pub(crate) fn fleet_assignment(&self, fleet: &str) -> String {
        format!("{}{fleet}/assignment", self.fleets)
    }

    /// `{prefix}fleets/{fleet}/members/{member}`: a member's record, on its session's lease.
    pub(crate) fn fleet_member(&self, fleet: &str, member: &str) -> String {
        format!("{}{fleet}/members/{member}", self.fleets)
    }

    /// `{prefix}fleet-owners/{principal}/`: the fleets one principal made, a key each (the
    /// fleet quota's range).
    pub(crate) fn fleet_owners(&self, principal: &str) -> String {
        format!("{}{principal}/", self.fleet_owners)
    }

    /// `{prefix}fleet-owners/{principal}/{fleet}`: written with the fleet's spec when the
    /// principal makes it, deleted with the fleet's keys.
    pub(crate) fn fleet_owner(&self, principal: &str, fleet: &str) -> String {
        format!("{}{principal}/{fleet}", self.fleet_owners)
    }

    /// `{prefix}fleet-grants/{fleet}/`: the index of the grants a fleet made, a key each,
    /// outside the fleet's own keys so that it outlives their delete: what the fleet's end
    /// releases.
    pub(crate) fn fleet_grants(&self, fleet: &str) -> String {
        format!("{}{fleet}/", self.fleet_grants)
    }

    /// `{prefix}fleet-grants/{fleet}/{resource}`: written on the member's session lease in the
    /// transaction that grants `resource` (so its mod revision is the grant's token), its value
    /// the principal the grant counts against.
    pub(crate) fn fleet_grant(&self, fleet: &str, resource: &str) -> String {
        format!("{}{fleet}/{resource}", self.fleet_grants)
    }

    /// `{prefix}fleet-ending/`: the fleets whose keys are deleted and whose grants may not all
    /// be released yet, a key each.
    pub(crate) fn fleets_ending(&self) -> &str {
        &self.fleets_ending
    }

    /// `{prefix}fleet-ending/{fleet}`: written in the transaction that deletes the fleet's keys
    /// (so modified at the end's revision), deleted once its grants are released.
    pub(crate) fn fleet_ending(&self, fleet: &str) -> String {
        format!("{}{fleet}", self.fleets_ending)
    }

    /// `{prefix}readyz`: the key `/readyz` reads.
    pub(crate) fn readiness(&self) -> String {
        format!("{}readyz", self.prefix)
    }

    /// `{prefix}v3/kv/`: the default `/v3` namespace, and the only subtree of the prefix a
    /// `--v3-namespace` may lie in.
    pub(crate) fn v3_kv(&self) -> String {
        format!("{}v3/kv/", self.prefix)
    }

    /// `{prefix}v3/leases/`: the markers of `/v3` leases (outside every valid `/v3` namespace).
    pub(crate) fn v3_leases(&self) -> String {
        format!("{}v3/leases/", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::Layout;

    #[test]
    fn every_key_lies_under_the_prefix() {
        let l = Layout::new("/p/");
        for key in [
            l.holder("r"),
            l.session(7),
            l.waiters().to_owned(),
            l.idempotency("r"),
            l.principal_grant("alice", "r"),
            l.fleet_owner("alice", "f"),
            l.released(),
            l.closed(),
            l.readiness(),
            l.v3_kv(),
            l.v3_leases(),
            l.fleet_spec("f"),
            l.fleet_assignment("f"),
            l.fleet_member("f", "m"),
            l.fleet_grant("f", "r"),
            l.fleet_ending("f"),
        ] {
            assert!(key.starts_with("/p/"), "{key}");
        }
        assert_eq!(l.holder("r"), "/p/holders/r");
        assert_eq!(l.principal_grant("alice", "r"), "/p/principals/alice/r");
        assert_eq!(l.released(), "/p/ended/released/");
        assert_eq!(
            l.fleet_member("aisles", "robot-1"),
            "/p/fleets/aisles/members/robot-1"
        );
        assert!(l.fleet_spec("a").starts_with(&l.fleet("a")));
        assert!(!l.fleet_spec("a.b").starts_with(&l.fleet("a")));
        // The index and the end's key outlive the delete of the fleet's keys.
        assert!(!l.fleet_grant("a", "r").starts_with(l.fleets()));
        assert!(!l.fleet_ending("a").starts_with(l.fleets()));
        assert!(l.fleet_grant("a", "r").starts_with(&l.fleet_grants("a")));
        assert!(!l.fleet_grant("a.b", "r").starts_with(&l.fleet_grants("a")));
    }
}
