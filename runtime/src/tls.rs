//! TLS for both binaries (rustls, with ring): the server side — a certificate and key reloaded
//! without a restart, optional or required client certificates (mTLS) whose verified identity
//! reaches the handlers as a [`PeerCertificate`] request extension — and the client side of
//! their outbound HTTP calls (the gateway's upstream, the proxy's forwards and pre-fences),
//! verifying the server and presenting a client certificate when given one.
//!
//! Reloading swaps the whole server configuration: a connection's handshake uses the
//! configuration current when it was accepted, connections already open are not touched, and a
//! set of files that does not load (a half-written key, a certificate that does not match it)
//! leaves the previous configuration in force.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use hyper_rustls::{ConfigBuilderExt, HttpsConnector};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::reload::{on_change, Outcome, Reloads};
use crate::Error;

/// Whether a server asks clients for a certificate.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ClientCerts {
    /// Clients may present one (verified against the client CA when they do); clients without
    /// one are served and must authenticate otherwise (bearer tokens).
    #[default]
    Optional,
    /// The handshake fails for a client without a certificate the client CA signed.
    Required,
}

/// The files of a server's TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    /// The certificate chain (PEM), the server's own certificate first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CAs (PEM) that sign client certificates; none: clients are not asked for one.
    pub client_ca: Option<PathBuf>,
    /// Whether a client certificate is required (with `client_ca`).
    pub client_certs: ClientCerts,
}

/// A server's TLS configuration, reloadable.
#[derive(Debug)]
pub struct ServerTls {
    files: ServerFiles,
    config: RwLock<Arc<ServerConfig>>,
}

impl ServerTls {
    /// Loads the files; anything unusable is refused (the binary does not start).
    pub fn load(files: ServerFiles) -> Result<Self, Error> {
        let config = server_config(&files)?;
        Ok(Self {
            files,
            config: RwLock::new(Arc::new(config)),
        })
    }

    /// An acceptor with the configuration current now.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(
            self.config
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }

    /// Reads the files again; on failure the current configuration stays in force.
    pub fn reload(&self) -> Result<(), Error> {
        let config = server_config(&self.files)?;
        *self
            .config
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
        Ok(())
    }

    /// Reloads on SIGHUP and when a file changes (modification time or length), until
    /// `cancel`; the task is `tracker`'s. Each reload is counted as `file="tls"`.
    pub fn watch(
        self: &Arc<Self>,
        reloads: &Reloads,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) {
        let tls = self.clone();
        let files = [
            Some(&self.files.cert),
            Some(&self.files.key),
            self.files.client_ca.as_ref(),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        let counted = reloads.of("tls");
        on_change(files, counted, tracker, cancel, move |why| {
            match tls.reload() {
                Ok(()) => {
                    tracing::info!(cert = %tls.files.cert.display(), why, "TLS certificate reloaded");
                    Outcome::Loaded
                }
                Err(e) => {
                    tracing::error!(error = %e, why, "TLS certificate NOT reloaded; the previous one stays in force");
                    Outcome::Refused
                }
            }
        });
    }
}

/// The verified client certificate of the connection a request came on: a request extension,
/// absent on plain HTTP and when the client presented none. Only what maps a certificate to a
/// principal is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCertificate {
    /// The subject's common name, when it has one.
    pub common_name: Option<String>,
    /// The DNS names of its subject alternative names.
    pub dns_names: Vec<String>,
}

impl PeerCertificate {
    /// Reads the names of a (verified) certificate; `None` if it does not parse.
    pub fn from_der(der: &[u8]) -> Option<Self> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let dns_names = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|n| match n {
                        x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            common_name,
            dns_names,
        })
    }

    /// The peer certificate of an accepted TLS connection, if the client presented one.
    pub fn of(connection: &rustls::ServerConnection) -> Option<Self> {
        connection
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| Self::from_der(leaf))
    }
}

/// The files of a client's TLS towards one kind of server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientFiles {
    /// The CAs (PEM) that sign the servers' certificates; none: the system's roots.
    pub ca: Option<PathBuf>,
    /// A client certificate chain (PEM) to present, with `key`.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
}

impl ClientFiles {
    /// Checks that the files load into a client configuration (at start, so that a bad file
    /// refuses to start rather than failing the first call); `https`: whether it will be used
    /// for `https://` URLs at all.
    pub fn validate(&self, https: bool) -> Result<(), Error> {
        client_config(self, https).map(drop)
    }
}

/// A connector for `http://` and `https://` URLs.
pub type Connector = HttpsConnector<HttpConnector>;

/// A connector for `http://` and `https://` URLs, the latter verified as `files` say, for calls
/// to `base`: the system's CAs are loaded only when it is an `https://` URL and `files` names
/// no CA.
pub fn https_connector(
    mut http: HttpConnector,
    files: &ClientFiles,
    base: &http::Uri,
) -> Result<Connector, Error> {
    http.enforce_http(false);
    let https = base.scheme_str() == Some("https");
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_config(files, https)?)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config(files: &ServerFiles) -> Result<ServerConfig, Error> {
    let chain = certificates(&files.cert)?;
    let key = private_key(&files.key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider());
            let verifier = match files.client_certs {
                ClientCerts::Optional => verifier.allow_unauthenticated(),
                ClientCerts::Required => verifier,
            };
            builder.with_client_cert_verifier(
                verifier
                    .build()
                    .map_err(|e| Error::Tls(format!("client CA: {e}")))?,
            )
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| Error::Tls(format!("certificate and key: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn client_config(files: &ClientFiles, https: bool) -> Result<ClientConfig, Error> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let builder = match &files.ca {
        Some(ca) => builder.with_root_certificates(roots(ca)?),
        // Plain HTTP only: nothing to verify, no reason to read the system's CAs.
        None if !https => builder.with_root_certificates(RootCertStore::empty()),
        None => match builder.clone().with_native_roots() {
            Ok(builder) => builder,
            // A machine without a CA bundle (a slim container) can still serve plain HTTP:
            // `https://` servers then fail verification, and the reason is logged here.
            Err(e) => {
                tracing::warn!(error = %e, "no system CA certificates: https:// servers can only be verified with a CA file");
                builder.with_root_certificates(RootCertStore::empty())
            }
        },
    };
    match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .map_err(|e| Error::Tls(format!("client certificate and key: {e}"))),
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(Error::Tls(
            "a client certificate needs its key, and a key its certificate".into(),
        )),
    }
}

fn file_error(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::TlsFile {
        path: path.to_owned(),
        message: message.to_string(),
    }
}

/// The largest certificate, key or CA file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    crate::files::read_config_file(path, MAX_FILE_BYTES).map_err(|e| file_error(path, e))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let chain = CertificateDer::pem_slice_iter(&read(path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if chain.is_empty() {
        return Err(file_error(path, "no PEM certificate in it"));
    }
    Ok(chain)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_slice(&read(path)?).map_err(|e| file_error(path, e))
}

fn roots(path: &Path) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots
            .add(cert)
            .map_err(|e| file_error(path, format!("not a CA certificate: {e}")))?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_proxy_testkit::pki::Pki;

    #[test]
    fn a_peer_is_named_by_its_common_name_and_dns_names() {
        let pki = Pki::new("names");
        let issued = pki.client("c", "robot-7", &["robot-7.fleet.example", "x.example"]);
        let der = certificates(&issued.cert).unwrap()[0].to_vec();
        let peer = PeerCertificate::from_der(&der).unwrap();
        assert_eq!(peer.common_name.as_deref(), Some("robot-7"));
        assert_eq!(peer.dns_names, ["robot-7.fleet.example", "x.example"]);
        assert!(PeerCertificate::from_der(b"not a certificate").is_none());
    }

    #[test]
    fn unusable_files_are_refused_by_name() {
        let pki = Pki::new("files");
        let a = pki.server("a");
        let b = pki.server("b");
        let files = |cert: &Path, key: &Path| ServerFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
            client_ca: None,
            client_certs: ClientCerts::Optional,
        };
        ServerTls::load(files(&a.cert, &a.key)).unwrap();
        // The key of another certificate; a key where the certificate should be; no file.
        assert!(matches!(
            ServerTls::load(files(&a.cert, &b.key)),
            Err(Error::Tls(_))
        ));
        assert!(matches!(
            ServerTls::load(files(&a.key, &a.key)),
            Err(Error::TlsFile { .. })
        ));
        let missing = a.cert.with_extension("missing");
        let err = ServerTls::load(files(&missing, &a.key)).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        // A reload that fails keeps what was loaded.
        let tls = ServerTls::load(files(&a.cert, &a.key)).unwrap();
        std::fs::write(&a.key, "-----BEGIN PRIVATE KEY-----\nAAAA\n").unwrap();
        assert!(tls.reload().is_err());
        let _still = tls.acceptor();
        // Client side: a certificate without its key; a CA file that is no certificate.
        let half = ClientFiles {
            ca: None,
            cert: Some(b.cert.clone()),
            key: None,
        };
        assert!(half.validate(true).is_err());
        let bad_ca = ClientFiles {
            ca: Some(b.key.clone()),
            ..ClientFiles::default()
        };
        assert!(bad_ca.validate(false).is_err());
        ClientFiles::default().validate(false).unwrap();
    }
}
