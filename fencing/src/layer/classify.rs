use http::{Method, Request};

use super::Rejection;
use crate::RESOURCE_HEADER;

/// Longest resource name the enforcer considers.
const MAX_RESOURCE_LEN: usize = 256;

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not a protected write: forward untouched.
    Pass,
    /// A write to this resource: requires a valid token admitted by the gate.
    Protect(String),
    /// A write that cannot be classified (e.g. no resource named): refuse it.
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

fn is_read(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn checked(resource: &str) -> Decision {
    if resource.is_empty()
        || resource.len() > MAX_RESOURCE_LEN
        || resource.chars().any(char::is_control)
    {
        Decision::Reject(Rejection::BadResource)
    } else {
        Decision::Protect(resource.to_owned())
    }
}

/// Every write (any method but GET, HEAD, OPTIONS) is protected; the resource comes from the
/// `Fencing-Resource` header.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByHeader;

impl<B> Classify<B> for ByHeader {
    fn classify(&self, req: &Request<B>) -> Decision {
        if is_read(req.method()) {
            return Decision::Pass;
        }
        let mut values = req.headers().get_all(RESOURCE_HEADER).iter();
        match (values.next(), values.next()) {
            (Some(v), None) => match v.to_str() {
                Ok(resource) => checked(resource),
                Err(_) => Decision::Reject(Rejection::BadResource),
            },
            (None, _) => Decision::Reject(Rejection::MissingResource),
            (Some(_), Some(_)) => Decision::Reject(Rejection::BadResource),
        }
    }
}

/// Every write is protected; the resource is the path segment in the position of `{resource}`
/// in a pattern such as `/inventory/{resource}`, else the `Fencing-Resource` header. Both, when
/// they disagree, are refused: a token must not be replayed against another resource's path.
#[derive(Debug, Clone)]
pub struct PathPattern {
    prefix: Vec<String>,
}

impl PathPattern {
    /// Parses a pattern: `/`-separated literal segments followed by one `{resource}` segment
    /// (anything after it in a request path is free). `None` if the pattern has no such segment.
    pub fn parse(pattern: &str) -> Option<Self> {
        let segments: Vec<&str> = pattern.trim_matches('/').split('/').collect();
        let (last, prefix) = segments.split_last()?;
        if *last != "{resource}" || prefix.iter().any(|s| s.contains('{')) {
            return None;
        }
        Some(Self {
            prefix: prefix.iter().map(|s| (*s).to_owned()).collect(),
        })
    }

    fn resource_in(&self, path: &str) -> Option<String> {
        let mut segments = path.trim_start_matches('/').split('/');
        for literal in &self.prefix {
            if segments.next()? != literal {
                return None;
            }
        }
        segments.next().filter(|s| !s.is_empty()).map(str::to_owned)
    }
}

impl<B> Classify<B> for PathPattern {
    fn classify(&self, req: &Request<B>) -> Decision {
        if is_read(req.method()) {
            return Decision::Pass;
        }
        let from_header = ByHeader.classify(req);
        match (self.resource_in(req.uri().path()), from_header) {
            (Some(path), Decision::Protect(header)) if header != path => {
                Decision::Reject(Rejection::BadResource)
            }
            (Some(path), _) => checked(&path),
            (None, header) => header,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str, resource: Option<&str>) -> Request<()> {
        let mut b = Request::builder().method(method).uri(path);
        if let Some(r) = resource {
            b = b.header(RESOURCE_HEADER, r);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn header_classification() {
        assert_eq!(ByHeader.classify(&req("GET", "/x", None)), Decision::Pass);
        assert_eq!(
            ByHeader.classify(&req("PUT", "/x", Some("a"))),
            Decision::Protect("a".into())
        );
        assert_eq!(
            ByHeader.classify(&req("POST", "/x", None)),
            Decision::Reject(Rejection::MissingResource)
        );
    }

    #[test]
    fn path_classification() {
        let p = PathPattern::parse("/inventory/{resource}").unwrap();
        assert_eq!(
            p.classify(&req("PUT", "/inventory/aisle-3/count", None)),
            Decision::Protect("aisle-3".into())
        );
        assert_eq!(
            p.classify(&req("PUT", "/inventory/aisle-3", Some("aisle-4"))),
            Decision::Reject(Rejection::BadResource)
        );
        assert_eq!(
            p.classify(&req("PUT", "/other", Some("aisle-4"))),
            Decision::Protect("aisle-4".into())
        );
        assert!(PathPattern::parse("/inventory").is_none());
    }
}
