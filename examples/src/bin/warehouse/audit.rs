//! The audit: reads the inventory's own write log and checks what fencing promises.

use std::collections::{BTreeMap, HashMap};

use crate::inventory::Applied;

/// What the audit found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// Writes the inventory applied.
    pub(crate) applied: usize,
    /// Per aisle: (writes, distinct tokens, highest revision).
    pub(crate) aisles: BTreeMap<String, (usize, usize, i64)>,
    /// Writes applied after a write with a higher token on the same aisle.
    pub(crate) out_of_order: Vec<Applied>,
    /// Writes from two different robots under one token: two holders counting at once.
    pub(crate) double_counts: Vec<(String, i64, String, String)>,
}

impl Report {
    /// Whether any invariant was violated.
    pub(crate) fn violations(&self) -> usize {
        self.out_of_order.len() + self.double_counts.len()
    }
}

/// Checks the log, in the order the inventory applied it.
pub(crate) fn check(log: &[Applied]) -> Report {
    let mut report = Report {
        applied: log.len(),
        ..Report::default()
    };
    let mut highest: HashMap<&str, i64> = HashMap::new();
    let mut token_owner: HashMap<(&str, i64), &str> = HashMap::new();
    let mut tokens: HashMap<&str, std::collections::HashSet<i64>> = HashMap::new();
    for write in log {
        let top = highest.entry(&write.aisle).or_insert(i64::MIN);
        if write.revision < *top {
            report.out_of_order.push(write.clone());
        }
        *top = (*top).max(write.revision);
        let owner = token_owner
            .entry((&write.aisle, write.revision))
            .or_insert(&write.robot);
        if *owner != write.robot {
            report.double_counts.push((
                write.aisle.clone(),
                write.revision,
                (*owner).to_owned(),
                write.robot.clone(),
            ));
        }
        tokens
            .entry(&write.aisle)
            .or_default()
            .insert(write.revision);
        let entry = report.aisles.entry(write.aisle.clone()).or_default();
        entry.0 += 1;
        entry.2 = entry.2.max(write.revision);
    }
    for (aisle, set) in tokens {
        if let Some(e) = report.aisles.get_mut(aisle) {
            e.1 = set.len();
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(seq: i64, aisle: &str, robot: &str, revision: i64) -> Applied {
        Applied {
            seq,
            aisle: aisle.into(),
            robot: robot.into(),
            revision,
            count: 1,
        }
    }

    #[test]
    fn finds_reordering_and_double_counts() {
        let clean = [
            w(1, "a", "r1", 5),
            w(2, "b", "r2", 3),
            w(3, "a", "r2", 7),
            w(4, "a", "r2", 7),
        ];
        assert_eq!(check(&clean).violations(), 0);
        let late = [w(1, "a", "r1", 5), w(2, "a", "r2", 7), w(3, "a", "r1", 5)];
        assert_eq!(check(&late).out_of_order.len(), 1);
        let double = [w(1, "a", "r1", 5), w(2, "a", "r2", 5)];
        assert_eq!(check(&double).double_counts.len(), 1);
    }
}
