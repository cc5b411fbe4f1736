//! etcdctl against the proxy and against etcd: watch, lock, elect and txn, and authentication as principals.

use super::*;

/// Lease ids (16 hex digits) and timings replaced by placeholders.
fn shape(s: &str) -> String {
    s.split_inclusive(|c: char| c.is_whitespace() || c == '/' || c == '"')
        .map(|w| {
            let bare = w.trim_end_matches(|c: char| c.is_whitespace() || c == '/' || c == '"');
            let tail = &w[bare.len()..];
            if bare.len() >= 12 && bare.chars().all(|c| c.is_ascii_hexdigit()) {
                format!("ID{tail}")
            } else if is_go_duration(bare) {
                format!("TIME{tail}")
            } else {
                w.to_owned()
            }
        })
        .collect()
}

/// A Go `time.Duration` as printed: "730.989µs", "1.2ms", "3s", "1m2.5s".
fn is_go_duration(word: &str) -> bool {
    let units = ["ns", "µs", "us", "ms", "h", "m", "s"];
    let mut rest = word;
    let mut parts = 0;
    while !rest.is_empty() {
        let number = rest.len()
            - rest
                .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.')
                .len();
        if number == 0 {
            return false;
        }
        rest = &rest[number..];
        match units.iter().find(|u| rest.starts_with(**u)) {
            Some(unit) => rest = &rest[unit.len()..],
            None => return false,
        }
        parts += 1;
    }
    parts > 0
}

#[test]
fn every_go_duration_is_shaped() {
    for took in ["730.989µs", "1.2ms", "3s", "1m2.5s", "850ns"] {
        assert_eq!(shape(&format!("took = {took}")), "took = TIME", "{took}");
    }
    for word in ["ms", "12", "1.5x", "m/"] {
        assert_eq!(shape(word), word);
    }
}

/// One side's run of etcdctl's streaming commands: watch, lock by two processes at once, elect.
async fn streaming_commands(endpoint: &str, dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let run = |args: &[&str]| output(etcdctl(endpoint).args(args).output().unwrap());

    // watch: started, then written to, then stopped.
    let watch = etcdctl(endpoint)
        .args(["watch", "--prefix", "--prev-kv", "w/"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for args in [
        &["put", "w/a", "1"][..],
        &["put", "w/a", "2"],
        &["put", "x", "outside the watch"],
        &["del", "w/a"],
    ] {
        out.push(run(args));
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    testkit_kill(&watch);
    out.push(output(watch.wait_with_output().unwrap()).replace("-1 | ", "killed | "));

    // lock: two processes, each holding L for a second; their sections must not overlap.
    let log = dir.join("lock.log");
    let section = format!(
        "echo in $ETCD_LOCK_KEY >> {log}; sleep 1; echo out >> {log}",
        log = log.display()
    );
    let (a, b) = tokio::join!(
        tokio::task::spawn_blocking({
            let mut c = etcdctl(endpoint);
            c.args(["lock", "L", "--", "sh", "-c", &section]);
            move || c.output().unwrap()
        }),
        tokio::task::spawn_blocking({
            let mut c = etcdctl(endpoint);
            c.args(["lock", "L", "--", "sh", "-c", &section]);
            move || c.output().unwrap()
        }),
    );
    out.push(output(a.unwrap()));
    out.push(output(b.unwrap()));
    out.push(shape(&std::fs::read_to_string(&log).unwrap()));

    // elect: a leader, then an observer who sees it.
    let leader = etcdctl(endpoint)
        .args(["elect", "E", "p1"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let observer = etcdctl(endpoint)
        .args(["elect", "-l", "E"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    testkit_kill(&observer);
    testkit_kill(&leader);
    for child in [leader, observer] {
        out.push(shape(&output(child.wait_with_output().unwrap())));
    }

    // txn, read from standard input as etcdctl reads it.
    let mut txn = etcdctl(endpoint)
        .arg("txn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    txn.stdin
        .take()
        .unwrap()
        .write_all(b"value(\"w/b\") = \"\"\n\nput w/b first\n\nput w/b second\n\n")
        .unwrap();
    out.push(output(txn.wait_with_output().unwrap()));
    out.push(run(&["get", "w/b"]));
    out.push(
        shape(&run(&["endpoint", "health"]))
            .replace(endpoint.trim_start_matches("http://"), "HOST"),
    );
    out
}

fn testkit_kill(child: &std::process::Child) {
    lease_proxy_testkit::signal_pid(child.id(), "TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch_lock_elect_and_txn_as_against_etcd() {
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let proxy = Proxy::start(behind.endpoints(), |_| {}).await;
    let (etcd_dir, proxy_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let etcd_side = streaming_commands(&raw_etcd.endpoint(0), etcd_dir.path()).await;
    let ours = streaming_commands(&proxy.url, proxy_dir.path()).await;
    for (i, (etcd, ours)) in etcd_side.iter().zip(&ours).enumerate() {
        assert_eq!(
            ours, etcd,
            "step {i}: the proxy's output (left) differs from etcd's"
        );
    }
    assert_eq!(ours.len(), etcd_side.len());
    // The two lockers' sections did not overlap.
    let log = std::fs::read_to_string(proxy_dir.path().join("lock.log")).unwrap();
    let steps: Vec<&str> = log.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(steps, ["in", "out", "in", "out"], "{log}");

    // endpoint status and member list: the proxy answers for itself where etcd would name its
    // members.
    let status = etcdctl(&proxy.url)
        .args(["endpoint", "status", "-w", "json"])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status[0]["Status"]["version"].as_str().is_some(),
        "{status}"
    );
    let members = etcdctl(&proxy.url)
        .args(["member", "list", "-w", "json"])
        .output()
        .unwrap();
    let members: serde_json::Value = serde_json::from_slice(&members.stdout).unwrap();
    assert_eq!(
        members["members"][0]["clientURLs"],
        serde_json::json!([proxy.url]),
        "{members}"
    );
}

/// etcd's Auth service as etcdctl meets it: with authentication off, `--user` is answered
/// "authentication is not enabled" and etcdctl goes on as against etcd; with `--auth-tokens`,
/// a principal's name and token as user and password authenticate, anything else is refused as
/// etcd refuses a wrong password, and user and role changes are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_users_authenticate_as_principals() {
    const ACME: &str = "acme-token-0f3e9a";
    let raw_etcd = Etcd::single().await;
    let behind = Etcd::single().await;
    let open = Proxy::start(behind.endpoints(), |_| {}).await;
    // stdout and the exit code: stderr carries a log line with a time and a random target.
    let run = |endpoint: &str, args: &[&str]| {
        let out = etcdctl(endpoint).args(args).output().unwrap();
        format!(
            "{} | {}",
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).trim()
        )
    };
    for args in [
        &["--user", "someone:secret", "put", "k", "v"][..],
        &["--user", "someone:secret", "get", "k"],
    ] {
        assert_eq!(
            run(&open.url, args),
            run(&raw_etcd.endpoint(0), args),
            "{args:?}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    let lines =
        token_line("acme", ACME, "v3:*") + &token_line("lessee", "lessee-token", "acquire:*");
    std::fs::write(&tokens, lines).unwrap();
    let proxy = Proxy::start(behind.endpoints(), |c| c.auth_tokens = Some(tokens.clone())).await;
    let acme = format!("acme:{ACME}");
    assert_eq!(
        run(&proxy.url, &["--user", &acme, "put", "k", "acme's"]),
        "0 | OK"
    );
    assert_eq!(
        run(
            &proxy.url,
            &["--user", &acme, "get", "k", "--print-value-only"]
        ),
        "0 | acme's"
    );
    let mut raw = behind.client().await;
    let stored = raw.get("/lease-proxy/v3/kv/acme/k", None).await.unwrap();
    assert_eq!(
        stored.kvs().len(),
        1,
        "acme's key is not in acme's namespace"
    );
    let failed = "etcdserver: authentication failed, invalid user ID or password";
    // A principal without `v3:*` authenticates, as etcd's user without roles does, and is
    // refused at its call, as that user is.
    let denied = "etcdserver: permission denied";
    for (user, refusal) in [
        ("acme:wrong", failed),
        ("other:acme-token-0f3e9a", failed),
        ("lessee:lessee-token", denied),
    ] {
        let out = etcdctl(&proxy.url)
            .args(["--user", user, "get", "k"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{user} was let in");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(refusal), "{user}: {stderr}");
    }
    let out = etcdctl(&proxy.url)
        .args(["--user", &acme, "user", "add", "bob:pw"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("etcdserver: permission denied"));
}
