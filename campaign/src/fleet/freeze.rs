//! SIGSTOP for a task: a member runs inside [`Frozen`], which stops polling it while its
//! [`Freeze`] is on — keepalive, assignment stream and writes alike stop wherever they are
//! (requests already on the wire go on, as a stopped process's socket buffers fill) — and
//! resumes it exactly there once thawed.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

/// The switch.
#[derive(Debug, Default)]
pub struct Freeze {
    frozen: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Freeze {
    /// Stops the task at its next await point.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }

    /// Lets it go on.
    pub fn thaw(&self) {
        self.frozen.store(false, Ordering::Release);
        let waker = self.waker.lock().ok().and_then(|mut w| w.take());
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Whether it is stopped (or will stop at its next await point).
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::Acquire)
    }
}

/// A future that is not polled while its [`Freeze`] is on.
pub struct Frozen<F> {
    inner: Pin<Box<F>>,
    gate: std::sync::Arc<Freeze>,
}

impl<F: Future> Frozen<F> {
    /// `inner`, stopped and resumed by `gate`.
    pub fn new(inner: F, gate: std::sync::Arc<Freeze>) -> Self {
        Self {
            inner: Box::pin(inner),
            gate,
        }
    }
}

impl<F: Future> Future for Frozen<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        if this.gate.is_frozen() {
            if let Ok(mut w) = this.gate.waker.lock() {
                *w = Some(cx.waker().clone());
            }
            // Thawed between the check and the waker's registration: its wake found nothing.
            if this.gate.is_frozen() {
                return Poll::Pending;
            }
        }
        this.inner.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_frozen_task_makes_no_progress_until_thawed() {
        let gate = Arc::new(Freeze::default());
        let ticks = Arc::new(AtomicUsize::new(0));
        let counting = ticks.clone();
        let task = tokio::spawn(Frozen::new(
            async move {
                loop {
                    counting.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            },
            gate.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        gate.freeze();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let stopped = ticks.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(ticks.load(Ordering::Relaxed), stopped);
        gate.thaw();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(ticks.load(Ordering::Relaxed) > stopped);
        task.abort();
    }
}
