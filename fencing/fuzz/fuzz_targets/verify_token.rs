//! Token parsing and verification must never panic and never accept anything not minted with
//! the key: arbitrary bytes, split into a resource and a wire token, are verified.
#![no_main]

use fencing::{KeyId, Keyring};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A fixed key, so a crash reproduces.
    let keys = Keyring::parse("k1 AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8").expect("key");
    let _ = KeyId::parse("k1");
    let text = String::from_utf8_lossy(data);
    let (resource, wire) = text.split_once('\n').unwrap_or(("r", &text));
    if let Ok(token) = keys.verify(resource, wire) {
        // Only a token this key minted for this resource may verify.
        assert_eq!(keys.mint(resource, token), wire);
    }
});
