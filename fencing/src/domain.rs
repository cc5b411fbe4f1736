//! Token domains (docs/DESIGN.md §3): the "resource" a token is minted for names exactly one
//! fencing domain. A `/v1` lease's domain is its resource name (`[A-Za-z0-9._:-]`, no `/`). A lock
//! taken through lease-proxy's etcd-compatible `/v3` API has the domain [`lock_resource`] of its
//! name: `lock/` followed by the lowercase hex of the name's bytes. Because no `/v1` resource
//! contains a `/`, no lock domain ever equals a `/v1` resource — so a lock token never fences a
//! lease's resource, nor its high-water mark, which is keyed by the same string — and because hex
//! is one-to-one, two lock names that differ in any byte never share a domain.

/// Longest `/v1` resource name, in bytes.
pub const MAX_RESOURCE_LEN: usize = 200;

/// Why a name is not a `/v1` resource name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResourceNameError {
    /// The name is empty.
    #[error("must not be empty")]
    Empty,
    /// The name is longer than [`MAX_RESOURCE_LEN`] bytes.
    #[error("longer than 200 bytes")]
    TooLong,
    /// A byte outside `[A-Za-z0-9._:-]`.
    #[error("only letters, digits and . _ : - are allowed")]
    Character,
    /// The first byte is not a letter or digit.
    #[error("must start with a letter or digit")]
    Start,
    /// The name contains `..`.
    #[error("must not contain `..`")]
    DotDot,
}

/// Checks a `/v1` resource name — the grammar lease-proxy grants and the enforcer fences: 1–200
/// bytes of `[A-Za-z0-9._:-]`, starting with a letter or digit, never containing `..`. No `/`,
/// so a name is one path segment (that no storage decodes or normalises into something else)
/// and one etcd key suffix. The first rule broken is the one answered.
pub fn check_resource_name(name: &str) -> Result<(), ResourceNameError> {
    let bytes = name.as_bytes();
    if bytes.is_empty() {
        return Err(ResourceNameError::Empty);
    }
    if bytes.len() > MAX_RESOURCE_LEN {
        return Err(ResourceNameError::TooLong);
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
    {
        return Err(ResourceNameError::Character);
    }
    if !bytes[0].is_ascii_alphanumeric() {
        return Err(ResourceNameError::Start);
    }
    if name.contains("..") {
        return Err(ResourceNameError::DotDot);
    }
    Ok(())
}

/// How every lock domain starts.
pub const LOCK_RESOURCE_PREFIX: &str = "lock/";

/// Longest lock name, in bytes, that has a fencing domain: its domain is then 5 + 192 = 197
/// characters, within the 200 an enforcer accepts. lease-proxy refuses longer lock names.
pub const MAX_LOCK_NAME_BYTES: usize = 96;

/// The fencing domain (the `Fencing-Resource`) of the `/v3` lock `name`: `lock/` + lowercase hex
/// of its bytes. Distinct names give distinct domains, and none equals a `/v1` resource. Only a
/// name of 1 to [`MAX_LOCK_NAME_BYTES`] bytes gives a domain an enforcer accepts.
pub fn lock_resource(name: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut resource = String::with_capacity(LOCK_RESOURCE_PREFIX.len() + 2 * name.len());
    resource.push_str(LOCK_RESOURCE_PREFIX);
    for b in name {
        resource.push(char::from(HEX[usize::from(b >> 4)]));
        resource.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    resource
}

/// Whether `resource` is a lock domain an enforcer accepts: `lock/` and then 2 to 192 lowercase
/// hex digits, an even number — exactly what [`lock_resource`] gives for a name of 1 to
/// [`MAX_LOCK_NAME_BYTES`] bytes.
pub(crate) fn is_lock_resource(resource: &str) -> bool {
    resource
        .strip_prefix(LOCK_RESOURCE_PREFIX)
        .is_some_and(|hex| {
            (2..=2 * MAX_LOCK_NAME_BYTES).contains(&hex.len())
                && hex.len() % 2 == 0
                && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_names_follow_one_grammar() {
        for ok in [
            "a",
            "A-1",
            "aisle:7.b_c",
            "9",
            &"x".repeat(MAX_RESOURCE_LEN),
        ] {
            assert_eq!(check_resource_name(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", ResourceNameError::Empty),
            (
                &"x".repeat(MAX_RESOURCE_LEN + 1),
                ResourceNameError::TooLong,
            ),
            ("a/b", ResourceNameError::Character),
            ("a b", ResourceNameError::Character),
            ("é", ResourceNameError::Character),
            ("-a", ResourceNameError::Start),
            (".a", ResourceNameError::Start),
            ("a..b", ResourceNameError::DotDot),
        ] {
            assert_eq!(check_resource_name(bad), Err(why), "{bad:?}");
        }
    }

    #[test]
    fn lock_domains_are_distinct_and_accepted() {
        assert_eq!(lock_resource(b"aisle-1"), "lock/6169736c652d31");
        assert_ne!(lock_resource(b"\xff"), lock_resource("\u{fffd}".as_bytes()));
        assert_ne!(lock_resource(b"a"), lock_resource(b"a\0"));
        for name in [
            b"a".as_slice(),
            b"\0",
            b"\xff\xfe",
            &[7; MAX_LOCK_NAME_BYTES],
        ] {
            assert!(is_lock_resource(&lock_resource(name)), "{name:?}");
        }
        for bad in [
            lock_resource(b""),
            lock_resource(&[7; MAX_LOCK_NAME_BYTES + 1]),
            "lock/abc".into(),
            "lock/AB".into(),
            "lock/zz".into(),
            "lock//ab".into(),
            "Lock/ab".into(),
            "lock/ab/".into(),
            "aisle-1".into(),
        ] {
            assert!(!is_lock_resource(&bad), "{bad:?}");
        }
        assert!(lock_resource(&[0xff; MAX_LOCK_NAME_BYTES]).len() <= 200);
    }
}
