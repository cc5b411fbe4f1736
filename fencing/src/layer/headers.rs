//! Headers the layer removes before a request goes on: those describing one connection, and
//! every fencing header a client sent (the layer sets its own, verified ones).

use http::header::{self, HeaderMap, HeaderName};

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes hop-by-hop headers, including those named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove("proxy-connection");
}

/// Whether `name` is a fencing header (`Fencing-*`, `X-Fencing-*`): only the enforcer may set
/// those on what reaches the storage. `_` counts as `-`: CGI, WSGI, Rack and PHP map both to the
/// same variable, so `fencing_resource` would reach such a storage as a second `Fencing-Resource`.
fn is_fencing(name: &HeaderName) -> bool {
    let name = name.as_str().replace('_', "-");
    name.starts_with("fencing-") || name.starts_with("x-fencing-")
}

/// Removes every fencing header.
pub(super) fn strip_fencing(headers: &mut HeaderMap) {
    let names: Vec<HeaderName> = headers.keys().filter(|n| is_fencing(n)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-end-to-end", "1".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-end-to-end"));
    }

    #[test]
    fn every_fencing_header_goes() {
        let mut h = HeaderMap::new();
        for name in [
            "fencing-token",
            "Fencing-Resource",
            "x-fencing-token",
            "fencing-anything",
            "fencing_resource",
            "x_fencing-token",
            "X_FENCING_TOKEN",
        ] {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                "v".parse().unwrap(),
            );
        }
        h.append("fencing-token", "w".parse().unwrap());
        h.insert("x-end-to-end", "1".parse().unwrap());
        strip_fencing(&mut h);
        assert_eq!(h.len(), 1);
    }
}
