//! The fault driver's block data, for the CSI SnapshotMetadata service: a
//! backing file per volume the tests write into ([`super::FaultDriver::write_volume`]),
//! copied to a file per snapshot when the snapshot is cut, and the 4 KiB
//! blocks a snapshot has allocated or that differ between two snapshots,
//! computed from those files.

use std::{
    fs::{File, OpenOptions},
    io::{BufReader, Read, Seek, SeekFrom, Write},
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

/// A snapshot's blocks, read as they are asked for: with `base`, those that
/// differ from it, else those not all zero; from `start` (rounded down to a
/// block), as (offset, size) in order. The files are read in large chunks,
/// as a real driver would (one syscall per block would make the driver the
/// slowest part of every stream), and only as far as the blocks are taken:
/// a stream of them begins before the whole file is read.
pub struct ChangedBlocks {
    target: BufReader<File>,
    base: Option<BufReader<File>>,
    offset: u64,
    len: u64,
    t: Vec<u8>,
    b: Vec<u8>,
}

impl ChangedBlocks {
    pub fn new(mut target: File, mut base: Option<File>, start: u64) -> std::io::Result<ChangedBlocks> {
        let start = start - start % BLOCK;
        let len = target.metadata()?.len();
        target.seek(SeekFrom::Start(start))?;
        if let Some(b) = base.as_mut() {
            b.seek(SeekFrom::Start(start))?;
        }
        Ok(ChangedBlocks {
            target: BufReader::with_capacity(READ_CHUNK, target),
            base: base.map(|b| BufReader::with_capacity(READ_CHUNK, b)),
            offset: start,
            len,
            t: vec![0u8; BLOCK as usize],
            b: vec![0u8; BLOCK as usize],
        })
    }

    /// Whether the block at the current offset counts (and the readers
    /// moved past it).
    fn next_counts(&mut self) -> std::io::Result<bool> {
        read_block(&mut self.target, &mut self.t)?;
        Ok(match self.base.as_mut() {
            Some(base) => {
                read_block(base, &mut self.b)?;
                self.t != self.b
            }
            None => self.t.iter().any(|x| *x != 0),
        })
    }
}

impl Iterator for ChangedBlocks {
    type Item = std::io::Result<(u64, u64)>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.offset < self.len {
            let offset = self.offset;
            self.offset += BLOCK;
            match self.next_counts() {
                Ok(true) => return Some(Ok((offset, BLOCK))),
                Ok(false) => {}
                Err(e) => {
                    self.offset = self.len;
                    return Some(Err(e));
                }
            }
        }
        None
    }
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

/// Merges touching blocks into ranges (the VARIABLE_LENGTH form), as they
/// come.
pub fn merged<E>(blocks: impl Iterator<Item = Result<(u64, u64), E>>) -> impl Iterator<Item = Result<(u64, u64), E>> {
    let mut blocks = blocks.peekable();
    std::iter::from_fn(move || {
        let (offset, mut size) = match blocks.next()? {
            Ok(b) => b,
            Err(e) => return Some(Err(e)),
        };
        while let Some(Ok((next, more))) = blocks.peek() {
            if offset + size != *next {
                break;
            }
            size += *more;
            blocks.next();
        }
        Some(Ok((offset, size)))
    })
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
        let read = |id: &str, base: Option<&str>, start: u64| -> Vec<(u64, u64)> {
            let (target, base) = (files.open(id).expect("target"), base.map(|b| files.open(b).expect("base")));
            ChangedBlocks::new(target, base, start).expect("open").collect::<std::io::Result<_>>().expect("read")
        };
        assert_eq!(read("s1", None, 0), [(BLOCK, BLOCK), (5 * BLOCK, BLOCK)]);
        assert_eq!(read("s1", None, 2 * BLOCK + 7), [(5 * BLOCK, BLOCK)], "from a start");
        assert_eq!(read("s2", Some("s1"), 0), [(BLOCK, BLOCK), (6 * BLOCK, BLOCK)]);
        let blocks = [(0, 4096), (4096, 4096), (12288, 4096), (16384, 4096)].map(Ok::<_, ()>);
        let ranges: Vec<_> = merged(blocks.into_iter()).collect();
        assert_eq!(ranges, [Ok((0, 8192)), Ok((12288, 8192))]);
        files.cut("never-written", "s3").expect("cut");
        assert!(read("s3", None, 0).is_empty());
        assert!(files.open("unknown").is_none());
    }
}
