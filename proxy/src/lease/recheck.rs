//! The caller's right to acquire, judged again while an acquire is under way.
//!
//! A request is authorised when it arrives, but an acquire can take a while before its create
//! transaction — it waits in line (`wait_ms`), or its body or the etcd calls before the
//! transaction are slow — and the token file may change meanwhile. The front that authorised
//! the request hands the lease layer a [`Recheck`]: a check against the table in force *now*,
//! and a signal that fires whenever that table may have changed. The lease layer runs the check
//! right before every create transaction and each time the signal fires while the acquire
//! waits, so a principal removed or narrowed meanwhile gets no grant: its acquire ends with the
//! check's error (401 or 403), leaving nothing behind (its place in the wait queue is dropped,
//! no key is written). The lease layer knows nothing of tokens or tables: the check is a
//! closure.

use std::sync::Arc;

use tokio::sync::watch;

use crate::Result;

/// A check of the caller's right to the acquire it made, and when to run it again.
#[derive(Clone)]
pub(crate) struct Recheck {
    check: Arc<dyn Fn() -> Result<()> + Send + Sync>,
    changes: watch::Receiver<()>,
}

impl std::fmt::Debug for Recheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recheck").finish_non_exhaustive()
    }
}

impl Recheck {
    /// `check` answers whether the caller may still make the acquire (its error is the
    /// answer to give); `changes` is marked changed whenever what `check` consults may have
    /// changed. Changes made before `changes` was subscribed count as seen.
    pub(crate) fn new(
        check: impl Fn() -> Result<()> + Send + Sync + 'static,
        changes: watch::Receiver<()>,
    ) -> Self {
        Self {
            check: Arc::new(check),
            changes,
        }
    }

    /// Whether the caller may still make the acquire.
    pub(crate) fn check(&self) -> Result<()> {
        (self.check)()
    }

    /// Resolves once what the check consults may have changed since the last call (or since
    /// the subscription), and then only the check says whether that matters. Never resolves
    /// once nothing can change any more (the sender is gone).
    pub(crate) async fn changed(&mut self) {
        if self.changes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether what the check consults may have changed since the last call (or since the
    /// subscription), without waiting: for a caller that looks now and then.
    pub(crate) fn changed_now(&mut self) -> bool {
        let changed = self.changes.has_changed().unwrap_or(false);
        if changed {
            self.changes.borrow_and_update();
        }
        changed
    }

    /// Waits for [`Recheck::changed`] when there is a recheck; for ever when there is none
    /// (authentication off: nothing to judge again).
    pub(crate) async fn changed_or_never(recheck: &mut Option<Recheck>) {
        match recheck {
            Some(r) => r.changed().await,
            None => std::future::pending().await,
        }
    }

    /// [`Recheck::check`] when there is a recheck; nothing to judge without one.
    pub(crate) fn check_if_any(recheck: Option<&Recheck>) -> Result<()> {
        recheck.map_or(Ok(()), Recheck::check)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// Not about time: "never woken" is checked over a short real wait.
    #[tokio::test]
    async fn a_change_wakes_the_waiter_and_the_check_decides() {
        let short = Duration::from_millis(50);
        let (tx, rx) = watch::channel(());
        let allowed = Arc::new(AtomicBool::new(true));
        let flag = allowed.clone();
        let mut recheck = Some(Recheck::new(
            move || {
                if flag.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err(crate::Error::Unauthenticated("gone"))
                }
            },
            rx,
        ));
        let unwoken = tokio::time::timeout(short, Recheck::changed_or_never(&mut recheck)).await;
        assert!(unwoken.is_err(), "woken without a change");
        allowed.store(false, Ordering::SeqCst);
        tx.send_replace(());
        tokio::time::timeout(
            Duration::from_secs(1),
            Recheck::changed_or_never(&mut recheck),
        )
        .await
        .expect("a change wakes it");
        let r = recheck.as_ref().unwrap();
        assert!(matches!(
            r.check(),
            Err(crate::Error::Unauthenticated("gone"))
        ));
        // The sender gone: nothing can change any more, so it never wakes again.
        drop(tx);
        let mut r = recheck.unwrap();
        let after = tokio::time::timeout(short, r.changed()).await;
        assert!(after.is_err());
        // Without authentication there is nothing to wait for.
        let none = tokio::time::timeout(short, Recheck::changed_or_never(&mut None)).await;
        assert!(none.is_err());
    }
}
