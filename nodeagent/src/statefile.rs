//! The agent's state file: two slots written in place, so a save creates no file.
//!
//! A save used to write a new temporary file and rename it over the old one. On ext4 each
//! such save allocates an inode and frees another, and allocating among inodes freed a moment
//! ago walks the inode bitmaps (`find_inode_bit`, `recently_deleted`): with a few saves per
//! job on hundreds of agents, `perf` showed that walk taking more cpu than everything else
//! the agents and controllers did (`docket-local scale`, 200 agents on one host).
//!
//! Now the state lives in two files, `NAME.0` and `NAME.1`, created at their first save and
//! kept open. Each save overwrites the slot that does not hold the newest record with a record that carries a
//! generation and a checksum; a load takes the newest record that is whole. A save cut short
//! (the agent killed in the middle of it) leaves a slot whose checksum fails, and the other
//! slot still holds the save before: the same guarantee the rename gave, that a reader sees
//! the old state or the new, never a part. Neither scheme syncs: the state must survive the
//! agent's death, and the node's own loss ends its jobs anyway.
//!
//! Record: `DKAS`, format version (u32), generation (u64), payload length (u64), CRC-32 of
//! the three before it and the payload (u32), then the payload; integers little-endian.
//! A state file from before the slots (`NAME.json`, written whole) is newer than any slot
//! (an agent with slots removes it at its first save): it is read first, and removed once
//! a save has succeeded.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::unix::fs::FileExt;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fchmod, fstat};

use crate::rootdir::{MAX_READ, RootDir};

const MAGIC: &[u8; 4] = b"DKAS";
const VERSION: u32 = 1;
const HEADER: usize = 4 + 4 + 8 + 8 + 4;

/// The two slots of one state file.
#[derive(Debug)]
pub struct StateFile {
    name: String,
    /// The slots, each opened when first found or written: a load creates nothing.
    slots: [Option<File>; 2],
    /// The newest whole record's generation and slot; the next save writes the next
    /// generation into the other slot.
    newest: Option<(u64, usize)>,
    /// The pre-slot file, to remove after a save (until that succeeds).
    legacy: Option<String>,
    dir_path: std::path::PathBuf,
}

impl StateFile {
    /// Opens the slots of `name` in `dir` that exist and returns them with the newest state
    /// saved: a `name.json` from before the slots if there is one (an agent of this kind
    /// removes it at its first save, so it is newer than any slot), else the newest whole
    /// record of a slot, if any.
    pub fn open(dir: &RootDir, name: &str) -> io::Result<(StateFile, Option<Vec<u8>>)> {
        let slots = [
            open_slot(dir, &slot_name(name, 0), false)?,
            open_slot(dir, &slot_name(name, 1), false)?,
        ];
        let mut newest: Option<(u64, usize, Vec<u8>)> = None;
        for (i, slot) in slots.iter().enumerate() {
            let Some((generation, payload)) = slot.as_ref().and_then(read_record) else {
                continue;
            };
            if newest.as_ref().is_none_or(|(g, _, _)| generation > *g) {
                newest = Some((generation, i, payload));
            }
        }
        let legacy_name = format!("{name}.json");
        let legacy = dir.read(&legacy_name).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the agent state file from before its slots");
            None
        });
        let mut file = StateFile {
            name: name.to_owned(),
            slots,
            newest: newest.as_ref().map(|(g, i, _)| (*g, *i)),
            legacy: None,
            dir_path: dir.path().to_path_buf(),
        };
        let payload = match legacy {
            Some(old) => {
                file.legacy = Some(legacy_name);
                Some(old)
            }
            None => newest.map(|(_, _, payload)| payload),
        };
        Ok((file, payload))
    }

    /// Saves `payload` as the newest state. On an error the state before is still the one
    /// a load finds.
    pub fn save(&mut self, dir: &RootDir, payload: &[u8]) -> io::Result<()> {
        if payload.len() as u64 > MAX_READ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: a state of {} bytes is over the {MAX_READ} a restarted agent reads",
                    self.dir_path.display(),
                    payload.len()
                ),
            ));
        }
        let (generation, slot) = match self.newest {
            Some((g, i)) => (g + 1, 1 - i),
            None => (1, 0),
        };
        let at = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("{}: slot {slot}: {e}", self.dir_path.display()),
            )
        };
        if self.slots[slot].is_none() {
            self.slots[slot] = open_slot(dir, &slot_name(&self.name, slot), true)?;
        }
        let Some(file) = &self.slots[slot] else {
            return Err(at(io::Error::other("not created")));
        };
        let record = encode(generation, payload);
        file.write_all_at(&record, 0).map_err(at)?;
        file.set_len(record.len() as u64).map_err(at)?;
        self.newest = Some((generation, slot));
        if let Some(legacy) = &self.legacy {
            dir.remove_file(legacy)?;
            self.legacy = None;
        }
        Ok(())
    }
}

fn slot_name(name: &str, slot: usize) -> String {
    format!("{name}.{slot}")
}

/// Opens a slot for reading and writing (None: it does not exist and `create` is false);
/// never through a symlink, and only a regular file of this process's euid with one link
/// (writes in place must not reach another name), made 0600.
fn open_slot(dir: &RootDir, name: &str, create: bool) -> io::Result<Option<File>> {
    let at = |e: nix::errno::Errno| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("{}: {e}", dir.path().join(name).display()),
        )
    };
    let mut flags = OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    if create {
        flags |= OFlag::O_CREAT;
    }
    let fd = match openat(dir.fd(), name, flags, Mode::from_bits_truncate(0o600)) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) if !create => return Ok(None),
        Err(e) => return Err(at(e)),
    };
    let st = fstat(&fd).map_err(at)?;
    let refuse = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {why}", dir.path().join(name).display()),
        )
    };
    if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
        return Err(refuse("not a regular file".into()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me || st.st_nlink != 1 {
        return Err(refuse(format!(
            "owned by uid {} with {} links; a state slot is this agent's (uid {me}) alone",
            st.st_uid, st.st_nlink
        )));
    }
    if st.st_mode & 0o7777 != 0o600 {
        fchmod(&fd, Mode::from_bits_truncate(0o600)).map_err(at)?;
    }
    Ok(Some(File::from(fd)))
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
/// cut short, unreadable, or not a record of this version).
fn read_record(file: &File) -> Option<(u64, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut reader = file;
    reader.rewind().ok()?;
    reader
        .take(MAX_READ + HEADER as u64 + 1)
        .read_to_end(&mut buf)
        .ok()?;
    decode(&buf)
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
        assert!(!d.path().join("state.0").exists(), "a load creates nothing");
        let inode = |n: &str| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(d.path().join(n)).unwrap().ino()
        };
        f.save(&d, b"first").unwrap();
        f.save(&d, b"second").unwrap();
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
        // The third save dies half-way through its slot (slot 0, the older: generation 3).
        let third = encode(3, b"third state, never finished");
        std::fs::write(d.path().join("state.0"), &third[..third.len() / 2]).unwrap();
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
        let path = d.path().join("state.1");
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
    fn a_state_too_large_to_read_back_is_refused_and_the_one_before_kept() {
        let (_t, d) = dir();
        let (mut f, _) = StateFile::open(&d, "state").unwrap();
        f.save(&d, b"small").unwrap();
        let big = vec![b'x'; MAX_READ as usize + 1];
        assert!(f.save(&d, &big).is_err());
        let (_, loaded) = StateFile::open(&d, "state").unwrap();
        assert_eq!(loaded.as_deref(), Some(&b"small"[..]));
    }

    #[test]
    fn a_slot_with_another_name_is_refused() {
        let (t, d) = dir();
        let (mut f, _) = StateFile::open(&d, "state").unwrap();
        f.save(&d, b"one").unwrap();
        std::fs::hard_link(d.path().join("state.0"), t.path().join("elsewhere")).unwrap();
        assert!(StateFile::open(&d, "state").is_err());
    }

    #[test]
    fn the_file_before_slots_wins_over_older_slots() {
        let (_t, d) = dir();
        let (mut f, _) = StateFile::open(&d, "state").unwrap();
        f.save(&d, b"[slots of an earlier upgrade]").unwrap();
        // Rolled back to an agent without slots, which saved since; then upgraded again.
        d.write_atomically("state.json", b"[newer]").unwrap();
        let (mut f, loaded) = StateFile::open(&d, "state").unwrap();
        assert_eq!(loaded.as_deref(), Some(&b"[newer]"[..]));
        f.save(&d, b"[newest]").unwrap();
        assert!(!d.path().join("state.json").exists());
        let (_, loaded) = StateFile::open(&d, "state").unwrap();
        assert_eq!(loaded.as_deref(), Some(&b"[newest]"[..]));
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
