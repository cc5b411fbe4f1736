//! Shared by the example scenarios: an HTTP client that trusts a CA file. The scenarios talk to
//! lease-proxy through the Rust SDK (`lease-proxy-client`).
#![forbid(unsafe_code)]

/// What can go wrong setting up the HTTP client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The client could not be built (or a certificate not parsed).
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    /// A setting (a CA file) is unusable.
    #[error("{0}")]
    Config(String),
}

/// An HTTP client that, for `https://` URLs, trusts the CAs in `ca` (PEM) when given (the
/// system's otherwise).
pub fn http_client(ca: Option<&std::path::Path>) -> Result<reqwest::Client, Error> {
    let mut builder = reqwest::Client::builder().use_rustls_tls();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).map_err(|e| Error::Config(format!("{}: {e}", ca.display())))?;
        for cert in reqwest::Certificate::from_pem_bundle(&pem)? {
            builder = builder.add_root_certificate(cert);
        }
    }
    Ok(builder.build()?)
}
