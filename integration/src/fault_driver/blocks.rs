//! The fault driver's block data, for the CSI SnapshotMetadata service: a
//! backing file per volume the tests write into ([`super::FaultDriver::write_volume`]),
//! copied to a file per snapshot when the snapshot is cut, and the 4 KiB
//! blocks a snapshot has allocated or that differ between two snapshots,
//! computed from those files.

use std::{
    fs::{File, OpenOptions},
    io::{Read, Seek, SeekFrom, Write},
    path::PathBuf,
    sync::Arc,
};

/// The block size of every answer.
pub const BLOCK: u64 = 4096;

/// The backing files, in a directory removed with the driver.
#[derive(Clone)]
pub struct BlockFiles {
    dir: Arc<tempfile::TempDir>,
}

impl Default for BlockFiles {
    fn default() -> Self {
        BlockFiles { dir: Arc::new(tempfile::tempdir().expect("block files directory")) }
    }
}

impl BlockFiles {
    fn volume(&self, id: &str) -> PathBuf {
        self.dir.path().join(format!("volume-{}", hex(id)))
    }

    fn snapshot(&self, id: &str) -> PathBuf {
        self.dir.path().join(format!("snapshot-{}", hex(id)))
    }

    /// Writes `data` at `offset` of volume `id` (its file grows to hold it).
    pub fn write(&self, id: &str, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut f = OpenOptions::new().create(true).truncate(false).write(true).open(self.volume(id))?;
        f.seek(SeekFrom::Start(offset))?;
        f.write_all(data)
    }

    /// Sets volume `id`'s size (its capacity), keeping what it holds.
    pub fn set_size(&self, id: &str, bytes: u64) -> std::io::Result<()> {
        let f = OpenOptions::new().create(true).truncate(false).write(true).open(self.volume(id))?;
        f.set_len(bytes)
    }

    /// Cuts snapshot `snapshot` of volume `volume`: a copy of its file (an
    /// empty one for a volume never written).
    pub fn cut(&self, volume: &str, snapshot: &str) -> std::io::Result<()> {
        match std::fs::copy(self.volume(volume), self.snapshot(snapshot)) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => File::create(self.snapshot(snapshot)).map(|_| ()),
            Err(e) => Err(e),
        }
    }

    /// Snapshot `id`'s file, if the snapshot was cut here.
    pub fn open(&self, id: &str) -> Option<File> {
        File::open(self.snapshot(id)).ok()
    }
}

/// A snapshot's blocks: with `base`, those that differ from it, else those
/// not all zero; from `start` (rounded down to a block), as (offset, size)
/// in order.
pub fn changed_blocks(target: &mut File, mut base: Option<&mut File>, start: u64) -> std::io::Result<Vec<(u64, u64)>> {
    let start = start - start % BLOCK;
    let len = target.metadata()?.len();
    target.seek(SeekFrom::Start(start))?;
    if let Some(b) = base.as_deref_mut() {
        b.seek(SeekFrom::Start(start))?;
    }
    let (mut blocks, mut offset) = (Vec::new(), start);
    let (mut t, mut b) = (vec![0u8; BLOCK as usize], vec![0u8; BLOCK as usize]);
    // Read in large chunks, as a real driver would (one syscall per block
    // would make the driver the slowest part of every stream).
    let mut target = std::io::BufReader::with_capacity(READ_CHUNK, target);
    let mut base = base.map(|b| std::io::BufReader::with_capacity(READ_CHUNK, b));
    while offset < len {
        read_block(&mut target, &mut t)?;
        let differs = match base.as_mut() {
            Some(base) => {
                read_block(base, &mut b)?;
                t != b
            }
            None => t.iter().any(|x| *x != 0),
        };
        if differs {
            blocks.push((offset, BLOCK));
        }
        offset += BLOCK;
    }
    Ok(blocks)
}

/// Bytes a snapshot file is read by.
const READ_CHUNK: usize = 1 << 20;

/// Reads the next block into `buf` (zeros past the end of the file).
fn read_block(f: &mut impl Read, buf: &mut [u8]) -> std::io::Result<()> {
    buf.fill(0);
    let mut got = 0;
    while got < buf.len() {
        match f.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(())
}

/// Merges touching blocks into ranges (the VARIABLE_LENGTH form).
pub fn merged(blocks: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(offset, size) in blocks {
        match out.last_mut() {
            Some((o, s)) if *o + *s == offset => *s += size,
            _ => out.push((offset, size)),
        }
    }
    out
}

fn hex(id: &str) -> String {
    id.bytes().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocated_and_changed_blocks_come_from_the_files() {
        let files = BlockFiles::default();
        files.set_size("v", 16 * BLOCK).expect("size");
        files.write("v", BLOCK, b"one").expect("write");
        files.write("v", 5 * BLOCK + 10, b"two").expect("write");
        files.cut("v", "s1").expect("cut");
        files.write("v", 6 * BLOCK, b"three").expect("write");
        files.write("v", BLOCK, b"ONE").expect("write");
        files.cut("v", "s2").expect("cut");
        let mut s1 = files.open("s1").expect("s1");
        assert_eq!(changed_blocks(&mut s1, None, 0).expect("read"), [(BLOCK, BLOCK), (5 * BLOCK, BLOCK)]);
        assert_eq!(changed_blocks(&mut s1, None, 2 * BLOCK + 7).expect("read"), [(5 * BLOCK, BLOCK)], "from a start");
        let (mut s2, mut s1) = (files.open("s2").expect("s2"), files.open("s1").expect("s1"));
        let delta = changed_blocks(&mut s2, Some(&mut s1), 0).expect("read");
        assert_eq!(delta, [(BLOCK, BLOCK), (6 * BLOCK, BLOCK)]);
        assert_eq!(merged(&[(0, 4096), (4096, 4096), (12288, 4096)]), [(0, 8192), (12288, 4096)]);
        files.cut("never-written", "s3").expect("cut");
        let mut s3 = files.open("s3").expect("s3");
        assert!(changed_blocks(&mut s3, None, 0).expect("read").is_empty());
        assert!(files.open("unknown").is_none());
    }
}
