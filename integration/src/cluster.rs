//! A real Kubernetes control plane on loopback: etcd, kube-apiserver and
//! kube-controller-manager (PV binder, attach-detach, PVC and PV protection).
//!
//! Two halves:
//!
//! * the **launcher** ([`serve`], run as `cluster serve` by the `cluster` binary)
//!   generates the PKI, starts the three components in a fresh run directory, prints
//!   one JSON line ([`ClusterInfo`]) on stdout when everything is ready, and tears
//!   the cluster down (kube-controller-manager, then kube-apiserver, then etcd;
//!   SIGKILL after a grace period) when its stdin reaches EOF or on
//!   SIGTERM/SIGINT/SIGHUP; lines on its stdin are commands ([`LauncherCommand`]:
//!   `restart kube-apiserver`), each answered by one JSON line ([`CommandReply`]);
//! * the **handle** ([`ControlPlane`]) used by tests: it spawns the launcher as a
//!   child process with a pipe on its stdin and parses the JSON line. The cluster's
//!   lifetime therefore never depends on `Drop` running: when the test process
//!   exits or is killed, the kernel closes the pipe and the launcher stops the
//!   cluster by itself.
//!
//! Run directories live under `target/cluster-runs/` of the workspace (or
//! `$CSI_SIDECAR_CLUSTER_DIR`). A run directory is deleted after a clean run and
//! kept (its path printed on stderr) when a test panicked, when a component had to
//! be killed or died, or when `CSI_SIDECAR_KEEP_CLUSTER=1`.
//!
//! Credentials: [`mint_kubeconfig`] issues a client certificate signed by the
//! cluster's client CA for any user/groups or ServiceAccount ([`Identity`]) and
//! writes a self-contained kubeconfig for it, so a process runs under exactly the
//! RBAC bound to that identity.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::{Mutex, Once, OnceLock},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use serde::{Deserialize, Serialize};

use crate::{component_bin, workspace_root};

/// Keep the run directory even after a clean run (`1`/`true`).
pub const KEEP_ENV: &str = "CSI_SIDECAR_KEEP_CLUSTER";
/// Parent directory for run directories (default: `<workspace>/target/cluster-runs`).
pub const DIR_ENV: &str = "CSI_SIDECAR_CLUSTER_DIR";
/// Path of the `cluster` launcher binary (default: next to the test executable).
pub const BIN_ENV: &str = "CSI_SIDECAR_CLUSTER_BIN";
/// `cluster.json` of an already running cluster for [`ControlPlane::shared`] to use
/// instead of starting one (e.g. one started with `cluster serve` in a terminal).
pub const ATTACH_ENV: &str = "CSI_SIDECAR_CLUSTER_INFO";

/// The file in a run directory that marks the run as failed (the directory is kept).
pub const FAILED_MARKER: &str = "FAILED";
/// The file in a run directory holding the [`ClusterInfo`] as JSON.
pub const INFO_FILE: &str = "cluster.json";

/// The user of the admin kubeconfig (group `system:masters`).
pub const ADMIN_USER: &str = "csi-sidecar-admin";
const SERVER_CA_CN: &str = "csi-sidecar-itest-ca";
const CLIENT_CA_CN: &str = "csi-sidecar-itest-client-ca";
const KCM_CONTROLLERS: &str = "persistentvolume-binder-controller,persistentvolume-attach-detach-controller,\
                               persistentvolumeclaim-protection-controller,persistentvolume-protection-controller";

/// What the launcher reports when the cluster is ready (the JSON line on its
/// stdout, also written to `<run_dir>/cluster.json`). All paths are absolute.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterInfo {
    /// The run directory (PKI, etcd data, logs, kubeconfigs).
    pub run_dir: PathBuf,
    /// Admin kubeconfig (user [`ADMIN_USER`] in `system:masters`), self-contained.
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub api_url: String,
    /// CA of the apiserver's (and kube-controller-manager's) serving certificate.
    pub ca_cert: PathBuf,
    /// CA the apiserver trusts for client certificates (`--client-ca-file`).
    pub client_ca_cert: PathBuf,
    /// `http://127.0.0.1:<port>`.
    pub etcd_url: String,
    /// `https://127.0.0.1:<port>` (kube-controller-manager's /healthz, /metrics).
    pub kcm_url: String,
    /// Component logs: `etcd.log`, `kube-apiserver.log`, `kube-controller-manager.log`, `cluster.log`.
    pub log_dir: PathBuf,
    /// Loopback ports.
    pub ports: Ports,
    /// Process IDs.
    pub pids: Pids,
    /// Milliseconds from the launcher's start until each step was done.
    pub startup_ms: StartupMs,
}

/// Loopback ports of a cluster.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ports {
    /// etcd client port.
    pub etcd: u16,
    /// etcd peer port.
    pub etcd_peer: u16,
    /// kube-apiserver secure port.
    pub apiserver: u16,
    /// kube-controller-manager secure port.
    pub kcm: u16,
}

/// Process IDs of a cluster.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pids {
    /// The launcher (`cluster serve`).
    pub launcher: u32,
    /// etcd.
    pub etcd: u32,
    /// kube-apiserver.
    pub kube_apiserver: u32,
    /// kube-controller-manager.
    pub kube_controller_manager: u32,
    /// The snapshot-controller, when the launcher runs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_controller: Option<u32>,
}

impl Pids {
    /// The three component PIDs (not the launcher).
    pub fn components(&self) -> [u32; 3] {
        [self.etcd, self.kube_apiserver, self.kube_controller_manager]
    }
}

/// Milliseconds since the launcher started, at the end of each startup step.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct StartupMs {
    /// PKI and kubeconfig generated.
    pub pki: u64,
    /// etcd `/health` true.
    pub etcd: u64,
    /// kube-apiserver `/readyz` ok.
    pub apiserver: u64,
    /// kube-controller-manager `/healthz` ok (= ready).
    pub kcm: u64,
}

impl ClusterInfo {
    /// Reads a `cluster.json`.
    pub fn read(path: &Path) -> Result<ClusterInfo> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }

    /// The PKI directory.
    pub fn pki_dir(&self) -> PathBuf {
        self.run_dir.join("pki")
    }

    /// Writes a kubeconfig for `identity` into `<run_dir>/users/` and returns its path.
    pub fn mint(&self, identity: &Identity) -> Result<PathBuf> {
        let out = self.run_dir.join("users").join(format!("{}.kubeconfig", identity.file_stem()));
        mint_kubeconfig(self, identity, &out)?;
        Ok(out)
    }
}

// ---------------------------------------------------------------------------
// Identities and PKI
// ---------------------------------------------------------------------------

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

    fn file_stem(&self) -> String {
        let raw = match self {
            Identity::User { name, .. } => format!("user-{name}"),
            Identity::ServiceAccount { namespace, name } => format!("sa-{namespace}-{name}"),
        };
        raw.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect()
    }
}

fn validity(params: &mut CertificateParams) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(30);
}

fn ca_params(cn: &str) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p
}

fn write_file(path: &Path, contents: &str, private: bool) -> Result<()> {
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
fn new_ca(dir: &Path, stem: &str, cn: &str) -> Result<()> {
    let key = KeyPair::generate()?;
    let mut params = ca_params(cn);
    validity(&mut params);
    let cert = params.self_signed(&key)?;
    write_file(&dir.join(format!("{stem}.crt")), &cert.pem(), false)?;
    write_file(&dir.join(format!("{stem}.key")), &key.serialize_pem(), true)
}

/// The issuer of a CA written by [`new_ca`] (same DN, key usages and key ID method,
/// so no certificate parser is needed).
fn load_issuer(dir: &Path, stem: &str, cn: &str) -> Result<Issuer<'static, KeyPair>> {
    let path = dir.join(format!("{stem}.key"));
    let pem = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    Ok(Issuer::new(ca_params(cn), KeyPair::from_pem(&pem)?))
}

/// A serving certificate for 127.0.0.1/localhost signed by the server CA.
fn new_serving_cert(dir: &Path, stem: &str, cn: &str) -> Result<()> {
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
    fn header(tag: u8, len: usize) -> Vec<u8> {
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

    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut v = header(tag, content.len());
        v.extend_from_slice(content);
        v
    }

    /// Splits the first element off `buf`: (whole element, its content, rest).
    fn split(buf: &[u8]) -> Result<(&[u8], &[u8], &[u8])> {
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

    fn elements(mut content: &[u8]) -> Result<Vec<&[u8]>> {
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
fn kubeconfig_text(api_url: &str, ca_pem: &str, user: &str, cert_pem: &str, key_pem: &str) -> String {
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

fn write_kubeconfig(pki_dir: &Path, api_url: &str, identity: &Identity, out: &Path) -> Result<()> {
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
/// serving certificates for the apiserver and kube-controller-manager, and the
/// ServiceAccount token keys (`sa.key`, `sa.pub`).
fn generate_pki(pki: &Path) -> Result<()> {
    new_ca(pki, "ca", SERVER_CA_CN)?;
    new_ca(pki, "client-ca", CLIENT_CA_CN)?;
    new_serving_cert(pki, "apiserver", "kube-apiserver")?;
    new_serving_cert(pki, "kube-controller-manager", "kube-controller-manager")?;
    // ServiceAccount token keys: ECDSA P-256, private in PKCS#8, public as SPKI.
    let sa = KeyPair::generate()?;
    write_file(&pki.join("sa.key"), &sa.serialize_pem(), true)?;
    write_file(&pki.join("sa.pub"), &sa.public_key_pem(), false)
}

// ---------------------------------------------------------------------------
// Launcher
// ---------------------------------------------------------------------------

/// Options of [`serve`].
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Use this (new or empty) run directory instead of a fresh one under [`runs_dir`].
    pub run_dir: Option<PathBuf>,
    /// Keep the run directory after a clean run.
    pub keep: bool,
    /// Also write the JSON line to this file (atomically) when ready.
    pub info_file: Option<PathBuf>,
    /// Stop when stdin reaches EOF (false: only on a signal).
    pub watch_stdin: bool,
    /// Only errors and the "kept" notice on stderr (everything still goes to `cluster.log`).
    pub quiet: bool,
    /// How long each component gets between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// Extra kube-apiserver flags (e.g. `--feature-gates=WatchList=false`).
    pub apiserver_args: Vec<String>,
    /// Install the snapshot CRDs and run the common snapshot-controller
    /// (both from the component cache: `snapshot-controller` and the `crd/`
    /// directory next to it).
    pub snapshots: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            run_dir: None,
            keep: false,
            info_file: None,
            watch_stdin: true,
            quiet: false,
            grace: Duration::from_secs(10),
            apiserver_args: Vec::new(),
            snapshots: false,
        }
    }
}

/// The parent of run directories: `$CSI_SIDECAR_CLUSTER_DIR`, else
/// `<workspace>/target/cluster-runs`.
pub fn runs_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => workspace_root().join("target").join("cluster-runs"),
    }
}

fn env_flag(name: &str) -> bool {
    std::env::var(name).map(|v| matches!(v.trim(), "1" | "true" | "yes" | "on")).unwrap_or(false)
}

/// The launcher's log: `<log_dir>/cluster.log`, and stderr unless quiet.
struct Log {
    file: Mutex<Option<std::fs::File>>,
    quiet: bool,
}

impl Log {
    fn line(&self, important: bool, msg: &str) {
        if important || !self.quiet {
            // Not eprintln!: a closed stderr (a reader that went away) must not
            // panic the launcher in the middle of a teardown.
            let _ = writeln!(std::io::stderr(), "cluster: {msg}");
        }
        if let Ok(mut guard) = self.file.lock()
            && let Some(f) = guard.as_mut()
        {
            let _ = writeln!(f, "{} {msg}", unix_millis());
        }
    }
    fn info(&self, msg: &str) {
        self.line(false, msg)
    }
    fn error(&self, msg: &str) {
        self.line(true, msg)
    }
}

fn unix_millis() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

/// One component process, in its own process group (a terminal's Ctrl-C reaches
/// only the launcher, which then stops the components in order).
struct Component {
    name: &'static str,
    child: Child,
    log: PathBuf,
    status: Option<ExitStatus>,
    /// What it was started with, for [`Component::respawn`].
    program: PathBuf,
    args: Vec<String>,
}

impl Component {
    fn spawn(name: &'static str, program: &Path, args: &[String], log_dir: &Path) -> Result<Component> {
        let log = log_dir.join(format!("{name}.log"));
        let child = Self::start_process(program, args, &log)?;
        Ok(Component { name, child, log, status: None, program: program.to_path_buf(), args: args.to_vec() })
    }

    fn start_process(program: &Path, args: &[String], log: &Path) -> Result<Child> {
        use std::os::unix::process::CommandExt;
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open {}", log.display()))?;
        let err = out.try_clone()?;
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0)
            .spawn()
            .with_context(|| format!("spawn {}", program.display()))
    }

    /// Stops the process (SIGTERM, SIGKILL after `grace`) and starts it again
    /// with the same program and arguments, appending to the same log.
    async fn respawn(&mut self, grace: Duration, log: &Log) -> Result<()> {
        if self.exited().is_none() {
            self.stop(grace, log).await;
        }
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&self.log) {
            let _ = writeln!(f, "----- restarted by the launcher at {} -----", unix_millis());
        }
        self.child = Self::start_process(&self.program, &self.args, &self.log)?;
        self.status = None;
        Ok(())
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL. Returns whether it stopped cleanly
    /// (exited on SIGTERM, or had already exited with success).
    async fn stop(&mut self, grace: Duration, log: &Log) -> bool {
        if let Some(status) = self.exited() {
            log.error(&format!("{} had already exited: {status}", self.name));
            return false;
        }
        let start = Instant::now();
        let _ = kill(Pid::from_raw(self.pid() as i32), Signal::SIGTERM);
        while start.elapsed() < grace {
            if let Some(status) = self.exited() {
                log.info(&format!("{} stopped in {} ms ({status})", self.name, start.elapsed().as_millis()));
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        log.error(&format!("{} did not exit within {grace:?} of SIGTERM; SIGKILL", self.name));
        let _ = self.child.kill();
        self.status = self.child.wait().ok();
        false
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Picks `n` distinct free loopback ports (all bound at once, then released).
fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners: Vec<std::net::TcpListener> =
        (0..N).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    let mut ports = [0u16; N];
    for (p, l) in ports.iter_mut().zip(&listeners) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
}

async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(10));
    Ok(kube::Client::try_from(config)?)
}

async fn get_text(client: &kube::Client, path: &str) -> Result<String> {
    let req = http::Request::get(path).body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

/// Polls `probe` every 50 ms until it returns `Ok(true)`; fails early when the
/// component exits, and after `timeout` with the last error.
async fn wait_ready(
    comp: &mut Component,
    what: &str,
    timeout: Duration,
    mut probe: impl AsyncFnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let last = match probe().await {
            Ok(true) => return Ok(()),
            Ok(false) => "not ready".to_string(),
            Err(e) => format!("{e:#}"),
        };
        if let Some(status) = comp.exited() {
            bail!(
                "{} exited ({status}) before {what}; last lines of {}:\n{}",
                comp.name,
                comp.log.display(),
                comp.log_tail(30)
            );
        }
        if start.elapsed() > timeout {
            bail!(
                "{} not ready ({what}) within {timeout:?}: {last}; last lines of {}:\n{}",
                comp.name,
                comp.log.display(),
                comp.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The running components, stopped in reverse start order.
struct Running {
    comps: Vec<Component>,
}

impl Running {
    /// Stops KCM, then the apiserver, then etcd. Returns whether all stopped cleanly.
    async fn stop(&mut self, grace: Duration, log: &Log) -> bool {
        let mut clean = true;
        while let Some(mut c) = self.comps.pop() {
            clean &= c.stop(grace, log).await;
        }
        clean
    }

    /// The first component that has exited, if any.
    fn first_exited(&mut self) -> Option<(&'static str, ExitStatus)> {
        self.comps.iter_mut().find_map(|c| c.exited().map(|s| (c.name, s)))
    }
}

fn new_run_dir() -> Result<PathBuf> {
    let base = runs_dir();
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let dir = tempfile::Builder::new()
        .prefix(&format!("run-{}-", std::process::id()))
        .tempdir_in(&base)
        .with_context(|| format!("create a run dir in {}", base.display()))?;
    Ok(std::fs::canonicalize(dir.keep())?)
}

async fn start_components(
    run_dir: &Path,
    log: &Log,
    running: &mut Running,
    t0: Instant,
    opts: &ServeOptions,
) -> Result<ClusterInfo> {
    let apiserver_args = &opts.apiserver_args;
    let pki = run_dir.join("pki");
    let log_dir = run_dir.join("logs");
    std::fs::create_dir_all(&log_dir)?;
    let [etcd_port, etcd_peer, api_port, kcm_port] = free_ports::<4>()?;
    let api_url = format!("https://127.0.0.1:{api_port}");
    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let kcm_url = format!("https://127.0.0.1:{kcm_port}");

    generate_pki(&pki)?;
    let kubeconfig = run_dir.join("admin.kubeconfig");
    write_kubeconfig(&pki, &api_url, &Identity::user(ADMIN_USER, &["system:masters"]), &kubeconfig)?;
    let pki_ms = t0.elapsed().as_millis() as u64;
    log.info(&format!("PKI and admin kubeconfig in {pki_ms} ms"));

    let etcd_bin = component_bin("etcd");
    let api_bin = component_bin("kube-apiserver");
    let kcm_bin = component_bin("kube-controller-manager");
    let p = |name: &str| pki.join(name).display().to_string();
    let peer_url = format!("http://127.0.0.1:{etcd_peer}");

    // etcd
    let args: Vec<String> = vec![
        "--name=itest".into(),
        format!("--data-dir={}", run_dir.join("etcd").display()),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=itest={peer_url}"),
        "--unsafe-no-fsync".into(),
        // One member on loopback: elect it quickly.
        "--heartbeat-interval=20".into(),
        "--election-timeout=200".into(),
        "--log-level=warn".into(),
    ];
    running.comps.push(Component::spawn("etcd", &etcd_bin, &args, &log_dir)?);
    let etcd_addr = format!("127.0.0.1:{etcd_port}");
    let comp = running.comps.last_mut().ok_or_else(|| anyhow!("no etcd"))?;
    wait_ready(comp, "/health", Duration::from_secs(30), async || {
        let r = crate::http::get(&etcd_addr, "/health").await.map_err(|e| anyhow!(e))?;
        Ok(r.status == 200 && r.body.contains("\"health\":\"true\""))
    })
    .await?;
    let etcd_ms = t0.elapsed().as_millis() as u64;
    log.info(&format!("etcd ready on {etcd_url} at {etcd_ms} ms"));

    // kube-apiserver
    let args: Vec<String> = vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={api_port}"),
        format!("--tls-cert-file={}", p("apiserver.crt")),
        format!("--tls-private-key-file={}", p("apiserver.key")),
        format!("--client-ca-file={}", p("client-ca.crt")),
        "--authorization-mode=RBAC".into(),
        format!("--service-account-issuer={api_url}"),
        format!("--service-account-key-file={}", p("sa.pub")),
        format!("--service-account-signing-key-file={}", p("sa.key")),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--disable-admission-plugins=ServiceAccount".into(),
        "--endpoint-reconciler-type=none".into(),
        "--allow-privileged=true".into(),
        "-v=1".into(),
    ]
    .into_iter()
    .chain(apiserver_args.iter().cloned())
    .collect();
    running.comps.push(Component::spawn("kube-apiserver", &api_bin, &args, &log_dir)?);
    let admin = client_from_kubeconfig(&kubeconfig).await?;
    let comp = running.comps.last_mut().ok_or_else(|| anyhow!("no apiserver"))?;
    wait_ready(comp, "/readyz", Duration::from_secs(90), async || Ok(get_text(&admin, "/readyz").await? == "ok"))
        .await?;
    let api_ms = t0.elapsed().as_millis() as u64;
    log.info(&format!("kube-apiserver ready on {api_url} at {api_ms} ms"));

    // kube-controller-manager
    let kc = kubeconfig.display().to_string();
    let args: Vec<String> = vec![
        format!("--kubeconfig={kc}"),
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
        format!("--controllers={KCM_CONTROLLERS}"),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={kcm_port}"),
        format!("--tls-cert-file={}", p("kube-controller-manager.crt")),
        format!("--tls-private-key-file={}", p("kube-controller-manager.key")),
        "--use-service-account-credentials=false".into(),
        "-v=2".into(),
    ];
    running.comps.push(Component::spawn("kube-controller-manager", &kcm_bin, &args, &log_dir)?);
    let mut kcm_config = kube::Config::new(kcm_url.parse()?);
    kcm_config.root_cert = Some(vec![pem_to_der(&std::fs::read_to_string(pki.join("ca.crt"))?)?]);
    kcm_config.connect_timeout = Some(Duration::from_secs(5));
    kcm_config.read_timeout = Some(Duration::from_secs(10));
    let kcm = kube::Client::try_from(kcm_config)?;
    let comp = running.comps.last_mut().ok_or_else(|| anyhow!("no kcm"))?;
    wait_ready(comp, "/healthz", Duration::from_secs(60), async || Ok(get_text(&kcm, "/healthz").await? == "ok"))
        .await?;
    let kcm_ms = t0.elapsed().as_millis() as u64;
    log.info(&format!("kube-controller-manager ready on {kcm_url} at {kcm_ms} ms"));

    if opts.snapshots {
        install_snapshot_crds(&admin, log).await?;
        start_snapshot_controller(&kubeconfig, &log_dir, running).await?;
        log.info(&format!("snapshot CRDs and snapshot-controller ready at {} ms", t0.elapsed().as_millis()));
    }

    let pid = |name: &str| running.comps.iter().find(|c| c.name == name).map(Component::pid).unwrap_or(0);
    Ok(ClusterInfo {
        run_dir: run_dir.to_path_buf(),
        kubeconfig,
        api_url,
        ca_cert: pki.join("ca.crt"),
        client_ca_cert: pki.join("client-ca.crt"),
        etcd_url,
        kcm_url,
        log_dir,
        ports: Ports { etcd: etcd_port, etcd_peer, apiserver: api_port, kcm: kcm_port },
        pids: Pids {
            launcher: std::process::id(),
            etcd: pid("etcd"),
            kube_apiserver: pid("kube-apiserver"),
            kube_controller_manager: pid("kube-controller-manager"),
            snapshot_controller: Some(pid(SNAPSHOT_CONTROLLER)).filter(|p| *p != 0),
        },
        startup_ms: StartupMs { pki: pki_ms, etcd: etcd_ms, apiserver: api_ms, kcm: kcm_ms },
    })
}

/// The component name (and log file) of the common snapshot controller.
const SNAPSHOT_CONTROLLER: &str = "snapshot-controller";

/// Creates the snapshot CRDs shipped with the snapshot-controller's release
/// (`crd/*.yaml` next to its binary in the component cache) and waits until
/// each is Established.
async fn install_snapshot_crds(admin: &kube::Client, log: &Log) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let bin = component_bin(SNAPSHOT_CONTROLLER);
    let dir = bin.parent().ok_or_else(|| anyhow!("{} has no parent", bin.display()))?.join("crd");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| {
            format!("the snapshot CRDs: read {} (run build-components.sh snapshot-controller)", dir.display())
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml") && !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no CRDs in {}", dir.display());
    }
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(admin.clone());
    let mut names = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).map_err(|e| anyhow!("{}: not a CRD: {e}", f.display()))?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        match api.create(&kube::api::PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(anyhow!("create CRD {name}: {e}")),
        }
        names.push(name);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in &names {
        loop {
            let crd = api.get(name).await.with_context(|| format!("get CRD {name}"))?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            if Instant::now() > deadline {
                bail!("CRD {name} not Established within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    log.info(&format!("{} snapshot CRDs Established", names.len()));
    Ok(())
}

/// Starts the common snapshot-controller (as the admin, on loopback, without
/// leader election) and waits until it serves its metrics.
async fn start_snapshot_controller(kubeconfig: &Path, log_dir: &Path, running: &mut Running) -> Result<()> {
    let [port] = free_ports::<1>()?;
    let addr = format!("127.0.0.1:{port}");
    let args: Vec<String> = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--http-endpoint={addr}"),
        "--leader-election=false".into(),
        // Tests retry quickly; the defaults (1 s .. 5 min) stay for production.
        "--retry-interval-start=100ms".into(),
        "--retry-interval-max=5s".into(),
        "--kube-api-qps=100".into(),
        "--kube-api-burst=200".into(),
        "-v=4".into(),
    ];
    running.comps.push(Component::spawn(SNAPSHOT_CONTROLLER, &component_bin(SNAPSHOT_CONTROLLER), &args, log_dir)?);
    let comp = running.comps.last_mut().ok_or_else(|| anyhow!("no snapshot-controller"))?;
    wait_ready(comp, "/metrics", Duration::from_secs(60), async || {
        let r = crate::http::get(&addr, "/metrics").await.map_err(|e| anyhow!(e))?;
        Ok(r.status == 200)
    })
    .await
}

fn pem_to_der(pem: &str) -> Result<Vec<u8>> {
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(b64.trim())?)
}

/// A command of the launcher's stdin protocol (one per line, after the
/// cluster is ready; each is answered by one [`CommandReply`] JSON line on
/// stdout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LauncherCommand {
    /// `restart kube-apiserver`: stop kube-apiserver and start it again with the
    /// same flags (same port, same etcd), answering once `/readyz` is ok.
    RestartApiserver,
}

impl LauncherCommand {
    /// The line that requests this command.
    pub fn line(self) -> &'static str {
        match self {
            LauncherCommand::RestartApiserver => "restart kube-apiserver",
        }
    }

    /// Parses one stdin line.
    pub fn parse(line: &str) -> Result<LauncherCommand, String> {
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["restart", "kube-apiserver"] => Ok(LauncherCommand::RestartApiserver),
            ["restart", other] => Err(format!("cannot restart {other:?} (only kube-apiserver)")),
            _ => Err(format!("unknown command {line:?} (known: \"restart kube-apiserver\")")),
        }
    }
}

/// A component restarted by the launcher.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Restarted {
    /// The component's name.
    pub component: String,
    /// Its new process ID.
    pub pid: u32,
    /// Milliseconds from the stop request until it was ready again.
    pub ms: u64,
}

/// The launcher's answer to a [`LauncherCommand`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CommandReply {
    /// The component was restarted and is ready.
    Restarted(Restarted),
    /// The command failed (or was not understood).
    Error(String),
}

async fn run_command(
    line: &str,
    running: &mut Running,
    info: &mut ClusterInfo,
    opts: &ServeOptions,
    log: &Log,
) -> CommandReply {
    log.info(&format!("command: {line}"));
    let result = match LauncherCommand::parse(line) {
        Ok(LauncherCommand::RestartApiserver) => restart_apiserver(running, info, opts, log).await,
        Err(e) => Err(anyhow!(e)),
    };
    match result {
        Ok(r) => {
            log.info(&format!("{} restarted (pid {}) and ready in {} ms", r.component, r.pid, r.ms));
            CommandReply::Restarted(r)
        }
        Err(e) => {
            log.error(&format!("command {line:?} failed: {e:#}"));
            CommandReply::Error(format!("{e:#}"))
        }
    }
}

/// Restarts kube-apiserver in place and waits for `/readyz`; records the new
/// PID in `info` and in the info files.
async fn restart_apiserver(
    running: &mut Running,
    info: &mut ClusterInfo,
    opts: &ServeOptions,
    log: &Log,
) -> Result<Restarted> {
    let t0 = Instant::now();
    let comp = running
        .comps
        .iter_mut()
        .find(|c| c.name == "kube-apiserver")
        .ok_or_else(|| anyhow!("kube-apiserver is not running"))?;
    comp.respawn(opts.grace, log).await?;
    let admin = client_from_kubeconfig(&info.kubeconfig).await?;
    wait_ready(comp, "/readyz after a restart", Duration::from_secs(90), async || {
        Ok(get_text(&admin, "/readyz").await? == "ok")
    })
    .await?;
    info.pids.kube_apiserver = comp.pid();
    let line = serde_json::to_string(&*info).unwrap_or_default();
    for f in std::iter::once(info.run_dir.join(INFO_FILE)).chain(opts.info_file.clone()) {
        write_file(&f, &format!("{line}\n"), false)?;
    }
    Ok(Restarted { component: comp.name.to_string(), pid: comp.pid(), ms: t0.elapsed().as_millis() as u64 })
}

/// Why the launcher stopped waiting.
enum StopReason {
    Requested(&'static str),
    ComponentExited(&'static str, ExitStatus),
}

/// Runs the launcher: starts the cluster, prints the [`ClusterInfo`] JSON line on
/// stdout (or `{"error": ..., "run_dir": ...}` and exit code 1 on failure), waits
/// for stdin EOF or a signal, stops the cluster and deletes or keeps the run
/// directory. Returns the process exit code.
pub async fn serve(opts: ServeOptions) -> Result<i32> {
    let t0 = Instant::now();
    let run_dir = match &opts.run_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            std::fs::canonicalize(d)?
        }
        None => new_run_dir()?,
    };
    std::fs::create_dir_all(run_dir.join("logs"))?;
    let log = Log {
        file: Mutex::new(
            std::fs::OpenOptions::new().create(true).append(true).open(run_dir.join("logs").join("cluster.log")).ok(),
        ),
        quiet: opts.quiet,
    };
    log.info(&format!("run dir {}", run_dir.display()));

    // Signals first, so that a SIGTERM during startup is not lost.
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;

    // stdin: a plain thread (a blocking read must not keep the runtime alive)
    // forwarding command lines, then EOF.
    let (stdin_tx, mut stdin_rx) = tokio::sync::oneshot::channel::<()>();
    let (cmd_tx, mut cmd_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    // Without stdin watching, the senders stay here so the receivers never fire.
    let _unused_senders = if opts.watch_stdin {
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut line = Vec::new();
            while let Ok(n) = stdin.read_until(b'\n', &mut line) {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&line).trim().to_string();
                if !text.is_empty() {
                    let _ = cmd_tx.send(text);
                }
                line.clear();
            }
            let _ = stdin_tx.send(());
        });
        None
    } else {
        Some((stdin_tx, cmd_tx))
    };

    let mut running = Running { comps: Vec::new() };
    let started = tokio::select! {
        r = start_components(&run_dir, &log, &mut running, t0, &opts) => Ok(r),
        _ = sigterm.recv() => Err("SIGTERM"),
        _ = sigint.recv() => Err("SIGINT"),
        _ = sighup.recv() => Err("SIGHUP"),
        _ = &mut stdin_rx => Err("stdin closed"),
    };
    let started = match started {
        Ok(Ok(info)) => Ok(info),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(why) => Err(format!("interrupted during startup ({why})")),
    };
    let mut info = match started {
        Ok(info) => info,
        Err(msg) => {
            log.error(&format!("startup failed: {msg}"));
            running.stop(opts.grace, &log).await;
            let _ = write_file(&run_dir.join(FAILED_MARKER), &format!("startup failed: {msg}\n"), false);
            let line = serde_json::json!({"error": msg, "run_dir": run_dir});
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
            log.error(&format!("run dir kept: {}", run_dir.display()));
            return Ok(1);
        }
    };

    // From here on the components run: no early return, every failure ends in the
    // ordered teardown below.
    let line = serde_json::to_string(&info).unwrap_or_default();
    let mut report_failed = None;
    for f in std::iter::once(run_dir.join(INFO_FILE)).chain(opts.info_file.clone()) {
        if let Err(e) = write_file(&f, &format!("{line}\n"), false) {
            report_failed = Some(format!("cannot write {}: {e:#}", f.display()));
        }
    }
    {
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
            report_failed = Some(format!("cannot write to stdout: {e}"));
        }
    }
    log.info(&format!(
        "ready in {} ms: KUBECONFIG={} ({})",
        info.startup_ms.kcm,
        info.kubeconfig.display(),
        info.api_url
    ));
    if let Some(msg) = &report_failed {
        log.error(msg);
    }

    let mut check = tokio::time::interval(Duration::from_millis(250));
    let reason = loop {
        if report_failed.is_some() {
            break StopReason::Requested("reporting failed");
        }
        tokio::select! {
            _ = &mut stdin_rx => break StopReason::Requested("stdin closed"),
            _ = sigterm.recv() => break StopReason::Requested("SIGTERM"),
            _ = sigint.recv() => break StopReason::Requested("SIGINT"),
            _ = sighup.recv() => break StopReason::Requested("SIGHUP"),
            Some(line) = cmd_rx.recv() => {
                // Supervision pauses while a command runs: a component it
                // restarts on purpose is not a failure.
                let reply = run_command(&line, &mut running, &mut info, &opts, &log).await;
                let text = serde_json::to_string(&reply).unwrap_or_default();
                let mut out = std::io::stdout().lock();
                if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush()) {
                    report_failed = Some(format!("cannot write to stdout: {e}"));
                }
            }
            _ = check.tick() => {
                if let Some((name, status)) = running.first_exited() {
                    break StopReason::ComponentExited(name, status);
                }
            }
        }
    };
    let mut failed = false;
    match &reason {
        StopReason::ComponentExited(name, status) => {
            failed = true;
            let msg = format!("{name} exited unexpectedly ({status}); stopping the cluster");
            log.error(&msg);
            let _ = write_file(&run_dir.join(FAILED_MARKER), &format!("{msg}\n"), false);
        }
        StopReason::Requested(why) => log.info(&format!("stopping ({why})")),
    }
    let t_stop = Instant::now();
    let clean = running.stop(opts.grace, &log).await;
    log.info(&format!("stopped in {} ms", t_stop.elapsed().as_millis()));
    failed |= !clean;

    let marked = run_dir.join(FAILED_MARKER).exists();
    if failed || marked || opts.keep || env_flag(KEEP_ENV) {
        let why = if failed {
            "a component failed"
        } else if marked {
            "a test failed"
        } else {
            "keep requested"
        };
        log.error(&format!("run dir kept ({why}): {} (logs in {})", run_dir.display(), info.log_dir.display()));
    } else {
        drop(log);
        if let Err(e) = std::fs::remove_dir_all(&run_dir) {
            let _ = writeln!(std::io::stderr(), "cluster: could not delete {}: {e}", run_dir.display());
        }
    }
    Ok(if failed { 1 } else { 0 })
}

// ---------------------------------------------------------------------------
// Handle
// ---------------------------------------------------------------------------

/// The `cluster` launcher binary: `$CSI_SIDECAR_CLUSTER_BIN`, else `cluster` next to
/// the running executable (tests run from `target/<profile>/deps/`; cargo builds
/// the package's binaries before its integration tests).
pub fn launcher_bin() -> PathBuf {
    if let Some(p) = std::env::var_os(BIN_ENV) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current executable");
    let candidates: Vec<PathBuf> = exe.ancestors().skip(1).take(2).map(|d| d.join("cluster")).collect();
    candidates.iter().find(|p| p.is_file()).cloned().unwrap_or_else(|| {
        panic!(
            "the `cluster` launcher is not built next to {}: run `cargo build -p csi-sidecar-integration` \
             (or set {BIN_ENV})",
            exe.display()
        )
    })
}

/// A thread forwarding the launcher's remaining stdout lines (it ends with the
/// launcher).
fn forward_lines(stdout: BufReader<std::process::ChildStdout>) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Run directories of live clusters in this process, marked failed by the panic hook.
static LIVE_RUNS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static HOOK: Once = Once::new();

fn mark_failed(run_dir: &Path, why: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(run_dir.join(FAILED_MARKER)) {
        let _ = writeln!(f, "{why}");
    }
}

/// Installs (once) a panic hook that marks every live run directory failed and
/// prints where its logs are, then calls the previous hook.
fn install_panic_hook() {
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("<unnamed>").to_string();
            let runs = LIVE_RUNS.lock().map(|r| r.clone()).unwrap_or_default();
            for run in &runs {
                mark_failed(run, &format!("thread '{thread}' panicked: {info}"));
                eprintln!("cluster logs (run dir kept): {}", run.join("logs").display());
            }
            prev(info);
        }));
    });
}

/// A running control plane owned by this process (see the module docs).
///
/// Dropping it (or [`ControlPlane::stop`]) closes the launcher's stdin and waits for
/// it to tear the cluster down; if the process dies instead, the kernel closes the
/// pipe and the launcher does the same.
pub struct ControlPlane {
    info: ClusterInfo,
    launcher: Mutex<Option<(Child, ChildStdin)>>,
    /// The launcher's stdout lines after the first (answers to commands).
    replies: Mutex<Option<std::sync::mpsc::Receiver<String>>>,
    /// One command at a time.
    commands: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane").field("info", &self.info).finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts a dedicated control plane (panics on failure, with the reason).
    pub fn start() -> ControlPlane {
        Self::try_start().unwrap_or_else(|e| panic!("starting the control plane failed: {e:#}"))
    }

    /// Starts a dedicated control plane: spawns `cluster serve --quiet` and waits for
    /// its JSON line (several seconds).
    pub fn try_start() -> Result<ControlPlane> {
        Self::spawn_launcher(&launcher_bin(), &[])
    }

    /// Starts `program serve --quiet <extra>` as the launcher.
    pub fn spawn_launcher(program: &Path, extra: &[&str]) -> Result<ControlPlane> {
        install_panic_hook();
        let mut child = Command::new(program)
            .args(["serve", "--quiet"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawn {}", program.display()))?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin pipe"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout pipe"))?;
        let mut line = String::new();
        let mut stdout = BufReader::new(stdout);
        let read = stdout.read_line(&mut line);
        let parsed: Result<ClusterInfo> = match read {
            Ok(0) | Err(_) => Err(anyhow!("the launcher exited without reporting (see its stderr above)")),
            Ok(_) => match serde_json::from_str::<ClusterInfo>(&line) {
                Ok(info) => Ok(info),
                Err(_) => {
                    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
                    Err(anyhow!(
                        "the launcher failed: {} (run dir kept: {})",
                        v["error"].as_str().unwrap_or(line.trim()),
                        v["run_dir"].as_str().unwrap_or("?")
                    ))
                }
            },
        };
        match parsed {
            Ok(info) => {
                if let Ok(mut runs) = LIVE_RUNS.lock() {
                    runs.push(info.run_dir.clone());
                }
                Ok(ControlPlane {
                    info,
                    launcher: Mutex::new(Some((child, stdin))),
                    replies: Mutex::new(Some(forward_lines(stdout))),
                    commands: tokio::sync::Mutex::new(()),
                })
            }
            Err(e) => {
                drop(stdin);
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// One control plane per test binary, started on first use and stopped when the
    /// process exits (through the stdin pipe, since statics are never dropped).
    ///
    /// With `$CSI_SIDECAR_CLUSTER_INFO` pointing at the `cluster.json` of a running
    /// cluster, that one is used instead (and left running).
    pub fn shared() -> &'static ControlPlane {
        // A failed start is remembered: the other tests fail fast with the same reason.
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        let shared = SHARED.get_or_init(|| match std::env::var_os(ATTACH_ENV) {
            Some(path) if !path.is_empty() => match ClusterInfo::read(Path::new(&path)) {
                Ok(info) => Ok(ControlPlane {
                    info,
                    launcher: Mutex::new(None),
                    replies: Mutex::new(None),
                    commands: tokio::sync::Mutex::new(()),
                }),
                Err(e) => Err(format!("{ATTACH_ENV}: {e:#}")),
            },
            _ => ControlPlane::try_start().map_err(|e| format!("{e:#}")),
        });
        match shared {
            Ok(cp) => cp,
            Err(e) => panic!("starting the shared control plane failed: {e}"),
        }
    }

    /// One control plane per test binary with the snapshot CRDs installed
    /// and the real snapshot-controller running (`cluster serve
    /// --snapshots`), started on first use. [`ControlPlane::shared`] has
    /// neither: there, the snapshot API is not installed.
    pub fn with_snapshots() -> &'static ControlPlane {
        static SNAPSHOTS: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        let cp = SNAPSHOTS.get_or_init(|| {
            ControlPlane::spawn_launcher(&launcher_bin(), &["--snapshots"]).map_err(|e| format!("{e:#}"))
        });
        match cp {
            Ok(cp) => cp,
            Err(e) => panic!("starting the control plane with snapshots failed: {e}"),
        }
    }

    /// What the launcher reported.
    pub fn info(&self) -> &ClusterInfo {
        &self.info
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.info.kubeconfig
    }

    /// An admin client (a new one per call: clients are bound to the tokio runtime
    /// that created them, and every `#[tokio::test]` has its own).
    pub async fn client(&self) -> kube::Client {
        client_from_kubeconfig(&self.info.kubeconfig).await.expect("admin client")
    }

    /// Mints a kubeconfig for `identity` under `<run_dir>/users/` (see [`mint_kubeconfig`]).
    pub fn mint(&self, identity: &Identity) -> PathBuf {
        self.info.mint(identity).unwrap_or_else(|e| panic!("minting a kubeconfig for {identity:?}: {e:#}"))
    }

    /// A client authenticated as `identity`.
    pub async fn client_as(&self, identity: &Identity) -> kube::Client {
        client_from_kubeconfig(&self.mint(identity)).await.expect("client")
    }

    /// Marks the run failed, so that its directory is kept.
    pub fn mark_failed(&self, why: &str) {
        mark_failed(&self.info.run_dir, why);
    }

    /// Restarts kube-apiserver (same flags, port and etcd) through the launcher
    /// and returns once it answers `/readyz` again. The launcher does not count
    /// this as a component failure. Clients keep working after reconnecting;
    /// watches end and are resumed or relisted by their clients. Not available
    /// for an attached cluster (`$CSI_SIDECAR_CLUSTER_INFO`).
    pub async fn restart_apiserver(&self) -> Result<Restarted> {
        let _one = self.commands.lock().await;
        self.send_command(LauncherCommand::RestartApiserver)?;
        match self.next_reply(Duration::from_secs(180)).await? {
            CommandReply::Restarted(r) => Ok(r),
            CommandReply::Error(e) => bail!("the launcher could not restart kube-apiserver: {e}"),
        }
    }

    fn send_command(&self, cmd: LauncherCommand) -> Result<()> {
        let mut guard = self.launcher.lock().map_err(|_| anyhow!("launcher lock poisoned"))?;
        let (_, stdin) = guard.as_mut().ok_or_else(|| anyhow!("no launcher owned by this process"))?;
        writeln!(stdin, "{}", cmd.line()).and_then(|()| stdin.flush()).context("write to the launcher's stdin")
    }

    /// Polls for the launcher's next stdout line without blocking the runtime.
    async fn next_reply(&self, timeout: Duration) -> Result<CommandReply> {
        use std::sync::mpsc::TryRecvError;
        let start = Instant::now();
        loop {
            let got = {
                let guard = self.replies.lock().map_err(|_| anyhow!("replies lock poisoned"))?;
                let rx = guard.as_ref().ok_or_else(|| anyhow!("no launcher owned by this process"))?;
                rx.try_recv()
            };
            match got {
                Ok(line) => {
                    return serde_json::from_str(&line).with_context(|| format!("the launcher answered {line:?}"));
                }
                Err(TryRecvError::Disconnected) => bail!("the launcher closed its stdout"),
                Err(TryRecvError::Empty) if start.elapsed() > timeout => {
                    bail!("the launcher did not answer within {timeout:?}")
                }
                Err(TryRecvError::Empty) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// The launcher's PID (None for an attached cluster).
    pub fn launcher_pid(&self) -> Option<u32> {
        self.launcher.lock().ok()?.as_ref().map(|(c, _)| c.id())
    }

    /// Closes the launcher's stdin and waits up to `timeout` for it to stop the
    /// cluster; SIGKILLs it after that. Returns its exit status (None if it had to
    /// be killed, or for an attached cluster).
    pub fn stop_within(&self, timeout: Duration) -> Option<ExitStatus> {
        let (mut child, stdin) = self.launcher.lock().ok()?.take()?;
        if let Ok(mut runs) = LIVE_RUNS.lock() {
            runs.retain(|r| r != &self.info.run_dir);
        }
        drop(stdin);
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("cluster: launcher {} did not stop within {timeout:?}; SIGKILL", child.id());
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// [`ControlPlane::stop_within`] 60 s.
    pub fn stop(self) -> Option<ExitStatus> {
        self.stop_within(Duration::from_secs(60))
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.mark_failed("dropped while panicking");
        }
        self.stop_within(Duration::from_secs(60));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities() {
        let sa = Identity::service_account("ns1", "reader");
        assert_eq!(sa.username(), "system:serviceaccount:ns1:reader");
        assert_eq!(sa.groups(), ["system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"]);
        assert_eq!(Identity::parse_service_account("ns1/reader").unwrap(), sa);
        assert_eq!(Identity::parse_service_account("system:serviceaccount:ns1:reader").unwrap(), sa);
        assert!(Identity::parse_service_account("reader").is_err());
        assert_eq!(sa.file_stem(), "sa-ns1-reader");
        assert_eq!(Identity::user("a:b", &["g"]).file_stem(), "user-a_b");
    }

    #[test]
    fn launcher_commands_parse_and_round_trip() {
        let cmd = LauncherCommand::RestartApiserver;
        assert_eq!(LauncherCommand::parse(cmd.line()), Ok(cmd));
        assert_eq!(LauncherCommand::parse("  restart   kube-apiserver "), Ok(cmd));
        assert!(LauncherCommand::parse("restart etcd").unwrap_err().contains("only kube-apiserver"));
        assert!(LauncherCommand::parse("stop").unwrap_err().contains("unknown command"));
        let reply = CommandReply::Restarted(Restarted { component: "kube-apiserver".into(), pid: 7, ms: 9 });
        let text = serde_json::to_string(&reply).unwrap();
        assert_eq!(text, r#"{"restarted":{"component":"kube-apiserver","pid":7,"ms":9}}"#);
        assert_eq!(serde_json::from_str::<CommandReply>(&text).unwrap(), reply);
        assert_eq!(serde_json::to_string(&CommandReply::Error("x".into())).unwrap(), r#"{"error":"x"}"#);
    }

    #[test]
    fn pki_and_minted_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        generate_pki(dir.path()).unwrap();
        for f in ["ca.crt", "ca.key", "client-ca.crt", "client-ca.key", "apiserver.crt", "sa.key"] {
            assert!(dir.path().join(f).is_file(), "{f}");
        }
        let out = dir.path().join("u.kubeconfig");
        write_kubeconfig(dir.path(), "https://127.0.0.1:1", &Identity::user("u", &["g1", "g2"]), &out).unwrap();
        let kc = kube::config::Kubeconfig::read_from(&out).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("csi-sidecar-itest"));
        assert_eq!(kc.auth_infos[0].name, "u");
        assert_eq!(pem_to_der(&std::fs::read_to_string(dir.path().join("ca.crt")).unwrap()).unwrap()[0], 0x30);
    }

    #[test]
    fn client_cert_carries_every_group() {
        let dir = tempfile::tempdir().unwrap();
        generate_pki(dir.path()).unwrap();
        let (pem, _) = issue_client_cert(dir.path(), &Identity::service_account("ns1", "x")).unwrap();
        let der = pem_to_der(&pem).unwrap();
        let has = |s: &str| der.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(has("system:serviceaccount:ns1:x"));
        assert!(has("system:serviceaccounts:ns1") && has("system:authenticated"));
        // One O= RDN per group: OID 2.5.4.10 three times.
        assert_eq!(der.windows(5).filter(|w| *w == [0x06, 0x03, 0x55, 0x04, 0x0a]).count(), 3);
    }
}
