//! Resource binding (docs/DESIGN.md §4): the resource fence-gateway fences is exactly the resource
//! the storage writes.
//!
//! Every row is a request written verbatim on a raw TCP connection (no client library to
//! normalise the path) to the real fence-gateway binary in front of a storage that records what
//! reached it. A row either is refused with a 4xx and nothing reaches the storage, or reaches
//! it in a form that every plausible reading of the path — raw, decoded once or twice, with
//! backslashes as slashes, path parameters dropped, dot-segments resolved, `//` merged, the
//! prefix matched without case — names the resource the token was minted for, with exactly that
//! resource in `Fencing-Resource` and exactly one `Fencing-Token`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use common::{key_file, GatewayProcess};
use fencing::{Keyring, Token};
use lease_proxy_testkit::recording::{Received, Storage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The path-mode pattern's literal prefix: `/inventory/{resource}`.
const PREFIX: &[&str] = &["inventory"];

/// What a row must come to.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// A 4xx, and nothing reached the storage.
    Refused,
    /// Path mode: reached the storage once; every reading of the path names this resource, and
    /// so do the fencing headers the storage got.
    Written(&'static str),
    /// Header mode: reached the storage once with this resource (and only it) in
    /// `Fencing-Resource` and one token for it. The path is the storage's to check in header
    /// mode (the example inventory does).
    HeaderBound(&'static str),
    /// A read: passed to the storage once, without any fencing header.
    Read,
}

struct Row {
    name: &'static str,
    method: &'static str,
    target: Vec<u8>,
    headers: Vec<(&'static str, Vec<u8>)>,
    /// Raw bytes after the header block; writes without one get `count=1` with its length.
    body: Option<&'static [u8]>,
    expect: Expect,
}

/// The request bytes, exactly as the row says.
fn bytes(row: &Row) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(row.method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(&row.target);
    out.extend_from_slice(b" HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n");
    for (name, value) in &row.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    let read = matches!(row.method, "GET" | "HEAD" | "OPTIONS");
    let body = match row.body {
        Some(body) => body,
        None if read => b"",
        None => {
            out.extend_from_slice(b"content-length: 7\r\n");
            b"count=1"
        }
    };
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// Sends `request` on a fresh connection and returns the response's status (0 if none) and its
/// `Fencing-Rejection` slug (who refused, and why; none when the HTTP parser refused).
async fn send(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut response = Vec::new();
    // `connection: close`: the gateway ends the exchange. A refusal may come before the body
    // was read, so a reset after the status line still counts.
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response)).await;
    let text = String::from_utf8_lossy(&response);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let slug = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case(fencing::REJECTION_HEADER)
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_default();
    (status, slug)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |j: usize| {
            bytes
                .get(j)
                .and_then(|b| char::from(*b).to_digit(16))
                .map(|d| d as u8)
        };
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(hi * 16 + lo);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The resource each plausible storage reads from `path` (`None`: no resource at all). Written
/// independently of the gateway's classifier, as the storages it guards against would read.
fn readings(path: &str) -> Vec<(String, Option<String>)> {
    // A strict router: the raw segments, the prefix byte for byte.
    let raw: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let strict = (raw.len() > PREFIX.len() && raw.iter().zip(PREFIX).all(|(s, p)| s == p))
        .then(|| raw[PREFIX.len()].to_owned());
    let mut readings = vec![("strict".to_owned(), strict)];
    let once = percent_decode(path);
    let twice = percent_decode(&once);
    for (decoding, text) in [
        ("raw", path.to_owned()),
        ("decoded", once),
        ("decoded twice", twice),
    ] {
        for backslash in [false, true] {
            let text = if backslash {
                text.replace('\\', "/")
            } else {
                text.clone()
            };
            // Path parameters dropped, dot-segments resolved, empty segments merged.
            let mut segments: Vec<&str> = Vec::new();
            for segment in text.split('/') {
                match segment.split(';').next().unwrap_or("") {
                    "" | "." => {}
                    ".." => {
                        segments.pop();
                    }
                    s => segments.push(s),
                }
            }
            let lenient = (segments.len() > PREFIX.len()
                && segments
                    .iter()
                    .zip(PREFIX)
                    .all(|(s, p)| s.eq_ignore_ascii_case(p)))
            .then(|| segments[PREFIX.len()].to_owned());
            let how = format!("{decoding}{}", if backslash { ", \\ as /" } else { "" });
            readings.push((how, lenient));
        }
    }
    readings
}

/// What a request that should have been refused did at the storage: which resources its path
/// reads as, and the `Fencing-Resource` values the storage got.
fn reached(r: &Received) -> String {
    let mut read: Vec<String> = readings(&r.path)
        .into_iter()
        .map(|(_, resource)| resource.unwrap_or_else(|| "(none)".into()))
        .collect();
    read.sort();
    read.dedup();
    let headers: Vec<String> = r
        .all("fencing-resource")
        .iter()
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    format!(
        " ({} {}: path reads as {read:?}, Fencing-Resource {headers:?})",
        r.method, r.path
    )
}

/// Every value of one header.
type Values = Vec<Vec<u8>>;

/// Every `Fencing-Resource`, `Fencing-Token` and `X-Fencing-Token` value the storage got.
fn fencing_headers(r: &Received) -> (Values, Values, Values) {
    (
        r.all("fencing-resource"),
        r.all("fencing-token"),
        r.all("x-fencing-token"),
    )
}

/// Whether `got` (the status and what reached the storage) is what the row expects; `Err` says
/// why not.
fn check(keys: &Keyring, expect: Expect, status: u16, got: &[Received]) -> Result<(), String> {
    let one = |status_ok: bool| -> Result<&Received, String> {
        if !status_ok {
            return Err(format!("status {status}"));
        }
        match got {
            [r] => Ok(r),
            _ => Err(format!("{} requests reached the storage", got.len())),
        }
    };
    let bound = |r: &Received, resource: &str| -> Result<(), String> {
        let (resources, tokens, legacy) = fencing_headers(r);
        if resources != [resource.as_bytes()] {
            return Err(format!(
                "storage got Fencing-Resource {:?}",
                resources
                    .iter()
                    .map(|v| String::from_utf8_lossy(v))
                    .collect::<Vec<_>>()
            ));
        }
        match (tokens.as_slice(), legacy.len()) {
            ([token], 0)
                if keys
                    .verify(resource, &String::from_utf8_lossy(token))
                    .is_ok() =>
            {
                Ok(())
            }
            _ => Err(format!(
                "storage got {} Fencing-Token and {} X-Fencing-Token, not one token for {resource}",
                tokens.len(),
                legacy.len()
            )),
        }
    };
    match expect {
        Expect::Refused if (400..500).contains(&status) && got.is_empty() => Ok(()),
        Expect::Refused => Err(format!(
            "status {status}, {} requests reached the storage{}",
            got.len(),
            got.first().map(reached).unwrap_or_default()
        )),
        Expect::Written(resource) => {
            let r = one(status == 200)?;
            for (how, read) in readings(&r.path) {
                if read.as_deref() != Some(resource) {
                    return Err(format!(
                        "storage got {} {}, which reads ({how}) as {read:?}",
                        r.method, r.path
                    ));
                }
            }
            bound(r, resource)
        }
        Expect::HeaderBound(resource) => bound(one(status == 200)?, resource),
        Expect::Read => {
            let r = one(status == 200)?;
            let (resources, tokens, legacy) = fencing_headers(r);
            if resources.is_empty() && tokens.is_empty() && legacy.is_empty() {
                Ok(())
            } else {
                Err("client-sent fencing headers reached the storage on a read".into())
            }
        }
    }
}

/// Sends each row to `gateway` and checks what came back and what reached `storage`; returns
/// the table (markdown) and the failures.
async fn run_rows(
    rows: &[Row],
    keys: &Keyring,
    gateway: &GatewayProcess,
    storage: &Storage,
) -> (String, Vec<String>) {
    let mut table = String::new();
    let mut failures = Vec::new();
    for row in rows {
        let (status, slug) = send(gateway.addr, &bytes(row)).await;
        let got = storage.log.take();
        let verdict = check(keys, row.expect, status, &got);
        let mut target: String = String::from_utf8_lossy(&row.target)
            .chars()
            .take(61)
            .collect();
        if target.chars().count() > 60 {
            target.pop();
            target.push('…');
        }
        let _ = writeln!(
            table,
            "| {} | `{} {}` | {:?} | {status} {slug} | {} |",
            row.name,
            row.method,
            target.replace('|', "\\|"),
            row.expect,
            match &verdict {
                Ok(()) => "ok".to_owned(),
                Err(e) => format!("FAIL: {e}"),
            }
        );
        if let Err(e) = verdict {
            failures.push(format!("{}: {e}", row.name));
        }
    }
    (table, failures)
}

/// A token for `resource`, as the proxy would mint it for its holder.
fn token(keys: &Keyring, resource: &str) -> Vec<u8> {
    keys.mint(resource, Token::new(0, 7)).into_bytes()
}

fn path_mode_rows(keys: &Keyring) -> Vec<Row> {
    let t1 = token(keys, "aisle-1");
    let fr = |r: &str| ("fencing-resource", r.as_bytes().to_vec());
    let ft = |t: &[u8]| ("fencing-token", t.to_vec());
    // The holder of aisle-1 tries to write aisle-2 (or no aisle) with its own token, naming
    // aisle-1 in the header where that used to matter.
    let attack = |name: &'static str, target: &[u8]| Row {
        name,
        method: "PUT",
        target: target.to_vec(),
        headers: vec![fr("aisle-1"), ft(&t1)],
        body: None,
        expect: Expect::Refused,
    };
    let write = |name, target: &[u8], headers: Vec<(&'static str, Vec<u8>)>, expect| Row {
        name,
        method: "PUT",
        target: target.to_vec(),
        headers,
        body: None,
        expect,
    };
    let long = "x".repeat(201);
    let t_long = token(keys, &long);
    vec![
        // Canonical spellings are written, to the resource named.
        write(
            "canonical",
            b"/inventory/aisle-1",
            vec![ft(&t1)],
            Expect::Written("aisle-1"),
        ),
        write(
            "canonical, sub-path, agreeing header",
            b"/inventory/aisle-1/count",
            vec![fr("aisle-1"), ft(&t1)],
            Expect::Written("aisle-1"),
        ),
        write(
            "trailing slash",
            b"/inventory/aisle-1/",
            vec![ft(&t1)],
            Expect::Written("aisle-1"),
        ),
        write(
            "query holding a traversal",
            b"/inventory/aisle-1?to=/../aisle-2",
            vec![ft(&t1)],
            Expect::Written("aisle-1"),
        ),
        write(
            "fragment holding a traversal",
            b"/inventory/aisle-1#/../aisle-2",
            vec![ft(&t1)],
            Expect::Written("aisle-1"),
        ),
        write(
            "harmless encoding after the resource",
            b"/inventory/aisle-1/a%20b",
            vec![ft(&t1)],
            Expect::Written("aisle-1"),
        ),
        write(
            "absolute-form target",
            b"http://127.0.0.1/inventory/aisle-1",
            vec![ft(&t1)],
            Expect::Written("aisle-1"),
        ),
        write(
            "legacy X-Fencing-Token alone",
            b"/inventory/aisle-1",
            vec![("x-fencing-token", t1.clone())],
            Expect::Written("aisle-1"),
        ),
        // Dot-segments, raw and encoded.
        attack("dot-dot", b"/inventory/aisle-1/../aisle-2"),
        attack("dot-dot deeper", b"/inventory/aisle-1/x/../../aisle-2"),
        attack("%2e%2e", b"/inventory/aisle-1/%2e%2e/aisle-2"),
        // Encoded non-ASCII that NFKC or a lenient UTF-8 decoder turns into dots or a slash.
        attack(
            "encoded fullwidth dots",
            b"/inventory/aisle-1/%ef%bc%8e%ef%bc%8e/aisle-2",
        ),
        attack(
            "encoded ideographic full stops",
            b"/inventory/aisle-1/%E3%80%82%E3%80%82/aisle-2",
        ),
        attack(
            "overlong-UTF-8 dots",
            b"/inventory/aisle-1/%c0%ae%c0%ae/aisle-2",
        ),
        attack(
            "overlong-UTF-8 slashes",
            b"/inventory/aisle-1/%c0%af..%c0%afaisle-2",
        ),
        attack("%2E%2E", b"/inventory/aisle-1/%2E%2E/aisle-2"),
        attack("%2e%2E mixed case", b"/inventory/aisle-1/%2e%2E/aisle-2"),
        attack(".%2e half encoded", b"/inventory/aisle-1/.%2e/aisle-2"),
        attack(
            "%252e double encoded",
            b"/inventory/aisle-1/%252e%252e/aisle-2",
        ),
        attack("%u002e (IIS)", b"/inventory/aisle-1/%u002e%u002e/aisle-2"),
        attack("..; path parameter", b"/inventory/aisle-1/..;x=1/aisle-2"),
        attack("trailing /..", b"/inventory/aisle-1/.."),
        attack("trailing /.", b"/inventory/aisle-1/."),
        attack("trailing /%2e", b"/inventory/aisle-1/%2e"),
        attack("dot segment before prefix", b"/./inventory/aisle-2"),
        attack("dot-dot before prefix", b"/../inventory/aisle-2"),
        attack("dot segment as resource", b"/inventory/./aisle-2"),
        // Empty segments.
        attack("//aisle-2", b"//aisle-2"),
        attack("//inventory/…", b"//inventory/aisle-2"),
        attack("inventory//aisle-2", b"/inventory//aisle-2"),
        attack("// after the resource", b"/inventory/aisle-1//x"),
        // Encoded and raw separators.
        attack("%2f in the resource", b"/inventory/aisle-1%2f..%2faisle-2"),
        attack("%2F after the resource", b"/inventory/aisle-1/..%2Faisle-2"),
        attack("%5c after the resource", b"/inventory/aisle-1/..%5caisle-2"),
        attack("raw backslash", b"/inventory/aisle-1\\..\\aisle-2"),
        attack("%25 in a later segment", b"/inventory/aisle-1/%25"),
        attack("malformed %", b"/inventory/aisle-1/%zz"),
        // The prefix must match byte for byte, unencoded.
        attack("/Inventory", b"/Inventory/aisle-2"),
        attack("/INVENTORY", b"/INVENTORY/aisle-2"),
        attack("%69nventory", b"/%69nventory/aisle-2"),
        attack("prefix with ;param", b"/inventory;x/aisle-2"),
        attack(
            "path outside the pattern (no header fallback)",
            b"/other/aisle-2",
        ),
        attack(
            "non-ASCII in the path",
            "/inventory/aisle-1/\u{ff0e}\u{ff0e}/aisle-2".as_bytes(),
        ),
        // The resource segment: the grammar, no encoding.
        write(
            "%2d in the resource",
            b"/inventory/aisle%2d1",
            vec![ft(&t1)],
            Expect::Refused,
        ),
        write(
            "%61 in the resource",
            b"/inventory/%61isle-1",
            vec![ft(&t1)],
            Expect::Refused,
        ),
        write(
            ";param in the resource",
            b"/inventory/aisle-1;v=2",
            vec![ft(&token(keys, "aisle-1;v=2"))],
            Expect::Refused,
        ),
        write(
            "a..b resource",
            b"/inventory/a..b",
            vec![ft(&token(keys, "a..b"))],
            Expect::Refused,
        ),
        write(
            "overlong resource (201 bytes)",
            format!("/inventory/{long}").as_bytes(),
            vec![ft(&t_long)],
            Expect::Refused,
        ),
        // The header may only repeat the path's resource, once, in the grammar.
        write(
            "header disagrees with path",
            b"/inventory/aisle-2",
            vec![fr("aisle-1"), ft(&t1)],
            Expect::Refused,
        ),
        write(
            "header names the path's, token another's",
            b"/inventory/aisle-2",
            vec![fr("aisle-2"), ft(&t1)],
            Expect::Refused,
        ),
        write(
            "two Fencing-Resource, same value",
            b"/inventory/aisle-1",
            vec![fr("aisle-1"), fr("aisle-1"), ft(&t1)],
            Expect::Refused,
        ),
        write(
            "two Fencing-Resource, path's first",
            b"/inventory/aisle-1",
            vec![fr("aisle-1"), fr("aisle-2"), ft(&t1)],
            Expect::Refused,
        ),
        write(
            "obs-text Fencing-Resource",
            b"/inventory/aisle-1",
            vec![("fencing-resource", b"aisle-2\xe9".to_vec()), ft(&t1)],
            Expect::Refused,
        ),
        write(
            "Fencing-Token and X-Fencing-Token",
            b"/inventory/aisle-1",
            vec![ft(&t1), ("x-fencing-token", token(keys, "aisle-2"))],
            Expect::Refused,
        ),
        write(
            "two Fencing-Token",
            b"/inventory/aisle-1",
            vec![ft(&t1), ft(&t1)],
            Expect::Refused,
        ),
        write(
            "no token",
            b"/inventory/aisle-1",
            vec![fr("aisle-1")],
            Expect::Refused,
        ),
        write(
            "token of another resource",
            b"/inventory/aisle-2",
            vec![ft(&t1)],
            Expect::Refused,
        ),
        // Reads pass without fencing headers, unless they carry a body.
        Row {
            name: "read with fencing headers",
            method: "GET",
            target: b"/inventory/aisle-2".to_vec(),
            headers: vec![fr("aisle-1"), ft(&t1)],
            body: None,
            expect: Expect::Read,
        },
        Row {
            name: "GET with Content-Length body",
            method: "GET",
            target: b"/inventory/aisle-2".to_vec(),
            headers: vec![("content-length", b"7".to_vec())],
            body: Some(b"count=9"),
            expect: Expect::Refused,
        },
        Row {
            name: "GET with chunked body",
            method: "GET",
            target: b"/inventory/aisle-2".to_vec(),
            headers: vec![("transfer-encoding", b"chunked".to_vec())],
            body: Some(b"7\r\ncount=9\r\n0\r\n\r\n"),
            expect: Expect::Refused,
        },
    ]
}

fn header_mode_rows(keys: &Keyring) -> Vec<Row> {
    let t1 = token(keys, "aisle-1");
    let fr = |r: &[u8]| ("fencing-resource", r.to_vec());
    let ft = |t: &[u8]| ("fencing-token", t.to_vec());
    let write = |name, target: &[u8], headers: Vec<(&'static str, Vec<u8>)>, expect| Row {
        name,
        method: "PUT",
        target: target.to_vec(),
        headers,
        body: None,
        expect,
    };
    let long = "x".repeat(201);
    vec![
        write(
            "header mode: one valid header",
            b"/inventory/aisle-1/count",
            vec![fr(b"aisle-1"), ft(&t1)],
            Expect::HeaderBound("aisle-1"),
        ),
        write(
            "header mode: legacy token header",
            b"/inventory/aisle-1/count",
            vec![fr(b"aisle-1"), ("x-fencing-token", t1.clone())],
            Expect::HeaderBound("aisle-1"),
        ),
        // The gateway cannot see that the path names another aisle; the storage is told the
        // verified resource and must compare (the example inventory answers 403).
        write(
            "header mode: path names another resource",
            b"/inventory/aisle-2/count",
            vec![fr(b"aisle-1"), ft(&t1)],
            Expect::HeaderBound("aisle-1"),
        ),
        write(
            "header mode: no header",
            b"/inventory/aisle-1/count",
            vec![ft(&t1)],
            Expect::Refused,
        ),
        write(
            "header mode: two headers, same value",
            b"/inventory/aisle-1/count",
            vec![fr(b"aisle-1"), fr(b"aisle-1"), ft(&t1)],
            Expect::Refused,
        ),
        write(
            "header mode: two headers",
            b"/inventory/aisle-1/count",
            vec![fr(b"aisle-1"), fr(b"aisle-2"), ft(&t1)],
            Expect::Refused,
        ),
        write(
            "header mode: obs-text header",
            b"/inventory/aisle-1/count",
            vec![fr(b"aisle-1\xe9"), ft(&t1)],
            Expect::Refused,
        ),
        write(
            "header mode: ../ in the header",
            b"/inventory/aisle-1/count",
            vec![fr(b"../aisle-1"), ft(&token(keys, "../aisle-1"))],
            Expect::Refused,
        ),
        write(
            "header mode: %2d in the header",
            b"/inventory/aisle-1/count",
            vec![fr(b"aisle%2d1"), ft(&token(keys, "aisle%2d1"))],
            Expect::Refused,
        ),
        write(
            "header mode: overlong header (201 bytes)",
            b"/inventory/aisle-1/count",
            vec![fr(long.as_bytes()), ft(&token(keys, &long))],
            Expect::Refused,
        ),
        write(
            "header mode: token of another resource",
            b"/inventory/aisle-2/count",
            vec![fr(b"aisle-2"), ft(&t1)],
            Expect::Refused,
        ),
        Row {
            name: "header mode: GET with body",
            method: "GET",
            target: b"/inventory/aisle-2/count".to_vec(),
            headers: vec![("content-length", b"7".to_vec())],
            body: Some(b"count=9"),
            expect: Expect::Refused,
        },
    ]
}

/// Runs the rows `build` makes against a gateway started with `flags`, prints the table, and
/// fails listing every row that did not come out as expected.
async fn table(build: fn(&Keyring) -> Vec<Row>, flags: &[&str]) {
    // The rows mint with the gateway's keys: start from its key file.
    let dir = tempfile::tempdir().unwrap();
    let (key_path, keys) = key_file(dir.path());
    let storage = Storage::start().await;
    let gateway = GatewayProcess::start(&storage.url, &key_path, flags).await;
    let rows = build(&keys);
    let (table, failures) = run_rows(&rows, &keys, &gateway, &storage).await;
    println!("| row | request | expected | got | verdict |\n|---|---|---|---|---|\n{table}");
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_mode_fences_the_resource_written() {
    assert!(path_mode_rows(&common::keyring("k1")).len() >= 30);
    table(
        path_mode_rows,
        &["--resource-path", "/inventory/{resource}"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_mode_fences_the_header_resource_only() {
    table(header_mode_rows, &[]).await;
}
