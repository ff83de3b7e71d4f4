use std::os::unix::net::UnixListener;

use nix::errno::Errno;

use super::*;

fn os(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

fn dir(mode: u32, uid: u32, gid: u32) -> Stat {
    Stat::Found(FileFacts { kind: FileKind::Directory, mode, uid, gid })
}

fn sock(mode: u32, uid: u32, gid: u32) -> Stat {
    Stat::Found(FileFacts { kind: FileKind::Socket, mode, uid, gid })
}

fn sidecar() -> Identity {
    Identity { uid: 65532, gid: 65532, groups: vec![65532] }
}

/// `/csi/csi.sock` with `/` and `/csi` root-owned 0755 and the socket as given.
fn at_csi(socket: Stat) -> Observation {
    Observation {
        path: PathBuf::from("/csi/csi.sock"),
        directories: vec![(PathBuf::from("/"), dir(0o755, 0, 0)), (PathBuf::from("/csi"), dir(0o755, 0, 0))],
        link: socket.clone(),
        socket,
        identity: sidecar(),
    }
}

const PREFIX: &str = "cannot connect to the CSI driver socket /csi/csi.sock: ";

#[test]
fn messages() {
    let with = |f: &dyn Fn(&mut Observation), socket: Stat| {
        let mut o = at_csi(socket);
        f(&mut o);
        o
    };
    let same = |_: &mut Observation| {};
    let table: Vec<(&str, io::Error, Observation, &str)> = vec![
        (
            "root's socket, non-root sidecar",
            os(Errno::EACCES),
            at_csi(sock(0o755, 0, 0)),
            "permission denied: the socket is srwxr-xr-x owned by 0:0 and csi-sidecar runs as uid 65532 gid 65532 (groups 65532); it needs write permission on the socket (make the driver create it group-writable for a group csi-sidecar is in, e.g. the chart's driver.socketUmask with fsGroup, or run csi-sidecar as the socket's owner)",
        ),
        (
            "group-writable, but not for a group of the sidecar",
            os(Errno::EACCES),
            with(&|o| o.identity.groups.clear(), sock(0o775, 0, 1000)),
            "permission denied: the socket is srwxrwxr-x owned by 0:1000 and csi-sidecar runs as uid 65532 gid 65532 (no supplementary groups); it needs write permission on the socket (make the driver create it group-writable for a group csi-sidecar is in, e.g. the chart's driver.socketUmask with fsGroup, or run csi-sidecar as the socket's owner)",
        ),
        (
            "the owner's bits count for the owner even where others may write",
            os(Errno::EACCES),
            at_csi(sock(0o557, 65532, 0)),
            "permission denied: the socket is sr-xr-xrwx owned by 65532:0 and csi-sidecar runs as uid 65532 gid 65532 (groups 65532); it needs write permission on the socket (make the driver create it group-writable for a group csi-sidecar is in, e.g. the chart's driver.socketUmask with fsGroup, or run csi-sidecar as the socket's owner)",
        ),
        (
            "the modes allow it: something else denies",
            os(Errno::EACCES),
            at_csi(sock(0o770, 0, 65532)),
            "permission denied, although the socket is srwxrwx--- owned by 0:65532 and csi-sidecar runs as uid 65532 gid 65532 (groups 65532), which the modes allow: an access control list or a security module (SELinux, AppArmor) denies it",
        ),
        (
            "a directory on the path is not searchable",
            os(Errno::EACCES),
            with(&|o| o.directories[1].1 = dir(0o2750, 0, 0), Stat::Failed(io::ErrorKind::PermissionDenied)),
            "permission denied: the directory /csi is drwxr-s--- owned by 0:0 and csi-sidecar runs as uid 65532 gid 65532 (groups 65532); it needs search (x) permission on every directory of the path (make the directory searchable for a group csi-sidecar is in, or run csi-sidecar as its owner)",
        ),
        (
            "the first blocking directory is named, not a later one",
            os(Errno::EACCES),
            with(
                &|o| {
                    o.directories[0].1 = dir(0o700, 0, 0);
                    o.directories[1].1 = Stat::Failed(io::ErrorKind::PermissionDenied);
                },
                Stat::Failed(io::ErrorKind::PermissionDenied),
            ),
            "permission denied: the directory / is drwx------ owned by 0:0 and csi-sidecar runs as uid 65532 gid 65532 (groups 65532); it needs search (x) permission on every directory of the path (make the directory searchable for a group csi-sidecar is in, or run csi-sidecar as its owner)",
        ),
        (
            "denied with nothing to show",
            os(Errno::EACCES),
            at_csi(Stat::Failed(io::ErrorKind::PermissionDenied)),
            "permission denied; csi-sidecar runs as uid 65532 gid 65532 (groups 65532)",
        ),
        (
            "socket missing, directory present",
            os(Errno::ENOENT),
            at_csi(Stat::Missing),
            "the socket does not exist; its directory /csi does (the driver has not created its socket yet, or creates it at another path)",
        ),
        (
            "socket and directory missing",
            os(Errno::ENOENT),
            with(&|o| o.directories[1].1 = Stat::Missing, Stat::Missing),
            "the socket does not exist, nor does the directory /csi (is the volume with the driver's socket mounted there in both containers?)",
        ),
        (
            "a dangling symbolic link",
            os(Errno::ENOENT),
            with(
                &|o| o.link = Stat::Found(FileFacts { kind: FileKind::Symlink, mode: 0o777, uid: 0, gid: 0 }),
                Stat::Missing,
            ),
            "it is a symbolic link to a file that does not exist",
        ),
        (
            "a regular file",
            os(Errno::ECONNREFUSED),
            at_csi(Stat::Found(FileFacts { kind: FileKind::Regular, mode: 0o644, uid: 0, gid: 0 })),
            "it is a regular file (-rw-r--r-- owned by 0:0), not a socket",
        ),
        (
            "a directory",
            os(Errno::ECONNREFUSED),
            at_csi(dir(0o1777, 0, 0)),
            "it is a directory (drwxrwxrwt owned by 0:0), not a socket",
        ),
        (
            "a file where a directory should be",
            os(Errno::ENOTDIR),
            with(
                &|o| {
                    o.directories[1].1 = Stat::Found(FileFacts { kind: FileKind::Regular, mode: 0o600, uid: 0, gid: 0 })
                },
                Stat::Failed(io::ErrorKind::NotADirectory),
            ),
            "/csi is a regular file (-rw------- owned by 0:0), not a directory",
        ),
        (
            "nobody listens",
            os(Errno::ECONNREFUSED),
            at_csi(sock(0o755, 0, 0)),
            "connection refused: the socket file exists (srwxr-xr-x owned by 0:0) but nothing listens on it (the driver exited or has not started serving yet)",
        ),
        (
            "anything else",
            os(Errno::EAGAIN),
            with(&same, sock(0o777, 0, 0)),
            "Resource temporarily unavailable (os error 11) (the socket is srwxrwxrwx owned by 0:0; csi-sidecar runs as uid 65532 gid 65532 (groups 65532))",
        ),
    ];
    for (name, error, obs, want) in table {
        assert_eq!(explain(&error, &obs), format!("{PREFIX}{want}"), "{name}");
    }
}

#[test]
fn a_path_too_long_for_a_socket_says_so() {
    let long = format!("/{}/csi.sock", "d".repeat(120));
    let mut obs = at_csi(Stat::Missing);
    obs.path = PathBuf::from(&long);
    let error = io::Error::new(io::ErrorKind::InvalidInput, "path must be shorter than SUN_LEN");
    assert_eq!(
        explain(&error, &obs),
        format!(
            "cannot connect to the CSI driver socket {long}: the path is 130 bytes long, and a unix socket path can have at most 107"
        )
    );
}

#[test]
fn mode_strings_match_ls() {
    let table = [
        (FileKind::Socket, 0o755, "srwxr-xr-x"),
        (FileKind::Socket, 0o660, "srw-rw----"),
        (FileKind::Directory, 0o2775, "drwxrwsr-x"),
        (FileKind::Directory, 0o2760, "drwxrwS---"),
        (FileKind::Directory, 0o1777, "drwxrwxrwt"),
        (FileKind::Directory, 0o1776, "drwxrwxrwT"),
        (FileKind::Regular, 0o4755, "-rwsr-xr-x"),
        (FileKind::Regular, 0o4644, "-rwSr--r--"),
        (FileKind::Fifo, 0o600, "prw-------"),
        (FileKind::CharDevice, 0o666, "crw-rw-rw-"),
        (FileKind::BlockDevice, 0o660, "brw-rw----"),
        (FileKind::Symlink, 0o777, "lrwxrwxrwx"),
        (FileKind::Regular, 0, "----------"),
    ];
    for (kind, mode, want) in table {
        assert_eq!(FileFacts { kind, mode, uid: 0, gid: 0 }.mode_string(), want, "{mode:o}");
    }
}

#[test]
fn permission_classes() {
    let file = |mode, uid, gid| FileFacts { kind: FileKind::Socket, mode, uid, gid };
    let me = Identity { uid: 10, gid: 20, groups: vec![30] };
    let table = [
        (file(0o200, 10, 0), Access::Write, true),
        (file(0o022, 10, 20), Access::Write, false),
        (file(0o020, 0, 20), Access::Write, true),
        (file(0o020, 0, 30), Access::Write, true),
        (file(0o002, 0, 30), Access::Write, false),
        (file(0o002, 0, 40), Access::Write, true),
        (file(0o001, 0, 40), Access::Search, true),
        (file(0o776, 0, 40), Access::Search, false),
        (file(0o010, 0, 20), Access::Search, true),
        (file(0o100, 10, 20), Access::Search, true),
    ];
    for (f, access, want) in table {
        assert_eq!(permits(&f, &me, access), want, "{f:?} {access:?}");
    }
}

#[test]
fn directories_of_a_path() {
    let dirs = |p: &str| directories(Path::new(p));
    assert_eq!(dirs("/csi/csi.sock"), [PathBuf::from("/"), PathBuf::from("/csi")]);
    assert_eq!(dirs("/a/b/c.sock"), [PathBuf::from("/"), PathBuf::from("/a"), PathBuf::from("/a/b")]);
    assert_eq!(dirs("csi.sock"), [PathBuf::from(".")]);
    assert_eq!(dirs("run/csi.sock"), [PathBuf::from("."), PathBuf::from("run")]);
}

/// The I/O wrapper on real files (as root the permission cases cannot be
/// produced here; the prober's integration test runs csi-sidecar as another user).
#[test]
fn observe_reads_the_file_system() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("csi.sock");
    let missing = observe(&path);
    assert_eq!(missing.socket, Stat::Missing);
    assert!(
        matches!(missing.directories.last(), Some((d, Stat::Found(f))) if d == tmp.path() && f.kind == FileKind::Directory)
    );
    assert_eq!(missing.identity, identity());

    let _listener = UnixListener::bind(&path).expect("bind");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o751)).expect("chmod");
    let present = observe(&path);
    let Stat::Found(f) = present.socket else { panic!("{present:?}") };
    assert_eq!((f.kind, f.mode_string()), (FileKind::Socket, "srwxr-x--x".to_string()));
    assert_eq!(f.uid, identity().uid);

    let e = dial_error(&path, os(Errno::EACCES));
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    let message = e.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("srwxr-x--x"), "{message}");
}
