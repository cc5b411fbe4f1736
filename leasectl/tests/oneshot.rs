//! The one-shot subcommands and `watch` against a real etcd and proxy: each prints what the API
//! answers and exits with the documented status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Stack;
use lease_proxy_testkit::pki::Pki;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_get_list_renew_release_print_the_answers() {
    let stack = Stack::start().await;
    let (code, out, err) = stack
        .run(&["acquire", "scanner-1", "--ttl", "30", "--holder", "ops"])
        .await;
    assert_eq!(code, 0, "{err}");
    let grant = json(&out);
    assert_eq!(grant["resource"], "scanner-1");
    assert_eq!(grant["holder"], "ops");
    assert_eq!(grant["ttl_seconds"], 30);
    let secret = grant["secret"].as_str().unwrap();
    let token = grant["token"].as_str().unwrap();
    let verified = stack
        .keys
        .verify("scanner-1", grant["fencing_token"].as_str().unwrap())
        .unwrap();
    assert_eq!(verified.revision.to_string(), token);
    let (status, held) = stack.get("scanner-1").await;
    assert_eq!(status, 200);
    assert_eq!(
        (held["holder"].as_str(), held["token"].as_str()),
        (Some("ops"), Some(token))
    );

    let (code, _, err) = stack
        .run(&["acquire", "scanner-1", "--ttl", "30", "--holder", "other"])
        .await;
    assert_eq!(code, 75, "held: {err}");
    assert!(err.contains("ops"), "{err}");

    let (code, out, _) = stack.run(&["get", "scanner-1"]).await;
    assert_eq!(code, 0);
    let got = json(&out);
    assert_eq!(
        (got["holder"].as_str(), got["token"].as_str()),
        (Some("ops"), Some(token))
    );
    assert_eq!(got["lease_id"], grant["lease_id"]);
    assert!(got.get("secret").is_none());

    let (_, _, _) = stack.run(&["acquire", "scanner-2", "--ttl", "30"]).await;
    let (_, _, _) = stack.run(&["acquire", "other-1", "--ttl", "30"]).await;
    let (code, out, _) = stack.run(&["list", "--prefix", "scanner-"]).await;
    assert_eq!(code, 0);
    let listed: Vec<String> = out
        .lines()
        .map(|l| json(l)["resource"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, ["scanner-1", "scanner-2"]);

    let (code, out, err) = stack.run(&["renew", "scanner-1", "--secret", secret]).await;
    assert_eq!(code, 0, "{err}");
    let renewal = json(&out);
    assert_eq!(renewal["token"].as_str(), Some(token));
    assert_eq!(renewal["ttl_seconds"], 30);

    let (code, _, err) = stack
        .run(&["release", "scanner-1", "--secret", secret])
        .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(stack.get("scanner-1").await.0, 404);
    let (code, out, err) = stack.run(&["get", "scanner-1"]).await;
    assert_eq!((code, out.as_str()), (1, ""), "free: {err}");
    let (code, _, _) = stack
        .run(&["release", "scanner-1", "--secret", secret])
        .await;
    assert_eq!(code, 0, "release is idempotent");
    let (code, _, err) = stack.run(&["renew", "scanner-1", "--secret", secret]).await;
    assert_eq!(code, 76, "a released grant is lost: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_with_an_idempotency_key_returns_the_same_grant() {
    let stack = Stack::start().await;
    let args = [
        "acquire",
        "scanner-4",
        "--ttl",
        "30",
        "--holder",
        "cron",
        "--idempotency-key",
        "run-2026-12-01",
    ];
    let (code, first, err) = stack.run(&args).await;
    assert_eq!(code, 0, "{err}");
    let (code, again, err) = stack.run(&args).await;
    assert_eq!(code, 0, "{err}");
    let (first, again) = (json(&first), json(&again));
    assert_eq!(first["token"], again["token"]);
    assert_eq!(first["secret"], again["secret"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_waits_for_a_release_when_asked() {
    let stack = Stack::start().await;
    let (code, out, _) = stack.run(&["acquire", "scanner-3", "--ttl", "30"]).await;
    assert_eq!(code, 0);
    let first = json(&out);
    let waiting = stack
        .leasectl(&["acquire", "scanner-3", "--ttl", "30", "--wait", "20s"])
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, _, _) = stack
        .run(&[
            "release",
            "scanner-3",
            "--secret",
            first["secret"].as_str().unwrap(),
        ])
        .await;
    assert_eq!(code, 0);
    let out = tokio::time::timeout(Duration::from_secs(20), waiting.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let second = json(&String::from_utf8(out.stdout).unwrap());
    let token = |g: &Value| g["token"].as_str().unwrap().parse::<u64>().unwrap();
    assert!(token(&second) > token(&first));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_proxy_exits_69_and_a_bad_url_64() {
    let port = lease_proxy_testkit::free_port();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasectl"))
        .args(["--url", &format!("http://127.0.0.1:{port}"), "get", "x"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasectl"))
        .args(["--url", "ftp://nowhere", "get", "x"])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bearer_token_is_sent() {
    use sha2::{Digest, Sha256};
    const TOKEN: &str = "ops-4b1d9e0c77";
    let tokens = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        tokens.path(),
        format!(
            "ops {} acquire:*,read:*\n",
            hex::encode(Sha256::digest(TOKEN))
        ),
    )
    .unwrap();
    let stack = Stack::start_with(|c| c.auth_tokens = Some(tokens.path().to_owned())).await;
    let (code, _, err) = stack.run(&["get", "bay-1"]).await;
    assert_eq!(code, 69, "no token: {err}");
    assert!(err.contains("401"), "{err}");
    let (code, _, err) = stack
        .run(&["--token", TOKEN, "acquire", "bay-1", "--ttl", "30"])
        .await;
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = stack.run(&["get", "bay-1", "--token", "wrong"]).await;
    assert_eq!((code, out.as_str()), (69, ""), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_ca_file_and_a_client_certificate() {
    let pki = Pki::new("leasectl");
    let server = pki.server("proxy");
    let client = pki.client("ops", "ops", &[]);
    let http = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(pki.ca()).unwrap()).unwrap(),
        )
        .identity(reqwest::Identity::from_pem(&client.identity_pem()).unwrap())
        .build()
        .unwrap();
    let stack = Stack::start_tls(&pki, &server, http).await;
    let ca = pki.ca().to_str().unwrap();
    let (cert, key) = (client.cert.to_str().unwrap(), client.key.to_str().unwrap());
    let (code, out, err) = stack
        .run(&[
            "--ca-file",
            ca,
            "--cert",
            cert,
            "--key",
            key,
            "acquire",
            "bay-2",
            "--ttl",
            "30",
        ])
        .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["resource"], "bay-2");
    assert_eq!(stack.get("bay-2").await.0, 200);
    let (code, _, err) = stack.run(&["--ca-file", ca, "get", "bay-2"]).await;
    assert_eq!(code, 69, "no client certificate: {err}");
    let (code, _, err) = stack
        .run(&["--cert", cert, "--key", key, "get", "bay-2"])
        .await;
    assert_eq!(code, 69, "the proxy's CA not trusted: {err}");
    let (code, _, err) = stack.run(&["--cert", cert, "get", "bay-2"]).await;
    assert_eq!(code, 64, "--cert without --key: {err}");
}

#[tokio::test]
async fn prints_completions_and_a_man_page() {
    for args in [&["--completions", "bash"][..], &["--man"]] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasectl"))
            .args(args)
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("exec"),
            "{args:?}"
        );
    }
}

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

/// Waits until a just-started `leasectl watch` of `prefix` is watching: a watch "from now"
/// sees only what happens after its stream opened, and the process opens it when it gets to.
/// Acquires and releases `{prefix}probe` until the watch prints that release, reading past the
/// probes' own earlier lines, so that the lines after it are the test's.
async fn until_watching(stack: &Stack, lines: &mut Lines, prefix: &str) {
    let probe = format!("{prefix}probe");
    for _ in 0..20 {
        let (status, grant) = stack.acquire(&probe, "probe", 30, 0).await;
        assert_eq!(status, 201, "{grant}");
        let secret = grant["secret"].as_str().unwrap();
        let (code, _, err) = stack.run(&["release", &probe, "--secret", secret]).await;
        assert_eq!(code, 0, "{err}");
        while let Ok(line) = tokio::time::timeout(Duration::from_secs(1), lines.next_line()).await {
            let event = json(&line.unwrap().expect("the watch ended"));
            assert_eq!(
                event["resource"],
                probe.as_str(),
                "a line before the test's"
            );
            if event["type"] == "released" && event["token"] == grant["token"] {
                return;
            }
        }
    }
    panic!("the watch printed no probe in 20 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_events_as_json_lines() {
    let stack = Stack::start().await;
    let mut watch = stack
        .leasectl(&["watch", "--prefix", "dock-"])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    until_watching(&stack, &mut lines, "dock-").await;
    let (status, grant) = stack.acquire("dock-1", "crane", 30, 0).await;
    assert_eq!(status, 201);
    stack.acquire("other-1", "crane", 30, 0).await;
    let (code, _, _) = stack
        .run(&[
            "release",
            "dock-1",
            "--secret",
            grant["secret"].as_str().unwrap(),
        ])
        .await;
    assert_eq!(code, 0);
    let mut next = async || {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        json(&line)
    };
    let acquired = next().await;
    assert_eq!(acquired["type"], "acquired");
    assert_eq!(acquired["resource"], "dock-1");
    assert_eq!(acquired["holder"], "crane");
    assert_eq!(acquired["token"], grant["token"]);
    assert!(acquired["id"].as_str().is_some());
    let released = next().await;
    assert_eq!(released["type"], "released");
    assert_eq!(released["token"], grant["token"]);
    watch.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_after_the_last_event_id() {
    let stack = Stack::start().await;
    let (status, first) = stack.acquire("dock-2", "crane", 30, 0).await;
    assert_eq!(status, 201);
    let mut watch = stack
        .leasectl(&["watch", "--prefix", "dock-"])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    until_watching(&stack, &mut lines, "dock-").await;
    let (code, _, _) = stack
        .run(&[
            "release",
            "dock-2",
            "--secret",
            first["secret"].as_str().unwrap(),
        ])
        .await;
    assert_eq!(code, 0);
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let released = json(&line);
    assert_eq!(released["type"], "released");
    watch.kill().await.unwrap();

    let (status, second) = stack.acquire("dock-2", "hoist", 30, 0).await;
    assert_eq!(status, 201);
    let mut resumed = stack
        .leasectl(&[
            "watch",
            "--prefix",
            "dock-",
            "--last-event-id",
            released["id"].as_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(resumed.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let acquired = json(&line);
    assert_eq!(acquired["type"], "acquired", "the event missed while away");
    assert_eq!(acquired["holder"], "hoist");
    assert_eq!(acquired["token"], second["token"]);
    resumed.kill().await.unwrap();
}

/// A proxy answering something that is not its API: exit 69 (the proxy's fault), not 64 (the
/// command line's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_answer_exits_69_not_64() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The request (small, in one read is enough for this test), then the answer.
                let mut buf = vec![0u8; 64 << 10];
                let _ = stream.read(&mut buf).await;
                let body = r#"{"nonsense":1}"#;
                let answer = format!(
                    "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasectl"))
        .args(["acquire", "scanner-1", "--ttl", "30"])
        .env("LEASECTL_URL", &url)
        .env_remove("LEASECTL_TOKEN")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
}
