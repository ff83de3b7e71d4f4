//! Test identities and the PKI of a test cluster: the CAs, serving and client
//! certificates (client certificates for identities with groups), kubeconfigs.
//!
//! Why client certificates and not the apiserver's `--token-auth-file`: that
//! file (token, user, uid, groups) would need no DER at all, but the
//! apiserver reads it once at start, and the tests mint identities while the
//! cluster runs (a unique user per test, ServiceAccounts of test
//! namespaces). A certificate signed by the client CA is accepted at once,
//! for any user and groups. ServiceAccount tokens (TokenRequest) would serve
//! the ServiceAccounts only, and only for service accounts that exist;
//! users with groups still need this. The DER splicing is the small price:
//! rcgen writes one `O=` per subject, the apiserver reads each as a group.

#[allow(unused_imports)]
use super::*;

/// Who a minted client certificate authenticates as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A user name (certificate CN) and groups (certificate O).
    User {
        /// User name.
        name: String,
        /// Groups (`system:authenticated` is added by the apiserver anyway).
        groups: Vec<String>,
    },
    /// A ServiceAccount: user `system:serviceaccount:<ns>:<name>`, groups
    /// `system:serviceaccounts`, `system:serviceaccounts:<ns>`, `system:authenticated`.
    /// The ServiceAccount object need not exist; RBAC subjects of kind
    /// ServiceAccount match the user name.
    ServiceAccount {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

impl Identity {
    /// A user with groups.
    pub fn user(name: &str, groups: &[&str]) -> Identity {
        Identity::User { name: name.to_string(), groups: groups.iter().map(|g| g.to_string()).collect() }
    }

    /// A ServiceAccount.
    pub fn service_account(namespace: &str, name: &str) -> Identity {
        Identity::ServiceAccount { namespace: namespace.to_string(), name: name.to_string() }
    }

    /// Parses `NAMESPACE/NAME` (or `system:serviceaccount:NAMESPACE:NAME`) as a ServiceAccount.
    pub fn parse_service_account(s: &str) -> Result<Identity> {
        let rest = s.strip_prefix("system:serviceaccount:").map(|r| r.replacen(':', "/", 1));
        let s = rest.as_deref().unwrap_or(s);
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Identity::service_account(ns, name))
            }
            _ => bail!("service account must be NAMESPACE/NAME, got {s:?}"),
        }
    }

    /// The user name the apiserver sees.
    pub fn username(&self) -> String {
        match self {
            Identity::User { name, .. } => name.clone(),
            Identity::ServiceAccount { namespace, name } => format!("system:serviceaccount:{namespace}:{name}"),
        }
    }

    /// The groups written into the certificate.
    pub fn groups(&self) -> Vec<String> {
        match self {
            Identity::User { groups, .. } => groups.clone(),
            Identity::ServiceAccount { namespace, .. } => vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_string(),
            ],
        }
    }

    pub(crate) fn file_stem(&self) -> String {
        let raw = match self {
            Identity::User { name, .. } => format!("user-{name}"),
            Identity::ServiceAccount { namespace, name } => format!("sa-{namespace}-{name}"),
        };
        raw.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect()
    }
}

pub(super) fn validity(params: &mut CertificateParams) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(30);
}

pub(super) fn ca_params(cn: &str) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p
}

pub(super) fn write_file(path: &Path, contents: &str, private: bool) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    f.write_all(contents.as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}

/// Creates a self-signed CA, writes `<stem>.crt` and `<stem>.key`.
pub(super) fn new_ca(dir: &Path, stem: &str, cn: &str) -> Result<()> {
    let key = KeyPair::generate()?;
    let mut params = ca_params(cn);
    validity(&mut params);
    let cert = params.self_signed(&key)?;
    write_file(&dir.join(format!("{stem}.crt")), &cert.pem(), false)?;
    write_file(&dir.join(format!("{stem}.key")), &key.serialize_pem(), true)
}

/// The issuer of a CA written by [`new_ca`] (same DN, key usages and key ID method,
/// so no certificate parser is needed).
pub(super) fn load_issuer(dir: &Path, stem: &str, cn: &str) -> Result<Issuer<'static, KeyPair>> {
    let path = dir.join(format!("{stem}.key"));
    let pem = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    Ok(Issuer::new(ca_params(cn), KeyPair::from_pem(&pem)?))
}

/// A serving certificate for 127.0.0.1/localhost signed by the server CA.
pub(super) fn new_serving_cert(dir: &Path, stem: &str, cn: &str) -> Result<()> {
    let issuer = load_issuer(dir, "ca", SERVER_CA_CN)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params);
    let cert = params.signed_by(&key, &issuer)?;
    write_file(&dir.join(format!("{stem}.crt")), &cert.pem(), false)?;
    write_file(&dir.join(format!("{stem}.key")), &key.serialize_pem(), true)
}

/// A client certificate for `identity` signed by the client CA in `pki_dir`:
/// (certificate PEM, private key PEM). The subject is `CN=<user>` plus one `O=` per
/// group, which is how the apiserver's x509 authenticator reads users and groups.
pub fn issue_client_cert(pki_dir: &Path, identity: &Identity) -> Result<(String, String)> {
    let issuer = load_issuer(pki_dir, "client-ca", CLIENT_CA_CN)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, identity.username());
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    validity(&mut params);
    let cert = params.signed_by(&key, &issuer)?;
    // rcgen keeps one value per attribute type, so it cannot write several O=
    // attributes: replace the subject in its TBSCertificate and sign again.
    let der = der::with_subject(cert.der(), &der::name(&identity.groups(), &identity.username()), issuer.key())?;
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}-----END CERTIFICATE-----\n",
        base64::engine::general_purpose::STANDARD
            .encode(der)
            .as_bytes()
            .chunks(64)
            .map(|c| format!("{}\n", String::from_utf8_lossy(c)))
            .collect::<String>()
    );
    Ok((pem, key.serialize_pem()))
}

/// Just enough DER to swap the subject of a certificate.
mod der {
    use anyhow::{Result, bail};
    use rcgen::SigningKey;

    /// Tag + length header for `len` content bytes.
    pub(crate) fn header(tag: u8, len: usize) -> Vec<u8> {
        let mut h = vec![tag];
        if len < 0x80 {
            h.push(len as u8);
        } else {
            let bytes: Vec<u8> = len.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
            h.push(0x80 | bytes.len() as u8);
            h.extend(bytes);
        }
        h
    }

    pub(crate) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut v = header(tag, content.len());
        v.extend_from_slice(content);
        v
    }

    /// Splits the first element off `buf`: (whole element, its content, rest).
    pub(crate) fn split(buf: &[u8]) -> Result<(&[u8], &[u8], &[u8])> {
        if buf.len() < 2 {
            bail!("truncated DER");
        }
        let (len, hdr) = if buf[1] < 0x80 {
            (buf[1] as usize, 2)
        } else {
            let n = (buf[1] & 0x7f) as usize;
            if n == 0 || n > 4 || buf.len() < 2 + n {
                bail!("bad DER length");
            }
            (buf[2..2 + n].iter().fold(0usize, |acc, b| (acc << 8) | *b as usize), 2 + n)
        };
        if buf.len() < hdr + len {
            bail!("truncated DER element");
        }
        Ok((&buf[..hdr + len], &buf[hdr..hdr + len], &buf[hdr + len..]))
    }

    pub(crate) fn elements(mut content: &[u8]) -> Result<Vec<&[u8]>> {
        let mut out = Vec::new();
        while !content.is_empty() {
            let (whole, _, rest) = split(content)?;
            out.push(whole);
            content = rest;
        }
        Ok(out)
    }

    /// A Name: one RDN per organization (2.5.4.10), then the common name (2.5.4.3),
    /// all UTF8String.
    pub(super) fn name(organizations: &[String], common_name: &str) -> Vec<u8> {
        let attr = |oid_last: u8, value: &str| {
            let oid = tlv(0x06, &[0x55, 0x04, oid_last]);
            let seq = tlv(0x30, &[oid, tlv(0x0c, value.as_bytes())].concat());
            tlv(0x31, &seq)
        };
        let rdns: Vec<u8> =
            organizations.iter().map(|o| attr(10, o)).chain(std::iter::once(attr(3, common_name))).flatten().collect();
        tlv(0x30, &rdns)
    }

    /// `cert` with its subject replaced by `subject`, signed again by `key`.
    pub(super) fn with_subject(cert: &[u8], subject: &[u8], key: &impl SigningKey) -> Result<Vec<u8>> {
        let (_, cert_content, _) = split(cert)?;
        let parts = elements(cert_content)?;
        let [tbs, sig_alg, _sig] = parts[..] else { bail!("not a certificate") };
        let (_, tbs_content, _) = split(tbs)?;
        let mut fields = elements(tbs_content)?;
        // version [0] (present in v3), serial, signature, issuer, validity, subject, ...
        let subject_at = if fields.first().map(|f| f[0]) == Some(0xa0) { 5 } else { 4 };
        if fields.len() <= subject_at {
            bail!("short TBSCertificate");
        }
        fields[subject_at] = subject;
        let new_tbs = tlv(0x30, &fields.concat());
        let mut bits = vec![0u8];
        bits.extend(key.sign(&new_tbs)?);
        Ok(tlv(0x30, &[new_tbs, sig_alg.to_vec(), tlv(0x03, &bits)].concat()))
    }
}

/// A self-contained kubeconfig (JSON, which is valid YAML) with embedded CA, client
/// certificate and key.
pub(super) fn kubeconfig_text(api_url: &str, ca_pem: &str, user: &str, cert_pem: &str, key_pem: &str) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "csi-sidecar-itest", "cluster": {
            "server": api_url,
            "certificate-authority-data": b64(ca_pem),
        }}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(cert_pem),
            "client-key-data": b64(key_pem),
        }}],
        "contexts": [{"name": "csi-sidecar-itest", "context": {"cluster": "csi-sidecar-itest", "user": user}}],
        "current-context": "csi-sidecar-itest",
    });
    let mut text = serde_json::to_string_pretty(&doc).unwrap_or_default();
    text.push('\n');
    text
}

pub(super) fn write_kubeconfig(pki_dir: &Path, api_url: &str, identity: &Identity, out: &Path) -> Result<()> {
    let ca_path = pki_dir.join("ca.crt");
    let ca = std::fs::read_to_string(&ca_path).with_context(|| format!("read {}", ca_path.display()))?;
    let (cert, key) = issue_client_cert(pki_dir, identity)?;
    write_file(out, &kubeconfig_text(api_url, &ca, &identity.username(), &cert, &key), true)
}

/// Issues a client certificate for `identity` (signed by the cluster's client CA)
/// and writes a self-contained kubeconfig for it to `out`.
pub fn mint_kubeconfig(info: &ClusterInfo, identity: &Identity, out: &Path) -> Result<()> {
    write_kubeconfig(&info.pki_dir(), &info.api_url, identity, out)
}

/// Generates the PKI of a run: server CA (`ca.*`), client CA (`client-ca.*`),
/// serving certificates for the apiserver, kube-controller-manager and a
/// real node's kubelet, the apiserver's client certificate for the kubelet,
/// and the ServiceAccount token keys (`sa.key`, `sa.pub`).
pub(super) fn generate_pki(pki: &Path) -> Result<()> {
    new_ca(pki, "ca", SERVER_CA_CN)?;
    new_ca(pki, "client-ca", CLIENT_CA_CN)?;
    new_serving_cert(pki, "apiserver", "kube-apiserver")?;
    new_serving_cert(pki, "kube-controller-manager", "kube-controller-manager")?;
    // A real node's kubelet serves with this one; the apiserver reaches it
    // (logs, exec, port-forward) with the client certificate below.
    new_serving_cert(pki, "kubelet", "kubelet")?;
    let (cert, key) = issue_client_cert(pki, &Identity::user("kube-apiserver-kubelet-client", &[]))?;
    write_file(&pki.join("apiserver-kubelet-client.crt"), &cert, false)?;
    write_file(&pki.join("apiserver-kubelet-client.key"), &key, true)?;
    // ServiceAccount token keys: ECDSA P-256, private in PKCS#8, public as SPKI.
    let sa = KeyPair::generate()?;
    write_file(&pki.join("sa.key"), &sa.serialize_pem(), true)?;
    write_file(&pki.join("sa.pub"), &sa.public_key_pem(), false)
}
