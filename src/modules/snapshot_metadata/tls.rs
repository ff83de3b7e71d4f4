//! The gRPC server's TLS: the key pair read from `--tls-cert`/`--tls-key`
//! and taken again when either file's content changes (a rotated Secret),
//! checked at each new connection's handshake, so connections already open,
//! and the streams on them, keep the certificate they started with; the
//! protocol versions, cipher suites and curves the flags allow.
//!
//! The files are read at every handshake (two small reads beside a TLS
//! handshake's cost) rather than watched or compared by modification time:
//! a timestamp's granularity can hide a rewrite, and a watch misses the
//! symlink swap a Secret volume makes.

use std::{
    fmt, fs,
    path::{Path, PathBuf},
    sync::Arc,
};

use parking_lot::Mutex;
use rustls::{
    ServerConfig, SupportedCipherSuite,
    crypto::{CryptoProvider, SupportedKxGroup, ring},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use super::config::TlsMin;
use crate::compat::snapshot_metadata as upstream;

/// Why the server's TLS cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Neither the flags nor the environment name a file.
    #[error("--tls-cert and --tls-key (or $TLS_CERT_PATH and $TLS_KEY_PATH) are required")]
    NoFiles,
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{0}: no PEM certificate")]
    NoCertificate(String),
    /// The key file holds no usable private key, or not the certificate's.
    #[error("{path}: {why}")]
    Key {
        /// The key file.
        path: String,
        /// Why.
        why: String,
    },
    /// A cipher suite this server does not offer.
    #[error("--tls-cipher-suites: {0:?} is not one of {1}")]
    CipherSuite(String, String),
    /// A curve this server does not offer.
    #[error("--tls-curve-preferences: {0:?} is not one of {1}")]
    Curve(String, String),
    /// rustls refused the combination.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The two files' bytes a key pair was made from.
type Files = (Vec<u8>, Vec<u8>);

/// The server's key pair, read again when its files change.
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    loaded: Mutex<(Files, Arc<CertifiedKey>)>,
}

impl fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCert").field("cert", &self.cert).field("key", &self.key).finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Reads the pair (an error names the file and the cause).
    pub fn load(cert: &Path, key: &Path, provider: Arc<CryptoProvider>) -> Result<ReloadingCert, TlsError> {
        let files = read_files(cert, key)?;
        let pair = certified_key(&files, cert, key, &provider)?;
        Ok(ReloadingCert { cert: cert.into(), key: key.into(), provider, loaded: Mutex::new((files, pair)) })
    }

    /// The pair to hand out now: made again when a file's content changed
    /// since the last time. Files that do not make a pair (a rotation half
    /// written, a key of another certificate) keep the previous pair until
    /// they change again; files that cannot be read keep it too.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut loaded = self.loaded.lock();
        if let Ok(now) = read_files(&self.cert, &self.key)
            && now != loaded.0
        {
            let made = certified_key(&now, &self.cert, &self.key, &self.provider);
            loaded.0 = now;
            match made {
                Ok(pair) => {
                    tracing::info!(cert = %self.cert.display(), "Loaded the rotated TLS certificate");
                    loaded.1 = pair;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "The TLS files changed but do not load; serving the previous certificate")
                }
            }
        }
        loaded.1.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn read_files(cert: &Path, key: &Path) -> Result<Files, TlsError> {
    let read = |p: &Path| fs::read(p).map_err(|source| TlsError::Read { path: p.display().to_string(), source });
    Ok((read(cert)?, read(key)?))
}

/// The pair made from the files' bytes (the paths name them in errors).
fn certified_key(
    (cert_pem, key_pem): &Files,
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem).filter_map(Result::ok).collect();
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert.display().to_string()));
    }
    let key_error = |why: String| TlsError::Key { path: key.display().to_string(), why };
    let der = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| key_error(format!("no PEM private key ({e})")))?;
    CertifiedKey::from_der(chain, der, provider).map(Arc::new).map_err(|e| key_error(e.to_string()))
}

/// The versions, suites and curves the flags allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsChoice {
    /// `--tls-min-version`.
    pub min: TlsMin,
    /// `--tls-cipher-suites`, split (empty: every suite).
    pub cipher_suites: Vec<String>,
    /// `--tls-curve-preferences`, split, in preference order (empty: the
    /// library's).
    pub curves: Vec<String>,
}

/// A comma-separated flag's names.
pub fn split_names(flag: &str) -> Vec<String> {
    flag.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}

/// The crypto provider the choice allows: every TLS 1.3 suite (Go's
/// `--tls-cipher-suites` names TLS 1.2 suites only), the named TLS 1.2
/// ones, the named curves in their order.
pub fn provider(choice: &TlsChoice) -> Result<CryptoProvider, TlsError> {
    let mut provider = ring::default_provider();
    if !choice.cipher_suites.is_empty() {
        let offered = iana_names(upstream::CIPHER_SUITE_NAMES);
        let mut suites: Vec<SupportedCipherSuite> =
            provider.cipher_suites.iter().copied().filter(|s| s.tls13().is_some()).collect();
        for name in &choice.cipher_suites {
            let iana = go_to_iana(upstream::CIPHER_SUITE_NAMES, name);
            let suite = ring::ALL_CIPHER_SUITES.iter().find(|s| Some(format!("{:?}", s.suite())) == iana);
            suites.push(*suite.ok_or_else(|| TlsError::CipherSuite(name.clone(), offered.clone()))?);
        }
        provider.cipher_suites = suites;
    }
    if !choice.curves.is_empty() {
        let offered = iana_names(upstream::CURVE_NAMES);
        let mut groups: Vec<&'static dyn SupportedKxGroup> = Vec::new();
        for name in &choice.curves {
            let iana = go_to_iana(upstream::CURVE_NAMES, name);
            let group = ring::ALL_KX_GROUPS.iter().find(|g| Some(format!("{:?}", g.name())) == iana);
            groups.push(*group.ok_or_else(|| TlsError::Curve(name.clone(), offered.clone()))?);
        }
        provider.kx_groups = groups;
    }
    Ok(provider)
}

fn go_to_iana(table: &[(&str, &str)], go: &str) -> Option<String> {
    table.iter().find(|(g, _)| *g == go).map(|(_, iana)| iana.to_string())
}

/// The Go names of a table that this build's provider offers.
fn iana_names(table: &[(&str, &str)]) -> String {
    let offered = |iana: &str| {
        ring::ALL_CIPHER_SUITES.iter().any(|s| format!("{:?}", s.suite()) == iana)
            || ring::ALL_KX_GROUPS.iter().any(|g| format!("{:?}", g.name()) == iana)
    };
    let names: Vec<&str> = table.iter().filter(|(_, iana)| offered(iana)).map(|(go, _)| *go).collect();
    names.join(", ")
}

/// The server's configuration: the choice's provider and versions, the
/// reloading key pair, HTTP/2 only (gRPC).
pub fn server_config(choice: &TlsChoice, cert: Arc<ReloadingCert>) -> Result<ServerConfig, TlsError> {
    let versions: &[&rustls::SupportedProtocolVersion] = match choice.min {
        TlsMin::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsMin::Tls13 => &[&rustls::version::TLS13],
    };
    let mut config = ServerConfig::builder_with_provider(cert.provider.clone())
        .with_protocol_versions(versions)?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests;
