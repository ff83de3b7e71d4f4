use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// A self-signed pair for "localhost": (certificate PEM, key PEM, DER).
fn pair() -> (String, String, CertificateDer<'static>) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    (made.cert.pem(), made.signing_key.serialize_pem(), made.cert.der().clone())
}

fn choice() -> TlsChoice {
    TlsChoice { min: TlsMin::Tls12, cipher_suites: Vec::new(), curves: Vec::new() }
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new((cert, key, _): &(String, String, CertificateDer<'static>)) -> Files {
        let files = Files { dir: tempfile::tempdir().expect("tempdir") };
        files.write(cert, key);
        files
    }
    fn cert(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }
    fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }
    fn write(&self, cert: &str, key: &str) {
        fs::write(self.cert(), cert).expect("write cert");
        fs::write(self.key(), key).expect("write key");
    }
    fn load(&self) -> Result<ReloadingCert, TlsError> {
        ReloadingCert::load(&self.cert(), &self.key(), Arc::new(provider(&choice()).expect("provider")))
    }
}

#[test]
fn a_rewritten_pair_is_served_from_the_next_handshake_and_a_broken_one_never() {
    let (first, second, third) = (pair(), pair(), pair());
    let files = Files::new(&first);
    let cert = files.load().expect("loads");
    assert_eq!(cert.current().cert[0], first.2);
    assert_eq!(cert.current().cert[0], first.2, "unchanged files keep the pair");

    files.write(&second.0, &second.1);
    assert_eq!(cert.current().cert[0], second.2, "the rotated pair");

    // Half a rotation: the third certificate beside the second's key.
    files.write(&third.0, &second.1);
    assert_eq!(cert.current().cert[0], second.2, "a key of another certificate keeps the previous pair");
    fs::remove_file(files.key()).expect("remove");
    assert_eq!(cert.current().cert[0], second.2, "a missing file keeps it too");
    files.write(&third.0, &third.1);
    assert_eq!(cert.current().cert[0], third.2, "the completed rotation");
}

#[test]
fn bad_files_are_refused_at_start_naming_the_file() {
    let good = pair();
    let files = Files::new(&good);
    files.write("not a certificate", &good.1);
    let err = files.load().expect_err("no certificate").to_string();
    assert!(err.contains("tls.crt") && err.contains("no PEM certificate"), "{err}");
    files.write(&good.0, &pair().1);
    let err = files.load().expect_err("another key").to_string();
    assert!(err.contains("tls.key"), "{err}");
    fs::remove_file(files.cert()).expect("remove");
    let err = files.load().expect_err("missing").to_string();
    assert!(err.starts_with("reading ") && err.contains("tls.crt"), "{err}");
}

#[test]
fn the_flags_choose_tls_1_2_suites_and_curves_by_gos_names() {
    let with = |suites: &[&str], curves: &[&str]| {
        provider(&TlsChoice {
            min: TlsMin::Tls12,
            cipher_suites: suites.iter().map(|s| s.to_string()).collect(),
            curves: curves.iter().map(|s| s.to_string()).collect(),
        })
    };
    let all = with(&[], &[]).expect("defaults");
    assert_eq!(all.cipher_suites.len(), ring::ALL_CIPHER_SUITES.len());

    let one = with(&["TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305"], &["CurveP384", "X25519"]).expect("Go's names");
    let tls12: Vec<String> =
        one.cipher_suites.iter().filter(|s| s.tls13().is_none()).map(|s| format!("{:?}", s.suite())).collect();
    assert_eq!(tls12, ["TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"]);
    assert_eq!(one.cipher_suites.iter().filter(|s| s.tls13().is_some()).count(), 3, "TLS 1.3 suites stay");
    let groups: Vec<String> = one.kx_groups.iter().map(|g| format!("{:?}", g.name())).collect();
    assert_eq!(groups, ["secp384r1", "X25519"], "in the flag's order");

    let err = with(&["TLS_RSA_WITH_RC4_128_SHA"], &[]).expect_err("not offered").to_string();
    assert!(
        err.starts_with("--tls-cipher-suites: \"TLS_RSA_WITH_RC4_128_SHA\"") && err.contains("TLS_ECDHE_"),
        "{err}"
    );
    let err = with(&[], &["CurveP521"]).expect_err("not offered by this build").to_string();
    assert!(err.starts_with("--tls-curve-preferences: \"CurveP521\"") && err.contains("CurveP256"), "{err}");
    assert_eq!(split_names(" a, ,b "), ["a", "b"]);
}

/// One TLS connection through the server's configuration: the certificate
/// the client saw, or the handshake's error.
async fn handshake(
    config: Arc<ServerConfig>,
    trust: &CertificateDer<'static>,
    max: Option<&'static rustls::SupportedProtocolVersion>,
) -> Result<CertificateDer<'static>, String> {
    let mut roots = RootCertStore::empty();
    roots.add(trust.clone()).map_err(|e| e.to_string())?;
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        max.map_or_else(|| rustls::ALL_VERSIONS.to_vec(), |v| vec![v]);
    let client = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_protocol_versions(&versions)
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        let mut tls = tokio_rustls::TlsAcceptor::from(config).accept(server_io).await?;
        tls.write_all(b"ok").await?;
        tls.shutdown().await
    });
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let connected = tokio_rustls::TlsConnector::from(Arc::new(client)).connect(name, client_io).await;
    let mut tls = connected.map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    tls.read_to_end(&mut got).await.map_err(|e| e.to_string())?;
    let seen = tls.get_ref().1.peer_certificates().and_then(|c| c.first().cloned()).ok_or("no certificate")?;
    let _ = server.await;
    Ok(seen)
}

#[tokio::test]
async fn a_client_sees_the_rotated_certificate_on_its_next_connection_and_the_minimum_version_holds() {
    let (first, second) = (pair(), pair());
    let files = Files::new(&first);
    let cert = Arc::new(files.load().expect("loads"));
    let config = Arc::new(server_config(&choice(), cert.clone()).expect("config"));
    assert_eq!(config.alpn_protocols, [b"h2".to_vec()]);
    assert_eq!(handshake(config.clone(), &first.2, None).await, Ok(first.2.clone()));
    files.write(&second.0, &second.1);
    assert_eq!(handshake(config.clone(), &second.2, None).await, Ok(second.2.clone()));
    assert_eq!(handshake(config.clone(), &second.2, Some(&rustls::version::TLS12)).await, Ok(second.2.clone()));

    let tls13 = TlsChoice { min: TlsMin::Tls13, ..choice() };
    let strict = Arc::new(server_config(&tls13, cert).expect("config"));
    let refused = handshake(strict, &second.2, Some(&rustls::version::TLS12)).await;
    assert!(refused.is_err(), "a TLS 1.2 client is refused at --tls-min-version=VersionTLS13: {refused:?}");
}
