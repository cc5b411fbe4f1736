//! Which requests are protected writes, and for which resource (docs/DESIGN.md §4,
//! "Resource binding").
//!
//! The resource the enforcer fences must be the resource the storage writes. So the decision is
//! taken on exactly what the storage will see, never on a spelling the storage may read
//! differently:
//!
//! - [`PathPattern`] (path mode) accepts only paths that are already canonical — no dot-segments,
//!   no empty segments, no encoded `.`, `/`, `\` or `%`, no encoding at all in the literal prefix
//!   or the resource segment — so the path forwarded is the path checked, and any normalisation a
//!   storage might do (resolving `..`, merging `//`, decoding once or twice) cannot move a write
//!   to another resource. There is no fallback to the `Fencing-Resource` header.
//! - [`ByHeader`] (header mode) takes the resource from exactly one `Fencing-Resource` header; the
//!   layer then gives the storage that verified resource, which the storage must use.
//!
//! Both accept only resource names of the proxy's grammar ([`is_resource`]), and refuse a read
//! that carries a body, which a lenient storage might treat as a write.

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{HeaderMap, Method, Request};

use super::Rejection;
use crate::RESOURCE_HEADER;

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not a protected write: forward untouched.
    Pass,
    /// A write to this resource: requires a valid token admitted by the gate.
    Protect(String),
    /// A request that cannot be classified safely (no resource named, an ambiguous path, a read
    /// with a body): refuse it.
    Reject(Rejection),
}

/// Decides which requests are protected writes. Closures `Fn(&Request<B>) -> Decision` implement
/// it, so an application can protect exactly the routes it needs.
pub trait Classify<B>: Clone + Send + Sync + 'static {
    /// The decision for `req`.
    fn classify(&self, req: &Request<B>) -> Decision;
}

impl<B, F> Classify<B> for F
where
    F: Fn(&Request<B>) -> Decision + Clone + Send + Sync + 'static,
{
    fn classify(&self, req: &Request<B>) -> Decision {
        self(req)
    }
}

/// Whether `name` is a resource name the enforcer fences: 1–200 bytes of `[A-Za-z0-9._:-]`,
/// starting with a letter or digit, never containing `..` — lease-proxy's grammar, so every
/// resource the proxy grants can be fenced and nothing else can. Such a name is one path segment
/// that no storage decodes or normalises into something else.
///
/// Also a `/v3` lock's own token domain, `lock/` + 2–192 lowercase hex digits
/// ([`crate::lock_resource`]), which no lease resource can equal (it has a `/`). Only a
/// `Fencing-Resource` header can name it: in path mode a `/` ends the resource segment.
fn is_resource(name: &str) -> bool {
    crate::domain::is_lock_resource(name) || crate::domain::check_resource_name(name).is_ok()
}

/// The decision for a read (GET, HEAD, OPTIONS), `None` for any other method. A read passes
/// unless it carries a body: a lenient storage may act on that body as a write, unfenced.
fn read_decision<B>(req: &Request<B>) -> Option<Decision> {
    if !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    Some(if carries_body(req.headers()) {
        Decision::Reject(Rejection::ReadWithBody)
    } else {
        Decision::Pass
    })
}

/// Any `Transfer-Encoding`, or a `Content-Length` other than exactly `0`.
fn carries_body(headers: &HeaderMap) -> bool {
    headers.contains_key(TRANSFER_ENCODING)
        || headers
            .get_all(CONTENT_LENGTH)
            .iter()
            .any(|v| v.as_bytes() != b"0")
}

/// The client's `Fencing-Resource`: `Ok(None)` if absent, the name if exactly one value in the
/// resource grammar, else the refusal.
fn resource_header<B>(req: &Request<B>) -> Result<Option<&str>, Rejection> {
    let mut values = req.headers().get_all(RESOURCE_HEADER).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(Rejection::DuplicateResource),
        (Some(v), None) => match v.to_str() {
            Ok(name) if is_resource(name) => Ok(Some(name)),
            _ => Err(Rejection::BadResource),
        },
    }
}

/// Every write (any method but GET, HEAD, OPTIONS) is protected; the resource comes from exactly
/// one `Fencing-Resource` header in the resource grammar. The path is not looked at: the storage
/// must write the resource the enforcer verified, which the layer hands it in `Fencing-Resource`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByHeader;

impl<B> Classify<B> for ByHeader {
    fn classify(&self, req: &Request<B>) -> Decision {
        if let Some(read) = read_decision(req) {
            return read;
        }
        match resource_header(req) {
            Ok(Some(resource)) => Decision::Protect(resource.to_owned()),
            Ok(None) => Decision::Reject(Rejection::MissingResource),
            Err(rejection) => Decision::Reject(rejection),
        }
    }
}

/// Every write is protected; the resource is the path segment in the position of `{resource}`
/// in a pattern such as `/inventory/{resource}`. Only canonical paths are accepted (see the
/// module docs), so the storage writes the resource the token was checked for; a write whose
/// path does not match the pattern is refused. A `Fencing-Resource` header, if sent, must be
/// exactly one value equal to the path's resource.
#[derive(Debug, Clone)]
pub struct PathPattern {
    prefix: Vec<String>,
}

impl PathPattern {
    /// Parses a pattern: `/`-separated literal segments followed by one `{resource}` segment
    /// (anything canonical after it in a request path is free). `None` if the pattern has no such
    /// segment, or a literal segment that no canonical path can match (empty, `.`, `..`, or
    /// containing `%`, `\`, `{`, `}` or anything but visible ASCII).
    pub fn parse(pattern: &str) -> Option<Self> {
        let segments: Vec<&str> = pattern.trim_matches('/').split('/').collect();
        let (last, prefix) = segments.split_last()?;
        let literal = |s: &&str| {
            !s.is_empty()
                && !is_dot_segment(s)
                && s.bytes()
                    .all(|b| b.is_ascii_graphic() && !matches!(b, b'%' | b'\\' | b'{' | b'}'))
        };
        if *last != "{resource}" || !prefix.iter().all(literal) {
            return None;
        }
        Some(Self {
            prefix: prefix.iter().map(|s| (*s).to_owned()).collect(),
        })
    }

    /// The resource named by a canonical `path`, or why the path is refused.
    fn resource_in<'p>(&self, path: &'p str) -> Result<&'p str, Rejection> {
        // Visible ASCII only: a raw byte above 0x7F may be normalised (NFKC turns `．` into `.`),
        // and a backslash is a separator to some servers.
        if path.bytes().any(|b| !b.is_ascii_graphic() || b == b'\\') {
            return Err(Rejection::AmbiguousPath);
        }
        let rest = path.strip_prefix('/').ok_or(Rejection::AmbiguousPath)?;
        let segments: Vec<&str> = rest.split('/').collect();
        let resource_at = self.prefix.len();
        for (i, segment) in segments.iter().enumerate() {
            // One trailing slash after the resource names nothing new; any other empty segment
            // is one that `//` merging would remove, shifting later segments into other roles.
            let trailing_slash = i > resource_at && i + 1 == segments.len();
            if segment.is_empty() && !trailing_slash {
                return Err(Rejection::AmbiguousPath);
            }
            // In the prefix and the resource no encoding at all: the storage's router may match
            // either the raw or the decoded spelling. After them, only encodings that cannot
            // change the segment structure on one or two decodings.
            if (i <= resource_at && segment.contains('%')) || !harmless_encodings(segment) {
                return Err(Rejection::AmbiguousPath);
            }
            // `..;x` is `..` to servers that drop path parameters (Tomcat, Jetty).
            if segment.split(';').next().is_some_and(is_dot_segment) {
                return Err(Rejection::AmbiguousPath);
            }
        }
        if segments.len() <= resource_at
            || segments
                .iter()
                .zip(&self.prefix)
                .any(|(segment, literal)| segment != literal)
        {
            return Err(Rejection::UnmatchedPath);
        }
        let resource = segments[resource_at];
        if !is_resource(resource) {
            return Err(Rejection::BadResource);
        }
        Ok(resource)
    }
}

fn is_dot_segment(segment: &str) -> bool {
    matches!(segment, "." | "..")
}

/// Every `%` starts a well-formed escape that decodes to something that is neither a path
/// delimiter (`/`, `\`), a dot, a `%` (which a second decoding would turn into one of those), a
/// control character, nor a byte above 0x7F (decoded and NFKC-normalised, `%ef%bc%8e` is a dot;
/// overlong UTF-8 such as `%c0%ae` is one to lenient decoders).
fn harmless_encodings(segment: &str) -> bool {
    let bytes = segment.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: Option<&u8>| b.and_then(|b| char::from(*b).to_digit(16));
            let decoded = match (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
                (Some(hi), Some(lo)) => hi * 16 + lo,
                _ => return false,
            };
            if !(0x20..0x7f).contains(&decoded) || matches!(decoded, 0x25 | 0x2e | 0x2f | 0x5c) {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

impl<B> Classify<B> for PathPattern {
    fn classify(&self, req: &Request<B>) -> Decision {
        if let Some(read) = read_decision(req) {
            return read;
        }
        let resource = match self.resource_in(req.uri().path()) {
            Ok(resource) => resource,
            Err(rejection) => return Decision::Reject(rejection),
        };
        match resource_header(req) {
            Ok(None) => Decision::Protect(resource.to_owned()),
            Ok(Some(named)) if named == resource => Decision::Protect(resource.to_owned()),
            Ok(Some(_)) => Decision::Reject(Rejection::ResourceMismatch),
            Err(rejection) => Decision::Reject(rejection),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn req(method: &str, path: &str, resources: &[&[u8]]) -> Request<()> {
        let mut b = Request::builder().method(method).uri(path);
        for r in resources {
            b = b.header(RESOURCE_HEADER, http::HeaderValue::from_bytes(r).unwrap());
        }
        b.body(()).unwrap()
    }

    fn pattern() -> PathPattern {
        PathPattern::parse("/inventory/{resource}").unwrap()
    }

    fn protect(r: &str) -> Decision {
        Decision::Protect(r.into())
    }

    fn reject(r: Rejection) -> Decision {
        Decision::Reject(r)
    }

    /// The row readiness probes write in PostgreSQL is no resource: nothing can admit by it.
    #[cfg(feature = "postgres")]
    #[test]
    fn the_probe_row_is_outside_every_token_domain() {
        assert!(!is_resource(crate::store::PROBE_RESOURCE));
        assert!(!crate::domain::is_lock_resource(
            crate::store::PROBE_RESOURCE
        ));
    }

    #[test]
    fn the_resource_grammar_is_the_proxys() {
        for ok in [
            "a",
            "7",
            "aisle-7",
            "shard:12",
            "job_nightly.v2",
            "a.",
            &"x".repeat(200),
        ] {
            assert!(is_resource(ok), "{ok:?}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a..b",
            "-a",
            "_a",
            ":a",
            "a/b",
            "a b",
            "a\n",
            "a;b",
            "a%2e",
            "é",
            "a\\b",
            &"x".repeat(201),
        ] {
            assert!(!is_resource(bad), "{bad:?}");
        }
    }

    #[test]
    fn header_mode_needs_exactly_one_valid_header() {
        assert_eq!(ByHeader.classify(&req("GET", "/x", &[])), Decision::Pass);
        assert_eq!(ByHeader.classify(&req("PUT", "/x", &[b"a"])), protect("a"));
        let cases: [(&[&[u8]], Rejection); 6] = [
            (&[], Rejection::MissingResource),
            (&[b"a", b"a"], Rejection::DuplicateResource),
            (&[b"a", b"b"], Rejection::DuplicateResource),
            (&[b"aisle-\xe9"], Rejection::BadResource),
            (&[b"../a"], Rejection::BadResource),
            (&[b""], Rejection::BadResource),
        ];
        for (headers, want) in cases {
            assert_eq!(
                ByHeader.classify(&req("POST", "/x", headers)),
                reject(want),
                "{headers:?}"
            );
        }
        let long = "r".repeat(201);
        assert_eq!(
            ByHeader.classify(&req("DELETE", "/x", &[long.as_bytes()])),
            reject(Rejection::BadResource)
        );
    }

    #[test]
    fn canonical_paths_name_their_resource() {
        let p = pattern();
        for (path, resource) in [
            ("/inventory/aisle-3", "aisle-3"),
            ("/inventory/aisle-3/", "aisle-3"),
            ("/inventory/aisle-3/count", "aisle-3"),
            ("/inventory/aisle-3/count/", "aisle-3"),
            ("/inventory/aisle-3/a%20b", "aisle-3"),
            ("/inventory/aisle-3/x.y/.z/...", "aisle-3"),
            ("/inventory/aisle-3?x=/../aisle-2", "aisle-3"),
            ("/inventory/shard:1.v2", "shard:1.v2"),
        ] {
            assert_eq!(
                p.classify(&req("PUT", path, &[])),
                protect(resource),
                "{path}"
            );
        }
        assert_eq!(
            p.classify(&req("PUT", "/inventory/aisle-3", &[b"aisle-3"])),
            protect("aisle-3")
        );
        let root = PathPattern::parse("/{resource}").unwrap();
        assert_eq!(root.classify(&req("PUT", "/a/b", &[])), protect("a"));
    }

    #[test]
    fn ambiguous_paths_are_refused() {
        let p = pattern();
        for path in [
            "/inventory/aisle-1/../aisle-2",
            "/inventory/aisle-1/%2e%2e/aisle-2",
            "/inventory/aisle-1/%2E%2e/aisle-2",
            "/inventory/aisle-1/.%2E/aisle-2",
            "/inventory/aisle-1/%252e%252e/aisle-2",
            "/inventory/aisle-1/..;x/aisle-2",
            "/inventory/aisle-1/.",
            "/inventory/aisle-1/..",
            "/inventory/./aisle-1",
            "/./inventory/aisle-1",
            "/../inventory/aisle-1",
            "//inventory/aisle-1",
            "/inventory//aisle-1",
            "/inventory/aisle-1//x",
            "/inventory/aisle-1//",
            "/inventory/aisle-1/a%2fb",
            "/inventory/aisle-1/a%2Fb",
            "/inventory/aisle-1/a%5cb",
            "/inventory/aisle-1/a%5Cb",
            "/inventory/aisle-1/a%00b",
            "/inventory/aisle-1/a%zzb",
            "/inventory/aisle-1/%ef%bc%8e%ef%bc%8e/aisle-2",
            "/inventory/aisle-1/%E3%80%82%E3%80%82/aisle-2",
            "/inventory/aisle-1/%c0%ae%c0%ae/aisle-2",
            "/inventory/aisle-1/%c0%af..%c0%afaisle-2",
            "/inventory/aisle-1/a%2",
            "/inventory/aisle-1/a%",
            "/inventory/aisle-1%2f..%2faisle-2",
            "/inventory/aisle%2D1",
            "/inventory/%61isle-1",
            "/%69nventory/aisle-1",
            "/inventory%2faisle-1",
        ] {
            assert_eq!(
                p.classify(&req("PUT", path, &[])),
                reject(Rejection::AmbiguousPath),
                "{path}"
            );
        }
    }

    #[test]
    fn a_harmless_escape_does_not_hide_the_next_one() {
        // Every escape after the resource is checked, however far along the segment: decoded
        // once, the second path is `/inventory/aisle-1/abcdefghij /../../aisle-2`.
        let p = pattern();
        for path in [
            "/inventory/aisle-1/ab%20%2fx",
            "/inventory/aisle-1/abcdefghij%20%2f..%2f..%2faisle-2",
        ] {
            assert_eq!(
                p.classify(&req("PUT", path, &[])),
                reject(Rejection::AmbiguousPath),
                "{path}"
            );
        }
    }

    #[test]
    fn raw_bytes_the_uri_type_rejects_are_still_checked() {
        // `Uri` refuses a raw backslash or non-ASCII byte, but a custom `Classify` caller may
        // hand over any path: the check itself must hold.
        let p = pattern();
        for path in [
            "/inventory/aisle-1\\..\\aisle-2",
            "/inventory/aisle-1/\u{ff0e}\u{ff0e}/aisle-2",
            "/inventory/aisle 1",
            "inventory/aisle-1",
            "",
        ] {
            assert_eq!(p.resource_in(path), Err(Rejection::AmbiguousPath), "{path}");
        }
    }

    #[test]
    fn other_paths_and_bad_resources_are_refused() {
        let p = pattern();
        for (path, want) in [
            ("/other", Rejection::UnmatchedPath),
            ("/", Rejection::AmbiguousPath),
            ("/inventory", Rejection::UnmatchedPath),
            ("/inventory/", Rejection::AmbiguousPath),
            ("/Inventory/aisle-1", Rejection::UnmatchedPath),
            ("/INVENTORY/aisle-1", Rejection::UnmatchedPath),
            ("/inventory;x/aisle-1", Rejection::UnmatchedPath),
            ("/inventory/aisle-1;x", Rejection::BadResource),
            ("/inventory/-aisle", Rejection::BadResource),
            ("/inventory/a..b", Rejection::BadResource),
            ("/inventory/a~b", Rejection::BadResource),
        ] {
            assert_eq!(p.classify(&req("PUT", path, &[])), reject(want), "{path}");
        }
        let long = format!("/inventory/{}", "x".repeat(201));
        assert_eq!(
            p.classify(&req("PUT", &long, &[])),
            reject(Rejection::BadResource)
        );
    }

    #[test]
    fn the_header_must_agree_with_the_path_and_is_no_fallback() {
        let p = pattern();
        assert_eq!(
            p.classify(&req("PUT", "/inventory/aisle-3", &[b"aisle-4"])),
            reject(Rejection::ResourceMismatch)
        );
        assert_eq!(
            p.classify(&req("PUT", "/inventory/aisle-3", &[b"aisle-3", b"aisle-3"])),
            reject(Rejection::DuplicateResource)
        );
        assert_eq!(
            p.classify(&req("PUT", "/inventory/aisle-3", &[b"aisle-3\xa0"])),
            reject(Rejection::BadResource)
        );
        assert_eq!(
            p.classify(&req("PUT", "/other", &[b"aisle-4"])),
            reject(Rejection::UnmatchedPath)
        );
        assert_eq!(
            p.classify(&req("PUT", "//aisle-2", &[b"aisle-2"])),
            reject(Rejection::AmbiguousPath)
        );
    }

    fn reads_pass_unless_they_carry_a_body_with<C: Classify<()>>(classify: C) {
        for method in ["GET", "HEAD", "OPTIONS"] {
            // Reads are not fenced, so their path need not be canonical.
            assert_eq!(
                classify.classify(&req(method, "/a/../b", &[])),
                Decision::Pass
            );
            let with = |name: &'static str, value: &'static str| {
                let mut r = req(method, "/inventory/a", &[]);
                r.headers_mut()
                    .append(name, http::HeaderValue::from_static(value));
                classify.classify(&r)
            };
            assert_eq!(with("content-length", "0"), Decision::Pass);
            for (name, value) in [
                ("content-length", "5"),
                ("content-length", "00"),
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "identity"),
            ] {
                assert_eq!(
                    with(name, value),
                    reject(Rejection::ReadWithBody),
                    "{method} {name}: {value}"
                );
            }
        }
    }

    #[test]
    fn reads_pass_unless_they_carry_a_body() {
        reads_pass_unless_they_carry_a_body_with(pattern());
        reads_pass_unless_they_carry_a_body_with(ByHeader);
    }

    #[test]
    fn patterns_no_canonical_path_can_match_are_refused() {
        assert!(PathPattern::parse("/inventory/{resource}").is_some());
        assert!(PathPattern::parse("inventory/{resource}/").is_some());
        assert!(PathPattern::parse("/{resource}").is_some());
        for bad in [
            "/inventory",
            "/inventory/{resource}/count",
            "/{x}/{resource}",
            "/inventory//{resource}",
            "/./{resource}",
            "/../{resource}",
            "/%69nventory/{resource}",
            "/a\\b/{resource}",
            "/caf\u{e9}/{resource}",
        ] {
            assert!(PathPattern::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn lock_domains_are_resources_only_by_header() {
        let hex192 = "ab".repeat(96);
        for ok in ["lock/61", "lock/00ff", &format!("lock/{hex192}")] {
            assert!(is_resource(ok), "{ok:?}");
            assert_eq!(
                ByHeader.classify(&req("PUT", "/x", &[ok.as_bytes()])),
                protect(ok)
            );
        }
        for bad in [
            "lock/",
            "lock/6",
            "lock/6A",
            "lock/zz",
            "lock/61/",
            "lock//61",
            "Lock/61",
            "lockx/61",
            &format!("lock/{hex192}ab"),
        ] {
            assert!(!is_resource(bad), "{bad:?}");
            assert_eq!(
                ByHeader.classify(&req("PUT", "/x", &[bad.as_bytes()])),
                reject(Rejection::BadResource),
                "{bad:?}"
            );
        }
        // In path mode a `/` ends the resource segment: a lock domain cannot be named, and the
        // header naming one disagrees with the path's resource.
        let p = pattern();
        assert_eq!(
            p.classify(&req("PUT", "/inventory/lock/61", &[])),
            protect("lock")
        );
        assert_eq!(
            p.classify(&req("PUT", "/inventory/lock/61", &[b"lock/61"])),
            reject(Rejection::ResourceMismatch)
        );
    }
}
