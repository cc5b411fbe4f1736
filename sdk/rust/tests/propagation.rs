//! A lease's token carried to the storage by `Lease::fence` on a reqwest request, through
//! fence-gateway (header mode, the proxy's keys) in front of a recording storage: the token and
//! resource arrive, a forged `X-Fencing-Token` is dropped, the old holder's late write is
//! refused 409 once a newer holder wrote, and a lost lease sends nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{revoke_in_etcd, Etcd, Proxy};
use lease_proxy_client::{AcquireOptions, Client, Error};
use lease_proxy_testkit::recording::Storage;
use lease_proxy_testkit::storage::start_gateway;

fn opts(holder: &str, ttl_secs: u64) -> AcquireOptions {
    AcquireOptions::new(holder, Duration::from_secs(ttl_secs))
}

#[tokio::test(flavor = "multi_thread")]
async fn fence_carries_the_token_to_the_gateway_which_refuses_the_old_holder() {
    let etcd = Etcd::shared().await;
    let storage = Storage::start().await;
    let keys = tempfile::tempdir().unwrap();
    let key_file = lease_proxy_testkit::proxy::key_file(keys.path());
    let gateway = start_gateway(&storage.url, &key_file).await;
    let proxy = Proxy::start_with_keys(etcd.endpoints(), key_file, |c| {
        c.min_ttl = 2;
        c.etcd_prefix = lease_proxy_testkit::prefix("sdk");
    })
    .await;
    // No loss watch for the old holder: it must still believe it holds when it writes late.
    let old_client = Client::builder(&proxy.url)
        .loss_watch(false)
        .build()
        .unwrap();
    let new_client = Client::new(&proxy.url).unwrap();
    let http = reqwest::Client::new();
    let url = format!("{gateway}/items/aisle-1");

    let old = old_client
        .acquire("aisle-1", opts("old", 30))
        .await
        .unwrap();
    let forged = http.put(&url).header("x-fencing-token", "v1.forged");
    let answer = old.fence(forged.body("old")).unwrap().send().await.unwrap();
    assert_eq!(answer.status(), 200, "{:?}", answer.text().await);

    revoke_in_etcd(&etcd, old.lease_id()).await;
    let new = new_client
        .acquire("aisle-1", opts("new", 30).wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(new.token() > old.token());
    let answer = new.fence(http.put(&url).body("new")).unwrap();
    assert_eq!(answer.send().await.unwrap().status(), 200);
    assert!(
        !old.is_lost(),
        "its renewal is 10 s away: only the storage can tell"
    );
    let late = old.fence(http.put(&url).body("late")).unwrap();
    assert_eq!(late.send().await.unwrap().status(), 409);
    let writes = storage.log.all();
    let seen: Vec<(&str, &str, String)> = writes
        .iter()
        .map(|w| (w.resource(), w.token(), w.text()))
        .collect();
    assert_eq!(
        seen,
        [
            ("aisle-1", old.fencing_token(), "old".to_owned()),
            ("aisle-1", new.fencing_token(), "new".to_owned())
        ]
    );

    // A lost lease sends nothing: the new grant revoked, its loss watch tells.
    revoke_in_etcd(&etcd, new.lease_id()).await;
    tokio::time::timeout(Duration::from_secs(10), new.lost().cancelled())
        .await
        .expect("the loss watch did not tell");
    assert!(matches!(
        new.fence(http.put(&url).body("lost")),
        Err(Error::Lost)
    ));
    assert_eq!(storage.log.len(), 2);
}
