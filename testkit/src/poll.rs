//! Waiting for a condition with a deadline, instead of sleeping for it: [`eventually`] asks a
//! probe again every 25 ms until it answers, and fails the test with the probe's last word
//! when the deadline passes.

use std::future::Future;
use std::time::Duration;

/// How long [`eventually`] waits between two questions.
const EVERY: Duration = Duration::from_millis(25);

/// What a probe found: done with a value, or not yet (and what it saw, for the failure).
#[derive(Debug)]
pub enum Probe<T> {
    /// The condition holds.
    Done(T),
    /// Not yet: what was seen.
    Not(String),
}

/// Asks `probe` until it answers [`Probe::Done`], at most `within`; panics naming `what` and
/// the last thing the probe saw otherwise. Answers the value and how long it took.
pub async fn eventually<T, F, Fut>(within: Duration, what: &str, mut probe: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Probe<T>>,
{
    let started = tokio::time::Instant::now();
    let deadline = started + within;
    loop {
        match probe().await {
            Probe::Done(value) => return (value, started.elapsed()),
            Probe::Not(seen) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: not within {within:?}; last seen: {seen}"
                );
            }
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Asks `holds` until it answers true, at most `within`; panics naming `what` otherwise.
/// Answers how long it took.
pub async fn until<F, Fut>(within: Duration, what: &str, mut holds: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let probe = || {
        let holds = holds();
        async move {
            if holds.await {
                Probe::Done(())
            } else {
                Probe::Not("not yet".into())
            }
        }
    };
    eventually(within, what, probe).await.1
}

/// Asks `GET url` through `client` until it answers `want`, at most `within`; panics with the
/// last answer seen otherwise.
#[cfg(feature = "http")]
pub async fn answers(client: &reqwest::Client, url: &str, want: u16, within: Duration) -> Duration {
    let probe = || {
        let request = client.get(url).send();
        async move {
            match request.await.map(|r| r.status().as_u16()) {
                Ok(status) if status == want => Probe::Done(()),
                Ok(status) => Probe::Not(format!("{status}")),
                Err(e) => Probe::Not(format!("no answer: {e}")),
            }
        }
    };
    eventually(within, &format!("GET {url} answering {want}"), probe)
        .await
        .1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_probe_is_asked_until_it_answers_and_no_longer() {
        let mut asked = 0;
        let (value, took) = eventually(Duration::from_secs(1), "third time", || {
            asked += 1;
            let n = asked;
            async move {
                if n == 3 {
                    Probe::Done(n)
                } else {
                    Probe::Not(format!("{n}"))
                }
            }
        })
        .await;
        assert_eq!((value, took), (3, EVERY * 2));
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "never true: not within 100ms; last seen: not yet")]
    async fn a_condition_that_never_holds_fails_naming_it() {
        until(Duration::from_millis(100), "never true", || async { false }).await;
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "never: not within 100ms; last seen: still no")]
    async fn a_probe_that_never_answers_fails_with_what_it_saw() {
        eventually(Duration::from_millis(100), "never", || async {
            Probe::<()>::Not("still no".into())
        })
        .await;
    }
}
