//! Why the driver socket could not be dialled, in words a user can act on.
//!
//! A failed `connect(2)` says only "Permission denied" or "No such file or
//! directory". [`explain`] (pure) adds what the file system shows: the
//! socket's type, mode and owner, which directory of the path is missing or
//! not searchable, and the process's user and groups. [`dial_error`] is the
//! thin I/O wrapper that looks at the path and wraps the error.

use std::{
    io,
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::{Path, PathBuf},
};

/// The longest unix socket path Linux accepts (`sun_path` is 108 bytes, one
/// of them the terminating NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// A file's type as `ls -l` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A unix socket.
    Socket,
    /// A directory.
    Directory,
    /// A regular file.
    Regular,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
}

impl FileKind {
    /// The type letter of `ls -l`.
    fn letter(self) -> char {
        match self {
            FileKind::Socket => 's',
            FileKind::Directory => 'd',
            FileKind::Regular => '-',
            FileKind::Symlink => 'l',
            FileKind::Fifo => 'p',
            FileKind::CharDevice => 'c',
            FileKind::BlockDevice => 'b',
        }
    }

    /// The type in words, with its article.
    fn words(self) -> &'static str {
        match self {
            FileKind::Socket => "a socket",
            FileKind::Directory => "a directory",
            FileKind::Regular => "a regular file",
            FileKind::Symlink => "a symbolic link",
            FileKind::Fifo => "a named pipe",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
        }
    }
}

/// What `stat` shows about one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileFacts {
    /// Its type.
    pub kind: FileKind,
    /// Permission bits, with setuid, setgid and sticky (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

impl FileFacts {
    /// `srwxr-xr-x`, as `ls -l` prints it.
    pub fn mode_string(&self) -> String {
        let m = self.mode;
        let bit = |mask: u32, c: char| if m & mask != 0 { c } else { '-' };
        // The execute position also shows setuid/setgid/sticky.
        let exec = |x: u32, special: u32, set: char, unset: char| match (m & x != 0, m & special != 0) {
            (true, true) => set,
            (false, true) => unset,
            (true, false) => 'x',
            (false, false) => '-',
        };
        [
            self.kind.letter(),
            bit(0o400, 'r'),
            bit(0o200, 'w'),
            exec(0o100, 0o4000, 's', 'S'),
            bit(0o040, 'r'),
            bit(0o020, 'w'),
            exec(0o010, 0o2000, 's', 'S'),
            bit(0o004, 'r'),
            bit(0o002, 'w'),
            exec(0o001, 0o1000, 't', 'T'),
        ]
        .iter()
        .collect()
    }

    /// `srwxr-xr-x owned by 0:0`.
    fn described(&self) -> String {
        format!("{} owned by {}:{}", self.mode_string(), self.uid, self.gid)
    }
}

/// The user and groups the kernel checks file permissions against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Effective user ID.
    pub uid: u32,
    /// Effective group ID.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid {} gid {} ", self.uid, self.gid)?;
        if self.groups.is_empty() {
            return f.write_str("(no supplementary groups)");
        }
        let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        write!(f, "(groups {})", groups.join(","))
    }
}

/// A permission one needs on a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `x` on a directory: to reach what is in it.
    Search,
    /// `w` on a socket: to connect to it.
    Write,
}

/// Whether the mode bits grant `access` to `who`: the owner's bits for the
/// owner, else the group's for a member, else the others'. Capabilities
/// (root's `CAP_DAC_OVERRIDE`) are left out: this only runs after the
/// kernel said no.
pub fn permits(file: &FileFacts, who: &Identity, access: Access) -> bool {
    let bit = match access {
        Access::Search => 0o1,
        Access::Write => 0o2,
    };
    let shift = if who.uid == file.uid {
        6
    } else if who.gid == file.gid || who.groups.contains(&file.gid) {
        3
    } else {
        0
    };
    file.mode & (bit << shift) != 0
}

/// What `stat` said about one path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stat {
    /// It exists.
    Found(FileFacts),
    /// `ENOENT`.
    Missing,
    /// Any other failure.
    Failed(io::ErrorKind),
}

/// Everything [`explain`] looks at besides the error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The socket path as configured.
    pub path: PathBuf,
    /// Each directory leading to the socket, from the root down, with what
    /// `stat` (following links) said about it.
    pub directories: Vec<(PathBuf, Stat)>,
    /// `stat` of the socket, following links.
    pub socket: Stat,
    /// `lstat` of the socket: tells a dangling symbolic link from a missing file.
    pub link: Stat,
    /// The process's user and groups.
    pub identity: Identity,
}

/// The message for a failed connect to the driver socket (pure).
pub fn explain(error: &io::Error, obs: &Observation) -> String {
    let prefix = format!("cannot connect to the CSI driver socket {}", obs.path.display());
    let denied = error.kind() == io::ErrorKind::PermissionDenied;
    let who = &obs.identity;
    let length = obs.path.as_os_str().len();
    if error.kind() == io::ErrorKind::InvalidInput && length > MAX_SOCKET_PATH {
        return format!(
            "{prefix}: the path is {length} bytes long, and a unix socket path can have at most {MAX_SOCKET_PATH}"
        );
    }
    for (dir, stat) in &obs.directories {
        match stat {
            Stat::Found(f) if f.kind != FileKind::Directory => {
                return format!(
                    "{prefix}: {} is {} ({}), not a directory",
                    dir.display(),
                    f.kind.words(),
                    f.described()
                );
            }
            Stat::Found(f) if denied && !permits(f, who, Access::Search) => {
                return format!(
                    "{prefix}: permission denied: the directory {} is {} and csi-sidecar runs as {who}; it needs search (x) permission on every directory of the path (make the directory searchable for a group csi-sidecar is in, or run csi-sidecar as its owner)",
                    dir.display(),
                    f.described(),
                );
            }
            Stat::Missing => {
                return format!(
                    "{prefix}: the socket does not exist, nor does the directory {} (is the volume with the driver's socket mounted there in both containers?)",
                    dir.display()
                );
            }
            _ => {}
        }
    }
    let parent = obs.directories.last().map(|(d, _)| d.display().to_string()).unwrap_or_else(|| ".".into());
    match (&obs.socket, &obs.link) {
        (Stat::Missing, Stat::Found(l)) if l.kind == FileKind::Symlink => {
            format!("{prefix}: it is a symbolic link to a file that does not exist")
        }
        (Stat::Missing, _) => format!(
            "{prefix}: the socket does not exist; its directory {parent} does (the driver has not created its socket yet, or creates it at another path)"
        ),
        (Stat::Found(f), _) if f.kind != FileKind::Socket => {
            format!("{prefix}: it is {} ({}), not a socket", f.kind.words(), f.described())
        }
        (Stat::Found(f), _) if denied && !permits(f, who, Access::Write) => format!(
            "{prefix}: permission denied: the socket is {} and csi-sidecar runs as {who}; it needs write permission on the socket (make the driver create it group-writable for a group csi-sidecar is in, e.g. the chart's driver.socketUmask with fsGroup, or run csi-sidecar as the socket's owner)",
            f.described()
        ),
        (Stat::Found(f), _) if denied => format!(
            "{prefix}: permission denied, although the socket is {} and csi-sidecar runs as {who}, which the modes allow: an access control list or a security module (SELinux, AppArmor) denies it",
            f.described()
        ),
        (Stat::Found(f), _) if error.kind() == io::ErrorKind::ConnectionRefused => format!(
            "{prefix}: connection refused: the socket file exists ({}) but nothing listens on it (the driver exited or has not started serving yet)",
            f.described()
        ),
        (Stat::Found(f), _) => {
            format!("{prefix}: {error} (the socket is {}; csi-sidecar runs as {who})", f.described())
        }
        (Stat::Failed(_), _) if denied => format!("{prefix}: permission denied; csi-sidecar runs as {who}"),
        (Stat::Failed(_), _) => format!("{prefix}: {error}"),
    }
}

/// The directories leading to `path`, from the root down (relative paths
/// from `.`).
fn directories(path: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = path
        .ancestors()
        .skip(1)
        .map(|d| if d.as_os_str().is_empty() { PathBuf::from(".") } else { d.to_path_buf() })
        .collect();
    dirs.reverse();
    dirs
}

fn facts(m: &std::fs::Metadata) -> FileFacts {
    let t = m.file_type();
    let kind = if t.is_socket() {
        FileKind::Socket
    } else if t.is_dir() {
        FileKind::Directory
    } else if t.is_symlink() {
        FileKind::Symlink
    } else if t.is_fifo() {
        FileKind::Fifo
    } else if t.is_char_device() {
        FileKind::CharDevice
    } else if t.is_block_device() {
        FileKind::BlockDevice
    } else {
        FileKind::Regular
    };
    FileFacts { kind, mode: m.mode() & 0o7777, uid: m.uid(), gid: m.gid() }
}

fn stat(m: io::Result<std::fs::Metadata>) -> Stat {
    match m {
        Ok(m) => Stat::Found(facts(&m)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Stat::Missing,
        Err(e) => Stat::Failed(e.kind()),
    }
}

/// The process's effective user and groups.
pub fn identity() -> Identity {
    use nix::unistd::{getegid, geteuid, getgroups};
    Identity {
        uid: geteuid().as_raw(),
        gid: getegid().as_raw(),
        groups: getgroups().map(|g| g.into_iter().map(|g| g.as_raw()).collect()).unwrap_or_default(),
    }
}

/// Looks at `path`, its directories and the process (I/O).
pub fn observe(path: &Path) -> Observation {
    Observation {
        path: path.to_path_buf(),
        directories: directories(path).into_iter().map(|d| (d.clone(), stat(std::fs::metadata(&d)))).collect(),
        socket: stat(std::fs::metadata(path)),
        link: stat(std::fs::symlink_metadata(path)),
        identity: identity(),
    }
}

/// A failed connect, explained: its `Display` is [`explain`]'s message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct DialError {
    /// The explanation.
    pub message: String,
    /// The error of `connect` (or `stat`).
    #[source]
    pub source: io::Error,
}

/// `error` (of dialling `path`) as an error of the same kind that explains
/// itself.
pub fn dial_error(path: &Path, error: io::Error) -> io::Error {
    let message = explain(&error, &observe(path));
    io::Error::new(error.kind(), DialError { message, source: error })
}

#[cfg(test)]
#[path = "dial_error_tests.rs"]
mod tests;
