//! The clients' record of their holds, shared by every client of a run.

use std::sync::Mutex;

use tokio::time::Instant;

use super::{Action, Granted, Hold, Signal};

/// Every hold of a run's clients, open or ended. A client opens one when an acquire says held
/// and adds to it by the id [`Beliefs::open`] returns.
#[derive(Debug, Default)]
pub struct Beliefs {
    holds: Mutex<Vec<Hold>>,
}

impl Beliefs {
    /// Opens a hold made by `granted` (the acquire), said held at `granted.answered`; its id.
    pub fn open(
        &self,
        client: &str,
        resource: &str,
        token: u64,
        rate: f64,
        granted: Granted,
    ) -> Option<usize> {
        let mut holds = self.holds.lock().ok()?;
        holds.push(Hold {
            client: client.to_owned(),
            resource: resource.to_owned(),
            token,
            rate,
            held: granted.answered,
            grants: vec![granted],
            actions: Vec::new(),
            signal: None,
        });
        Some(holds.len() - 1)
    }

    fn with(&self, id: Option<usize>, f: impl FnOnce(&mut Hold)) {
        if let (Some(id), Ok(mut holds)) = (id, self.holds.lock()) {
            if let Some(h) = holds.get_mut(id).filter(|h| h.signal.is_none()) {
                f(h);
            }
        }
    }

    /// A successful renewal of hold `id`.
    pub fn renewed(&self, id: Option<usize>, granted: Granted) {
        self.with(id, |h| h.grants.push(granted));
    }

    /// A write decided at `decided` under hold `id` ended (answered or given up) now.
    pub fn acted(&self, id: Option<usize>, decided: Instant) {
        let completed = Instant::now();
        self.with(id, |h| h.actions.push(Action { decided, completed }));
    }

    /// Hold `id` ended by `signal` at `at` (the first signal stays).
    pub fn end(&self, id: Option<usize>, signal: Signal, at: Instant) {
        self.with(id, |h| h.signal = Some((signal, at)));
    }

    /// Ends every hold still open as [`Signal::RunEnded`], now; all of them.
    pub fn finish(&self) -> Vec<Hold> {
        let now = Instant::now();
        let Ok(mut holds) = self.holds.lock() else {
            return Vec::new();
        };
        for h in holds.iter_mut().filter(|h| h.signal.is_none()) {
            h.signal = Some((Signal::RunEnded, now));
        }
        holds.clone()
    }
}
