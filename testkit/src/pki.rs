//! A throwaway certificate authority for TLS tests: a CA generated in the test (rcgen), and
//! server and client certificates it signs, written as PEM files into a temporary directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;

/// A CA and the directory its files are written to.
pub struct Pki {
    dir: PathBuf,
    /// The directory's owner when it is temporary (removed with the `Pki`).
    _temporary: Option<TempDir>,
    ca: CertifiedIssuer<'static, KeyPair>,
    ca_file: PathBuf,
}

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

impl Issued {
    /// The certificate and the key in one PEM string (what some clients take as an identity).
    pub fn identity_pem(&self) -> Vec<u8> {
        let mut pem = std::fs::read(&self.cert).expect("read cert");
        pem.extend(std::fs::read(&self.key).expect("read key"));
        pem
    }
}

impl Pki {
    /// A new CA named `name`, its files in a temporary directory removed with it.
    pub fn new(name: &str) -> Self {
        let temporary = tempfile::Builder::new()
            .prefix("lease-proxy-pki-")
            .tempdir()
            .expect("temporary directory");
        let mut pki = Self::in_dir(temporary.path(), name);
        pki._temporary = Some(temporary);
        pki
    }

    /// A new CA named `name`, its files written to `dir` (which must exist) and kept.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        let ca_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, ca.pem()).expect("write CA");
        Self {
            dir: dir.to_owned(),
            _temporary: None,
            ca,
            ca_file,
        }
    }

    /// The CA's certificate file (PEM).
    pub fn ca(&self) -> &Path {
        &self.ca_file
    }

    /// A server certificate for `localhost` and 127.0.0.1 (also good as a client
    /// certificate), written as `{file}.pem` / `{file}.key`.
    pub fn server(&self, file: &str) -> Issued {
        self.issue(
            file,
            "localhost",
            &["localhost", "127.0.0.1"],
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A client certificate with subject common name `cn` and DNS names `dns`.
    pub fn client(&self, file: &str, cn: &str, dns: &[&str]) -> Issued {
        self.issue(file, cn, dns, &[ExtendedKeyUsagePurpose::ClientAuth])
    }

    fn issue(
        &self,
        file: &str,
        cn: &str,
        names: &[&str],
        usages: &[ExtendedKeyUsagePurpose],
    ) -> Issued {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("certificate params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = usages.to_vec();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.ca).expect("sign");
        let issued = Issued {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&issued.cert, cert.pem()).expect("write cert");
        std::fs::write(&issued.key, key.serialize_pem()).expect("write key");
        issued
    }
}
