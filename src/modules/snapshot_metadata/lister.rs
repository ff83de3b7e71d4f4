//! `csi-sidecar snapshot-metadata allocated|delta NAMESPACE/SNAPSHOT`: what
//! upstream's `snapshot-metadata-lister` does, the quickest check of a
//! deployment. It reads the snapshot's driver and that driver's
//! SnapshotMetadataService, takes a token of a ServiceAccount for the
//! service's audience, dials the server with the service's CA and prints
//! each block as `<byte offset> <size>`, one per line.

use argh::FromArgs;
use tonic::Status;

use super::{api, client};

/// csi-sidecar snapshot-metadata allocated|delta: list a snapshot's
/// allocated blocks, or the blocks changed since a base snapshot, through
/// the deployment's SnapshotMetadata server (as a backup application).
#[derive(FromArgs, Debug, PartialEq)]
struct ListerArgs {
    /// the snapshot: NAMESPACE/NAME
    #[argh(positional)]
    snapshot: String,
    /// delta: the base snapshot, a VolumeSnapshot name in the same namespace or a CSI snapshot handle
    #[argh(option)]
    base: Option<String>,
    /// the ServiceAccount whose token is sent: NAMESPACE/NAME (default: the snapshot's namespace's `default`)
    #[argh(option)]
    service_account: Option<String>,
    /// path to a kubeconfig (default: $KUBECONFIG, ~/.kube/config, else in-cluster)
    #[argh(option)]
    kubeconfig: Option<String>,
    /// the first byte offset to list (default 0)
    #[argh(option, default = "0")]
    starting_offset: i64,
    /// blocks per response; 0: the driver's choice (default 0)
    #[argh(option, default = "0")]
    max_results: i32,
}

/// Which call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Allocated,
    Delta,
}

/// The row's tool: `None` when `args` are not the tool's (the module's own
/// command line), else its exit status.
pub fn tool(args: &[String]) -> Option<u8> {
    let call = match args.first().map(String::as_str) {
        Some("allocated") => Call::Allocated,
        Some("delta") => Call::Delta,
        _ => return None,
    };
    let command = format!("csi-sidecar snapshot-metadata {}", args[0]);
    let rest: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    let parsed = match ListerArgs::from_args(&[&command], &rest) {
        Ok(p) => p,
        Err(exit) => {
            let ok = exit.status.is_ok();
            if ok {
                print!("{}", exit.output);
            } else {
                eprint!("{}", exit.output);
            }
            return Some(if ok { 0 } else { 2 });
        }
    };
    let usage = |m: &str| {
        eprintln!("{command}: {m}");
        Some(2)
    };
    let Some((namespace, name)) = parsed.snapshot.split_once('/') else {
        return usage("the snapshot is NAMESPACE/NAME");
    };
    if call == Call::Delta && parsed.base.is_none() {
        return usage("delta needs --base");
    }
    let account = parsed.service_account.clone().unwrap_or_else(|| format!("{namespace}/default"));
    let Some((sa_ns, sa_name)) = account.split_once('/') else {
        return usage("--service-account is NAMESPACE/NAME");
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{command}: cannot start the async runtime: {e}");
            return Some(1);
        }
    };
    let listed = runtime.block_on(list(call, &parsed, (namespace, name), (sa_ns, sa_name)));
    match listed {
        Ok(()) => Some(0),
        Err(e) => {
            eprintln!("{command}: {e}");
            Some(1)
        }
    }
}

/// Why listing failed.
#[derive(Debug, thiserror::Error)]
enum ListError {
    #[error(transparent)]
    Kube(#[from] crate::k8s::client::ClientError),
    #[error(transparent)]
    Client(#[from] client::ClientError),
    #[error("the server answered {}: {}", .0.code(), .0.message())]
    Status(#[from] Status),
}

async fn list(
    call: Call,
    args: &ListerArgs,
    (namespace, name): (&str, &str),
    (sa_ns, sa_name): (&str, &str),
) -> Result<(), ListError> {
    let config = crate::k8s::client::load_config(args.kubeconfig.as_deref(), true).await?;
    let kube = crate::k8s::client::build_unlimited(config)?;
    let driver = client::driver_of(&kube, namespace, name).await?;
    let service = client::service_of(&kube, &driver).await?;
    let ca = service.spec.ca_cert.as_ref().map(|c| c.0.clone()).unwrap_or_default();
    let token = client::token_for(&kube, sa_ns, sa_name, &service.spec.audience).await?;
    let mut server = client::connect(&service.spec.address, &ca).await?;
    let print = |records: &[api::BlockMetadata]| {
        for b in records {
            println!("{} {}", b.byte_offset, b.size_bytes);
        }
    };
    match call {
        Call::Allocated => {
            let req = api::GetMetadataAllocatedRequest {
                security_token: token,
                namespace: namespace.to_string(),
                snapshot_name: name.to_string(),
                starting_offset: args.starting_offset,
                max_results: args.max_results,
            };
            let mut stream = server.get_metadata_allocated(req).await?.into_inner();
            while let Some(r) = stream.message().await? {
                print(&r.block_metadata);
            }
        }
        Call::Delta => {
            let req = api::GetMetadataDeltaRequest {
                security_token: token,
                namespace: namespace.to_string(),
                base_snapshot_id: args.base.clone().unwrap_or_default(),
                target_snapshot_name: name.to_string(),
                starting_offset: args.starting_offset,
                max_results: args.max_results,
            };
            let mut stream = server.get_metadata_delta(req).await?.into_inner();
            while let Some(r) = stream.message().await? {
                print(&r.block_metadata);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Option<u8> {
        tool(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    /// The module's own command line is not the tool's; the tool's bad
    /// input exits 2 before any I/O.
    #[test]
    fn the_tool_takes_allocated_and_delta_only_and_refuses_bad_input_with_2() {
        assert_eq!(run(&[]), None);
        assert_eq!(run(&["--port=6443"]), None);
        assert_eq!(run(&["allocated"]), Some(2), "no snapshot");
        assert_eq!(run(&["allocated", "no-namespace"]), Some(2));
        assert_eq!(run(&["delta", "ns/snap"]), Some(2), "no --base");
        assert_eq!(run(&["allocated", "ns/snap", "--service-account", "nobody"]), Some(2));
        assert_eq!(run(&["allocated", "--help"]), Some(0));
    }
}
