//! Loopback TCP ports handed out by number to processes the tests start
//! (etcd, kube-apiserver, a sidecar's `--http-endpoint`): a port is picked
//! here, released, and bound later by another process, so it must not be
//! picked by anyone else in between. Each process picking ports (a test
//! binary, a `cluster serve` launcher) claims its own block of ports below
//! the kernel's ephemeral range (so no `bind(0)` or outgoing connection gets
//! one), held by an exclusive lock on a file in the temporary directory for
//! as long as the process lives, and walks through it; a port found bound
//! is skipped. Test binaries running at the same time (integration/scripts/
//! test.sh runs several) then never pick the same port. Without a block (the
//! lock directory cannot be made, every block is taken, or the ephemeral
//! range leaves no room below it) a port comes from `bind(0)` as before.

use std::{
    fs::File,
    io,
    net::{Ipv4Addr, TcpListener},
    path::PathBuf,
    sync::{
        OnceLock,
        atomic::{AtomicU32, Ordering},
    },
};

/// The first port of the first block.
const FIRST_PORT: u32 = 20_000;
/// Ports per block (a test binary or a launcher picks a few dozen at most).
const BLOCK_PORTS: u32 = 256;
/// The ephemeral range's start when `/proc` does not say (Linux's default).
const DEFAULT_EPHEMERAL_LOW: u32 = 32_768;

/// The block this process claimed.
struct Block {
    /// Held (locked) for the life of the process; the kernel drops the lock
    /// when the process ends, however it ends.
    _lock: File,
    first: u32,
    next: AtomicU32,
}

static BLOCK: OnceLock<Option<Block>> = OnceLock::new();

/// The directory of the blocks' lock files.
fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("csi-sidecar-ports")
}

/// The first port of the kernel's ephemeral range.
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        .unwrap_or(DEFAULT_EPHEMERAL_LOW)
}

/// How many whole blocks fit between [`FIRST_PORT`] and `ephemeral_low`.
fn block_count(ephemeral_low: u32) -> u32 {
    ephemeral_low.min(65_536).saturating_sub(FIRST_PORT) / BLOCK_PORTS
}

/// Claims the first free block, starting at one that depends on the process
/// ID (so a process rarely takes the block that one just ended left).
fn claim() -> Option<Block> {
    let count = block_count(ephemeral_low());
    if count == 0 {
        return None;
    }
    let dir = lock_dir();
    std::fs::create_dir_all(&dir).ok()?;
    let start = std::process::id() % count;
    (0..count).map(|i| (start + i) % count).find_map(|k| {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("block-{k}.lock")))
            .ok()?;
        file.try_lock().ok()?;
        Some(Block { _lock: file, first: FIRST_PORT + k * BLOCK_PORTS, next: AtomicU32::new(0) })
    })
}

/// Whether `port` can be bound on 127.0.0.1 now.
fn bindable(port: u32) -> bool {
    u16::try_from(port).is_ok_and(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok())
}

/// The next port of this process's block that nobody has bound, or `None`
/// when the process has no block.
fn from_block() -> Option<io::Result<u16>> {
    let block = BLOCK.get_or_init(claim).as_ref()?;
    for _ in 0..BLOCK_PORTS {
        let port = block.first + block.next.fetch_add(1, Ordering::Relaxed) % BLOCK_PORTS;
        if bindable(port) {
            return Some(u16::try_from(port).map_err(io::Error::other));
        }
    }
    Some(Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("every port of {}..{} is bound", block.first, block.first + BLOCK_PORTS),
    )))
}

/// `n` distinct free ports from `bind(0)` (all bound at once, then released).
fn ephemeral<const N: usize>() -> io::Result<[u16; N]> {
    let listeners: Vec<TcpListener> =
        (0..N).map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0))).collect::<io::Result<_>>()?;
    let mut ports = [0u16; N];
    for (p, l) in ports.iter_mut().zip(&listeners) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
}

/// `N` distinct loopback ports that are free now and that no other process
/// using this module will pick while this process lives.
pub fn free_ports<const N: usize>() -> io::Result<[u16; N]> {
    let mut ports = [0u16; N];
    for p in ports.iter_mut() {
        match from_block() {
            Some(port) => *p = port?,
            None => return ephemeral::<N>(),
        }
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_stay_below_the_ephemeral_range() {
        assert_eq!(block_count(32_768), 49);
        assert!(FIRST_PORT + block_count(32_768) * BLOCK_PORTS <= 32_768);
        assert_eq!(block_count(20_100), 0);
        assert_eq!(block_count(1_024), 0);
        assert_eq!(block_count(u32::MAX), (65_536 - FIRST_PORT) / BLOCK_PORTS);
    }

    #[test]
    fn ports_are_distinct_free_and_outside_the_ephemeral_range() {
        let a = free_ports::<4>().expect("ports");
        let b = free_ports::<4>().expect("ports");
        let mut all: Vec<u16> = a.iter().chain(&b).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 8, "{a:?} {b:?}");
        for p in all {
            assert!(TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok(), "{p} is free");
            if BLOCK.get().is_some_and(Option::is_some) {
                assert!(u32::from(p) < ephemeral_low(), "{p}");
            }
        }
    }

    #[test]
    fn a_claimed_block_is_not_claimed_twice() {
        // This process's own block is locked through its own file
        // description: a second claim (as another process would make) takes
        // another block.
        let _ = free_ports::<1>().expect("a port");
        let Some(Some(mine)) = BLOCK.get() else { return };
        let other = claim().expect("a second block");
        assert_ne!(other.first, mine.first);
    }
}
