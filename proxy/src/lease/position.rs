//! Positions in the ownership event history: the ids of `GET /v1/watch` (see `events` for how
//! a subscription resumes after one).

use std::fmt;

use crate::{Error, Result};

/// Where a subscriber stands in the event history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    /// The etcd revision.
    pub(crate) revision: i64,
    /// The index within the revision of the last event seen; `None`: all of it seen.
    pub(crate) index: Option<u32>,
}

impl Position {
    /// Parses a `Last-Event-ID`: `R` or `R.n`, decimal, `R` ≥ 1. Anything else is refused.
    pub(crate) fn parse(id: &str) -> Result<Self> {
        let bad = || Error::InvalidField {
            field: "Last-Event-ID",
            reason: "must be an event id from this stream: REVISION or REVISION.INDEX".into(),
        };
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit());
        let (revision, index) = match id.split_once('.') {
            Some((r, n)) if digits(r) && digits(n) => (
                r.parse::<i64>().map_err(|_| bad())?,
                Some(n.parse::<u32>().map_err(|_| bad())?),
            ),
            None if digits(id) => (id.parse::<i64>().map_err(|_| bad())?, None),
            _ => return Err(bad()),
        };
        if revision < 1 {
            return Err(bad());
        }
        Ok(Self { revision, index })
    }

    /// The first revision a watch resuming after this position must see.
    pub(super) fn watch_from(self) -> i64 {
        match self.index {
            Some(_) => self.revision,
            None => self.revision.saturating_add(1),
        }
    }
}

/// History order: `R.n` (after event `n` of revision `R`) comes before `R.m` for `n < m`, and
/// before bare `R` (after all of `R`), which comes before anything of `R + 1`.
impl Ord for Position {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let key = |p: &Position| (p.revision, p.index.map_or(u64::MAX, u64::from));
        key(self).cmp(&key(other))
    }
}

impl PartialOrd for Position {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.index {
            Some(n) => write!(f, "{}.{n}", self.revision),
            None => write!(f, "{}", self.revision),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Position;

    #[test]
    fn positions_parse_and_print_back() {
        for id in ["1", "42", "42.0", "42.17", "9223372036854775807.4294967295"] {
            assert_eq!(
                Position::parse(id).map(|p| p.to_string()).ok().as_deref(),
                Some(id)
            );
        }
        let at = |id: &str| Position::parse(id).ok();
        assert!(at("41") < at("42.0") && at("42.0") < at("42.3"));
        assert!(at("42.3") < at("42.4294967295") && at("42.4294967295") < at("42"));
        assert!(at("42") < at("43.0"));
        let p = Position::parse("42.3").ok();
        assert_eq!(p.map(|p| p.watch_from()), Some(42));
        assert_eq!(Position::parse("42").ok().map(|p| p.watch_from()), Some(43));
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "1.",
            ".1",
            "1.2.3",
            "a",
            "1.a",
            " 1",
            "1 ",
            "1e3",
            "0x10",
            "99999999999999999999",
            "1.99999999999",
            "1.-1",
            "１",
        ] {
            assert!(Position::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
