//! The agent's state file: two slots written in place, so a save creates no file.
//!
//! A save used to write a new temporary file and rename it over the old one. On ext4 each
//! such save allocates an inode and frees another, and allocating among inodes freed a moment
//! ago walks the inode bitmaps (`find_inode_bit`, `recently_deleted`): with a few saves per
//! job on hundreds of agents, `perf` showed that walk taking more cpu than everything else
//! the agents and controllers did (`docket-local scale`, 200 agents on one host).
//!
//! Now the state lives in two files, `NAME.0` and `NAME.1`, created once and kept open. Each
//! save overwrites the slot that does not hold the newest record with a record that carries a
//! generation and a checksum; a load takes the newest record that is whole. A save cut short
//! (the agent killed in the middle of it) leaves a slot whose checksum fails, and the other
//! slot still holds the save before: the same guarantee the rename gave, that a reader sees
//! the old state or the new, never a part. Neither scheme syncs: the state must survive the
//! agent's death, and the node's own loss ends its jobs anyway.
//!
//! Record: `DKAS`, format version (u32), generation (u64), payload length (u64), CRC-32 of
//! the three before it and the payload (u32), then the payload; integers little-endian.
//! A state file from before the slots (`NAME.json`, written whole) is read when no slot
//! holds a record, and removed after the first save.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::unix::fs::FileExt;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstat};

use crate::rootdir::{MAX_READ, RootDir};

const MAGIC: &[u8; 4] = b"DKAS";
const VERSION: u32 = 1;
const HEADER: usize = 4 + 4 + 8 + 8 + 4;

/// The two slots of one state file, open for writing.
#[derive(Debug)]
pub struct StateFile {
    slots: [File; 2],
    /// The generation of the newest whole record (0: none yet); the next save writes
    /// generation + 1 into slot (generation + 1) % 2.
    generation: u64,
    /// The pre-slot file to remove after the first save, if there was one.
    legacy: Option<String>,
    dir_path: std::path::PathBuf,
}

impl StateFile {
    /// Opens (creating if missing) the slots of `name` in `dir` and returns them with the
    /// newest whole state saved there (or in the pre-slot `name.json`), if any.
    pub fn open(dir: &RootDir, name: &str) -> io::Result<(StateFile, Option<Vec<u8>>)> {
        let slots = [
            open_slot(dir, &format!("{name}.0"))?,
            open_slot(dir, &format!("{name}.1"))?,
        ];
        let newest = slots
            .iter()
            .filter_map(|f| read_record(f).ok().flatten())
            .max_by_key(|(generation, _)| *generation);
        let legacy_name = format!("{name}.json");
        let legacy = dir.read(&legacy_name)?;
        let (generation, payload) = match newest {
            Some((generation, payload)) => (generation, Some(payload)),
            None => (0, legacy.clone()),
        };
        let file = StateFile {
            slots,
            generation,
            legacy: legacy.map(|_| legacy_name),
            dir_path: dir.path().to_path_buf(),
        };
        Ok((file, payload))
    }

    /// Saves `payload` as the newest state. On an error the state before is still the one
    /// a load finds.
    pub fn save(&mut self, dir: &RootDir, payload: &[u8]) -> io::Result<()> {
        let generation = self.generation + 1;
        let record = encode(generation, payload);
        let slot = &self.slots[(generation % 2) as usize];
        let at = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("{}: slot {}: {e}", self.dir_path.display(), generation % 2),
            )
        };
        slot.write_all_at(&record, 0).map_err(at)?;
        slot.set_len(record.len() as u64).map_err(at)?;
        self.generation = generation;
        if let Some(legacy) = self.legacy.take() {
            dir.remove_file(&legacy)?;
        }
        Ok(())
    }
}

/// Opens a slot for reading and writing, creating it if missing; never through a symlink,
/// and only a regular file.
fn open_slot(dir: &RootDir, name: &str) -> io::Result<File> {
    let at = |e: nix::errno::Errno| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("{}: {e}", dir.path().join(name).display()),
        )
    };
    let fd = openat(
        dir.fd(),
        name,
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(at)?;
    let st = fstat(&fd).map_err(at)?;
    if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a regular file", dir.path().join(name).display()),
        ));
    }
    Ok(File::from(fd))
}

fn encode(generation: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[4..]);
    crc.update(payload);
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The slot's record as (generation, payload); None if it holds no whole record (empty,
/// cut short, or not a record of this version).
fn read_record(file: &File) -> io::Result<Option<(u64, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut reader = file;
    reader.rewind()?;
    reader
        .take(MAX_READ + HEADER as u64 + 1)
        .read_to_end(&mut buf)?;
    Ok(decode(&buf))
}

fn decode(buf: &[u8]) -> Option<(u64, Vec<u8>)> {
    let header = buf.get(..HEADER)?;
    let word = |from: usize, to: usize| header.get(from..to);
    if word(0, 4)? != MAGIC || u32::from_le_bytes(word(4, 8)?.try_into().ok()?) != VERSION {
        return None;
    }
    let generation = u64::from_le_bytes(word(8, 16)?.try_into().ok()?);
    let len = usize::try_from(u64::from_le_bytes(word(16, 24)?.try_into().ok()?)).ok()?;
    let crc = u32::from_le_bytes(word(24, 28)?.try_into().ok()?);
    let payload = buf.get(HEADER..HEADER.checked_add(len)?)?;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(word(4, 24)?);
    hasher.update(payload);
    (hasher.finalize() == crc).then(|| (generation, payload.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, RootDir) {
        let t = tempfile::tempdir().unwrap();
        let d = RootDir::open_or_create(&t.path().join("state"), 0o700).unwrap();
        (t, d)
    }

    #[test]
    fn the_newest_save_is_loaded_and_no_file_is_created_after_the_first() {
        let (_t, d) = dir();
        let (mut f, none) = StateFile::open(&d, "state").unwrap();
        assert_eq!(none, None);
        let inode = |n: &str| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(d.path().join(n)).unwrap().ino()
        };
        let before = (inode("state.0"), inode("state.1"));
        for i in 0..5u32 {
            f.save(&d, format!("save {i}").as_bytes()).unwrap();
        }
        // Shorter than the record it overwrites: the length, not the file's end, bounds it.
        f.save(&d, b"s").unwrap();
        assert_eq!(before, (inode("state.0"), inode("state.1")));
        let (_, loaded) = StateFile::open(&d, "state").unwrap();
        assert_eq!(loaded.as_deref(), Some(&b"s"[..]));
    }

    #[test]
    fn a_save_cut_short_leaves_the_one_before() {
        let (_t, d) = dir();
        let (mut f, _) = StateFile::open(&d, "state").unwrap();
        f.save(&d, b"first whole state").unwrap();
        f.save(&d, b"second whole state").unwrap();
        // The third save dies half-way through its slot (slot 1: generation 3).
        let third = encode(3, b"third state, never finished");
        std::fs::write(d.path().join("state.1"), &third[..third.len() / 2]).unwrap();
        let (mut f, loaded) = StateFile::open(&d, "state").unwrap();
        assert_eq!(loaded.as_deref(), Some(&b"second whole state"[..]));
        // Saving goes on from there, and wins over the slot cut short.
        f.save(&d, b"after").unwrap();
        let (_, loaded) = StateFile::open(&d, "state").unwrap();
        assert_eq!(loaded.as_deref(), Some(&b"after"[..]));
    }

    #[test]
    fn a_corrupted_record_is_not_loaded() {
        let (_t, d) = dir();
        let (mut f, _) = StateFile::open(&d, "state").unwrap();
        f.save(&d, b"good").unwrap();
        f.save(&d, b"newer").unwrap();
        let path = d.path().join("state.0");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let (_, loaded) = StateFile::open(&d, "state").unwrap();
        assert_eq!(loaded.as_deref(), Some(&b"good"[..]));
        for garbage in [&b""[..], b"DKAS", b"DKAS\x02\0\0\0", &[0xff; 64]] {
            assert_eq!(decode(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn the_file_before_slots_is_read_then_removed() {
        let (_t, d) = dir();
        d.write_atomically("state.json", b"[legacy]").unwrap();
        let (mut f, loaded) = StateFile::open(&d, "state").unwrap();
        assert_eq!(loaded.as_deref(), Some(&b"[legacy]"[..]));
        f.save(&d, b"[new]").unwrap();
        assert!(!d.path().join("state.json").exists());
        let (_, loaded) = StateFile::open(&d, "state").unwrap();
        assert_eq!(loaded.as_deref(), Some(&b"[new]"[..]));
    }

    #[test]
    fn a_slot_that_is_a_symlink_is_refused() {
        let (t, d) = dir();
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"root's").unwrap();
        std::os::unix::fs::symlink(&victim, d.path().join("state.0")).unwrap();
        assert!(StateFile::open(&d, "state").is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"root's");
    }
}
