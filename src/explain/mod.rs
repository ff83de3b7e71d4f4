//! `csi-sidecar explain pvc NAMESPACE/NAME` (and `volumeattachment NAME`,
//! `volumesnapshot NAMESPACE/NAME`): why an object is not done yet, from
//! the object and its events in the API and csi-sidecar's own state at its
//! debug endpoints. Exit status 0: done; 1: it waits; 2: bad input.

pub mod decide;
#[cfg(test)]
mod decide_tests;
pub mod endpoint;
mod read;

use decide::Verdict;

use crate::k8s::client::ClientError;

/// The usage text.
pub const USAGE: &str = "\
Usage: csi-sidecar explain KIND NAME [--endpoint ADDRESS]... [--kubeconfig PATH]

Says why a CSI object is not done yet, and what happens next.

  KIND      pvc (persistentvolumeclaim), volumeattachment (va), volumesnapshot (vs)
  NAME      NAMESPACE/NAME for pvc and volumesnapshot, NAME for volumeattachment

Options:
  --endpoint ADDRESS   csi-sidecar's HTTP endpoint, as in its --http-endpoint
                       (\":8080\") or a port-forward (\"127.0.0.1:8080\"); may be
                       repeated (one per container). Its /debug/objects must be
                       on (--enable-debug-endpoints).
  --kubeconfig PATH    kubeconfig (default $KUBECONFIG, else in-cluster)
  --help               this text

Exit status: 0 the object is done, 1 it waits, 2 bad input.
";

/// What `explain` was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The kind.
    pub kind: Kind,
    /// Its namespace (namespaced kinds).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// The debug endpoints (`host:port`).
    pub endpoints: Vec<String>,
    /// `--kubeconfig`.
    pub kubeconfig: Option<String>,
}

/// The kinds `explain` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// PersistentVolumeClaim.
    Claim,
    /// VolumeAttachment.
    Attachment,
    /// VolumeSnapshot.
    Snapshot,
}

impl Kind {
    /// The API kind.
    pub fn api_kind(self) -> &'static str {
        match self {
            Kind::Claim => "PersistentVolumeClaim",
            Kind::Attachment => "VolumeAttachment",
            Kind::Snapshot => "VolumeSnapshot",
        }
    }
}

/// What parsing the arguments gives: a request, or text and an exit status.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Explain this.
    Run(Request),
    /// Print this and exit with this status.
    Exit(u8, String),
}

/// Parses the arguments after `explain` (pure).
pub fn parse(args: &[String]) -> Parsed {
    let bad = |msg: String| Parsed::Exit(2, format!("csi-sidecar explain: {msg}\n\n{USAGE}"));
    let mut positional = Vec::new();
    let (mut endpoints, mut kubeconfig) = (Vec::new(), None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--help" || a == "-h" {
            return Parsed::Exit(0, USAGE.to_string());
        }
        let Some(flag) = a.strip_prefix("--").or_else(|| a.strip_prefix('-').filter(|f| f.len() > 1)) else {
            positional.push(a.clone());
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        let value = match inline.or_else(|| it.next().cloned()) {
            Some(v) => v,
            None => return bad(format!("flag --{name} needs a value")),
        };
        match name {
            "endpoint" => match endpoint::address(&value) {
                Ok(a) => endpoints.push(a),
                Err(e) => return bad(e.to_string()),
            },
            "kubeconfig" => kubeconfig = Some(value),
            other => return bad(format!("unknown flag --{other}")),
        }
    }
    let [kind, name] = positional.as_slice() else {
        return bad(format!("want KIND and NAME, got {} arguments", positional.len()));
    };
    let kind = match crate::debug::query::kind_of(kind).as_str() {
        "PersistentVolumeClaim" => Kind::Claim,
        "VolumeAttachment" => Kind::Attachment,
        "VolumeSnapshot" => Kind::Snapshot,
        _ => return bad(format!("unknown kind {kind:?}: want pvc, volumeattachment or volumesnapshot")),
    };
    let (namespace, name) = match (kind, name.split_once('/')) {
        (Kind::Attachment, None) => (None, name.clone()),
        (Kind::Attachment, Some(_)) => return bad(format!("a VolumeAttachment has no namespace: {name:?}")),
        (_, Some((ns, n))) if !ns.is_empty() && !n.is_empty() && !n.contains('/') => {
            (Some(ns.to_string()), n.to_string())
        }
        _ => return bad(format!("want NAMESPACE/NAME for a {}, got {name:?}", kind.api_kind())),
    };
    Parsed::Run(Request { kind, namespace, name, endpoints, kubeconfig })
}

/// The printed answer: a first line with the object and its state, then
/// one line per reason.
pub fn render(req: &Request, v: &Verdict) -> String {
    let object = match &req.namespace {
        Some(ns) => format!("{} {ns}/{}", req.kind.api_kind(), req.name),
        None => format!("{} {}", req.kind.api_kind(), req.name),
    };
    let state = if v.done { "done" } else { "waiting" };
    let mut out = format!("{object}: {state}\n");
    for l in &v.lines {
        out.push_str(&format!("  - {l}\n"));
    }
    out
}

/// Runs `explain` (the arguments after it); returns the exit status.
pub fn main(args: &[String]) -> u8 {
    let req = match parse(args) {
        Parsed::Run(r) => r,
        Parsed::Exit(code, text) => {
            if code == 0 {
                print!("{text}");
            } else {
                eprint!("{text}");
            }
            return code;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("csi-sidecar explain: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(explain(&req)) {
        Ok(v) => {
            print!("{}", render(&req, &v));
            v.exit_code()
        }
        Err(e @ (ExplainError::NotFound(_) | ExplainError::Client(ClientError::Kubeconfig { .. }))) => {
            eprintln!("csi-sidecar explain: {e}");
            2
        }
        Err(e) => {
            eprintln!("csi-sidecar explain: {e}");
            1
        }
    }
}

/// Why `explain` could not answer.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// No client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The object does not exist.
    #[error(transparent)]
    NotFound(read::ReadError),
    /// A read failed.
    #[error(transparent)]
    Read(read::ReadError),
}

impl From<read::ReadError> for ExplainError {
    fn from(e: read::ReadError) -> Self {
        match e {
            e @ read::ReadError::NotFound { .. } => ExplainError::NotFound(e),
            e => ExplainError::Read(e),
        }
    }
}

/// Reads what is needed and decides.
pub async fn explain(req: &Request) -> Result<Verdict, ExplainError> {
    // --kubeconfig wins over $KUBECONFIG, as kubectl's does.
    let config = match req.kubeconfig.as_deref() {
        Some(path) => crate::k8s::client::load_config(Some(path), false).await?,
        None => crate::k8s::client::load_config(None, true).await?,
    };
    let client = crate::k8s::client::build_unlimited(config)?;
    let ns = req.namespace.as_deref().unwrap_or_default();
    Ok(match req.kind {
        Kind::Claim => {
            let (claim, class) = read::claim(&client, ns, &req.name).await?;
            let events = read::events(&client, &[(Some(ns), "PersistentVolumeClaim", &req.name)]).await;
            let sidecar = read::sidecar(&req.endpoints, "PersistentVolumeClaim", Some(ns), &req.name).await;
            decide::claim(&claim, &class, &sidecar, &events)
        }
        Kind::Attachment => {
            let a = read::attachment(&client, &req.name).await?;
            let events = read::events(&client, &[(None, "VolumeAttachment", &req.name)]).await;
            let sidecar = read::sidecar(&req.endpoints, "VolumeAttachment", None, &req.name).await;
            decide::attachment(&a, &sidecar, &events)
        }
        Kind::Snapshot => {
            let s = read::snapshot(&client, ns, &req.name).await?;
            let mut subjects = vec![(Some(ns), "VolumeSnapshot", req.name.as_str())];
            let sidecar = match &s.content {
                Some(c) => {
                    subjects.push((None, "VolumeSnapshotContent", c));
                    read::sidecar(&req.endpoints, "VolumeSnapshotContent", None, c).await
                }
                None => read::sidecar(&req.endpoints, "VolumeSnapshot", Some(ns), &req.name).await,
            };
            // The snapshot's and its content's events, newest first together.
            let events = read::events(&client, &subjects).await;
            decide::snapshot(&s, &sidecar, &events)
        }
    })
}
