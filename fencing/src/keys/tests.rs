//! Tests of the keyring: signing, verification, the key file, rotation.

use super::*;
use proptest::prelude::*;

fn ring(kid: &str) -> Keyring {
    Keyring::parse(&Keyring::generate_file(&KeyId::parse(kid).unwrap())).unwrap()
}

#[test]
fn round_trip() {
    let k = ring("k1");
    let t = Token::new(3, 4711);
    let wire = k.mint("aisle-7", t);
    assert!(wire.starts_with("v1.k1.3.4711."));
    assert_eq!(k.verify("aisle-7", &wire), Ok(t));
}

#[test]
fn bound_to_resource() {
    let k = ring("k1");
    let wire = k.mint("aisle-7", Token::new(0, 9));
    assert_eq!(k.verify("aisle-8", &wire), Err(TokenError::WrongResource));
}

#[test]
fn altered_number_is_a_bad_signature() {
    let k = ring("k1");
    let wire = k.mint("r", Token::new(0, 9));
    let forged = wire.replacen(".9.", ".10.", 1);
    assert_eq!(k.verify("r", &forged), Err(TokenError::BadSignature));
    let max = wire.replacen(".9.", &format!(".{}.", u64::MAX), 1);
    assert_eq!(k.verify("r", &max), Err(TokenError::BadSignature));
}

#[test]
fn other_keyring_and_unknown_kid() {
    let a = ring("k1");
    let b = ring("k1");
    let c = ring("k2");
    let wire = a.mint("r", Token::new(0, 1));
    assert_eq!(b.verify("r", &wire), Err(TokenError::BadSignature));
    assert_eq!(c.verify("r", &wire), Err(TokenError::UnknownKey));
}

#[test]
fn rotation_first_signs_all_verify() {
    let old = Keyring::generate_file(&KeyId::parse("old").unwrap());
    let new = Keyring::generate_file(&KeyId::parse("new").unwrap());
    let before = Keyring::parse(&old).unwrap();
    let after = Keyring::parse(&format!("{new}{old}")).unwrap();
    let t = Token::new(0, 5);
    let old_wire = before.mint("r", t);
    assert_eq!(after.verify("r", &old_wire), Ok(t));
    assert!(after.mint("r", t).starts_with("v1.new."));
    assert_eq!(after.signing_key_id().as_str(), "new");
}

#[test]
fn each_key_signs_alone_in_its_own_ring() {
    let old = Keyring::generate_file(&KeyId::parse("old").unwrap());
    let new = Keyring::generate_file(&KeyId::parse("new").unwrap());
    let before = Keyring::parse(&old).unwrap();
    let after = Keyring::parse(&format!("{new}{old}")).unwrap();
    let ids: Vec<&str> = after.key_ids().map(KeyId::as_str).collect();
    assert_eq!(ids, ["new", "old"]);
    let signers: Vec<Keyring> = after.signers().collect();
    assert_eq!(signers.len(), 2);
    assert_eq!(signers[0].signing_key_id().as_str(), "new");
    assert_eq!(signers[1].derive(b"ctx"), before.derive(b"ctx"));
    assert_ne!(signers[0].derive(b"ctx"), before.derive(b"ctx"));
}

#[test]
fn key_file_errors() {
    assert!(matches!(
        Keyring::parse("# nothing\n\n"),
        Err(Error::NoKeys)
    ));
    assert!(matches!(
        Keyring::parse("k1 c2hvcnQ"),
        Err(Error::KeyLine { line: 1, .. })
    ));
    let good = Keyring::generate_file(&KeyId::parse("k1").unwrap());
    assert!(matches!(
        Keyring::parse(&format!("{good}{good}")),
        Err(Error::KeyLine { line: 4, .. })
    ));
    assert!(matches!(
        Keyring::parse("bad/kid AAAA"),
        Err(Error::KeyLine { .. })
    ));
    assert!(matches!(Keyring::parse("k1"), Err(Error::KeyLine { .. })));
}

#[test]
fn malformed_inputs() {
    let k = ring("k1");
    let wire = k.mint("r", Token::new(0, 12));
    let cases = [
        String::new(),
        "v1".into(),
        "v2".to_owned() + &wire[2..],
        wire.replacen(".12.", ".012.", 1),
        wire.replacen(".12.", ".+12.", 1),
        wire.replacen(".12.", ".18446744073709551616.", 1),
        format!("{wire}."),
        format!("{wire}AA"),
        "x".repeat(10_000),
    ];
    for case in cases {
        assert_eq!(k.verify("r", &case), Err(TokenError::Malformed), "{case}");
    }
}

#[test]
fn every_signed_field_is_covered_by_the_mac() {
    let k = ring("k1");
    let a = k.mint("a", Token::new(2, 9));
    let b = k.mint("b", Token::new(2, 5));
    let field = |wire: &str, i: usize| wire.split('.').nth(i).unwrap().to_owned();
    let with = |i: usize, value: &str| {
        let mut fields: Vec<String> = a.split('.').map(str::to_owned).collect();
        fields[i] = value.to_owned();
        fields.join(".")
    };
    // Another era; another resource's tag spliced in (a valid tag, for "b").
    assert_eq!(k.verify("a", &with(2, "3")), Err(TokenError::BadSignature));
    let spliced = with(4, &field(&b, 4));
    assert_eq!(k.verify("b", &spliced), Err(TokenError::BadSignature));
    assert_eq!(k.verify("a", &spliced), Err(TokenError::BadSignature));
    // Another key id of the same ring (same secret, other name): still not this token.
    let text = Keyring::generate_file(&KeyId::parse("k1").unwrap());
    let secret = text.lines().nth(1).unwrap().split(' ').nth(1).unwrap();
    let twins = Keyring::parse(&format!("k1 {secret}\nk2 {secret}\n")).unwrap();
    let renamed = twins
        .mint("a", Token::new(2, 9))
        .replacen("v1.k1.", "v1.k2.", 1);
    assert_eq!(twins.verify("a", &renamed), Err(TokenError::BadSignature));
}

#[test]
fn key_ids_have_a_grammar() {
    for ok in ["a", "K-1_z", "0", &"k".repeat(MAX_KID_LEN)] {
        assert_eq!(KeyId::parse(ok).map(|k| k.to_string()), Some(ok.to_owned()));
    }
    for bad in [
        "",
        &"k".repeat(MAX_KID_LEN + 1),
        "a.b",
        "a/b",
        "a b",
        "k\u{e9}",
        "a\0",
    ] {
        assert_eq!(KeyId::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn derived_values_are_keyed_and_bound_to_their_context() {
    let (a, b) = (ring("k1"), ring("k1"));
    let text = Keyring::generate_file(&KeyId::parse("k1").unwrap());
    let (a1, a2) = (
        Keyring::parse(&text).unwrap(),
        Keyring::parse(&text).unwrap(),
    );
    // Reproducible across replicas sharing the key file ...
    assert_eq!(a1.derive(b"ctx"), a2.derive(b"ctx"));
    // ... and unpredictable without it, or for another context.
    assert_ne!(a.derive(b"ctx"), b.derive(b"ctx"));
    assert_ne!(a.derive(b"ctx"), a.derive(b"ctx2"));
    for constant in [[0u8; 32], [1u8; 32]] {
        assert_ne!(a.derive(b"ctx"), constant);
    }
}

#[test]
fn debug_names_keys_but_never_secrets() {
    let text = Keyring::generate_file(&KeyId::parse("k1").unwrap());
    let secret = text.lines().nth(1).unwrap().split(' ').nth(1).unwrap();
    let debug = format!("{:?}", Keyring::parse(&text).unwrap());
    assert!(debug.contains("k1"), "{debug}");
    assert!(!debug.contains(secret), "{debug}");
}

#[test]
fn created_key_files_are_private_loadable_and_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new/dir/keys");
    let kid = KeyId::parse("k7").unwrap();
    Keyring::create_file(&path, &kid).unwrap();
    let ring = Keyring::load(&path).unwrap();
    assert_eq!(ring.signing_key_id(), &kid);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let before = std::fs::read(&path).unwrap();
    assert!(matches!(
        Keyring::create_file(&path, &kid),
        Err(Error::Io { .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert!(matches!(
        Keyring::load(&dir.path().join("absent")),
        Err(Error::Io { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Parsing arbitrary text never panics and never accepts anything.
    #[test]
    fn arbitrary_text_is_never_accepted(s in ".{0,300}") {
        let k = ring("k1");
        prop_assert!(k.verify("r", &s).is_err());
    }

    /// Token-shaped strings with random fields are never accepted.
    #[test]
    fn token_shaped_forgeries_fail(era in any::<u64>(), rev in any::<u64>(),
                                   tag in proptest::collection::vec(any::<u8>(), 16),
                                   mac in proptest::collection::vec(any::<u8>(), 32)) {
        let k = ring("k1");
        let wire = format!("v1.k1.{era}.{rev}.{}.{}",
            URL_SAFE_NO_PAD.encode(tag), URL_SAFE_NO_PAD.encode(mac));
        prop_assert_eq!(k.verify("r", &wire), Err(TokenError::BadSignature));
    }

    /// Every minted token verifies for its resource and only for it.
    #[test]
    fn mint_verify(era in any::<u64>(), rev in any::<u64>(), r in "[a-z0-9._-]{1,40}") {
        let k = ring("k1");
        let t = Token::new(era, rev);
        let wire = k.mint(&r, t);
        prop_assert_eq!(k.verify(&r, &wire), Ok(t));
        let other = format!("{r}x");
        prop_assert_eq!(k.verify(&other, &wire), Err(TokenError::WrongResource));
    }
}
