//! The cluster's credential key: a shared secret that signs and verifies user credentials.
//!
//! Like munge's `munge.key`, one key is shared by every host that mints credentials (the
//! signer, `docket-authd`, on submit hosts and compute nodes) and every host that checks them
//! (the controllers). Whoever can read it can mint a credential for any uid, so it must be
//! readable by root and the controllers' user only: [`KeyRing::load`] refuses a file that
//! other users can read or anyone but its owner's group can write, and a file owned by
//! neither root nor the reading user.
//!
//! The file holds one key per line as hex (comments start with `#`). The first key signs;
//! every key verifies, which is how a key is rotated without an outage: add the new key as
//! a second line everywhere, then move it first on the signers, then drop the old one.
//! Each key is known by an id (the first 8 bytes of a SHA-256 of it) that credentials carry,
//! so a verifier picks the right key without trying each.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Shortest key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 32;
/// Longest key file read, in bytes (a handful of keys and comments).
const MAX_FILE_BYTES: u64 = 64 << 10;
/// Most keys one file may hold.
const MAX_KEYS: usize = 16;

/// Identifies a key without revealing it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub [u8; 8]);

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// One secret key.
#[derive(Clone)]
pub struct Key {
    id: KeyId,
    secret: Vec<u8>,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Key {
    /// A key from its secret bytes.
    pub fn new(secret: Vec<u8>) -> Result<Key, KeyError> {
        if secret.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort {
                bytes: secret.len(),
            });
        }
        let mut h = Sha256::new();
        h.update(b"docket-credential-key-id\0");
        h.update(&secret);
        let digest = h.finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        Ok(Key {
            id: KeyId(id),
            secret,
        })
    }

    /// A fresh random key from the operating system's generator.
    pub fn generate() -> Result<Key, KeyError> {
        let mut secret = vec![0u8; MIN_KEY_BYTES];
        getrandom::fill(&mut secret).map_err(|e| KeyError::Random(e.to_string()))?;
        Key::new(secret)
    }

    pub fn id(&self) -> KeyId {
        self.id
    }

    pub(crate) fn secret(&self) -> &[u8] {
        &self.secret
    }

    /// The key as a line of a key file.
    pub fn to_hex(&self) -> String {
        self.secret.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The keys a host holds: the first signs, all verify.
#[derive(Debug, Clone)]
pub struct KeyRing {
    keys: Vec<Key>,
}

/// Why a key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: mode {mode:04o} lets other users read or write it; the credential key must be \
         readable only by root and the controllers (chmod 0400, or 0440 with the controllers' \
         group)"
    )]
    Insecure { path: PathBuf, mode: u32 },
    #[error(
        "{path}: owned by uid {owner}, neither root nor this process (uid {me}); a key someone \
         else owns could have been replaced by them"
    )]
    WrongOwner { path: PathBuf, owner: u32, me: u32 },
    #[error("{path}: {size} bytes is over the {limit}-byte limit of a key file")]
    FileTooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("{path}: line {line}: {problem}")]
    Syntax {
        path: PathBuf,
        line: usize,
        problem: String,
    },
    #[error("{path}: holds no key")]
    Empty { path: PathBuf },
    #[error("{path}: {count} keys; at most {MAX_KEYS}")]
    TooMany { path: PathBuf, count: usize },
    #[error("a key of {bytes} bytes is too short; at least {MIN_KEY_BYTES}")]
    TooShort { bytes: usize },
    #[error("the operating system's random generator failed: {0}")]
    Random(String),
}

impl KeyRing {
    /// A ring of exactly these keys, the first signing.
    pub fn new(keys: Vec<Key>) -> Option<KeyRing> {
        (!keys.is_empty()).then_some(KeyRing { keys })
    }

    /// Reads a key file, refusing one other users could read or change.
    pub fn load(path: &Path) -> Result<KeyRing, KeyError> {
        let io = |source| KeyError::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        check_private(path, &meta)?;
        if meta.len() > MAX_FILE_BYTES {
            return Err(KeyError::FileTooLarge {
                path: path.to_owned(),
                size: meta.len(),
                limit: MAX_FILE_BYTES,
            });
        }
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_FILE_BYTES), &mut text)
            .map_err(io)?;
        Self::parse(path, &text)
    }

    /// Parses the text of a key file (`path` only names it in errors).
    pub fn parse(path: &Path, text: &str) -> Result<KeyRing, KeyError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let syntax = |problem: String| KeyError::Syntax {
                path: path.to_owned(),
                line: i + 1,
                problem,
            };
            let secret = decode_hex(line).map_err(syntax)?;
            keys.push(Key::new(secret).map_err(|e| syntax(e.to_string()))?);
        }
        if keys.len() > MAX_KEYS {
            return Err(KeyError::TooMany {
                path: path.to_owned(),
                count: keys.len(),
            });
        }
        KeyRing::new(keys).ok_or_else(|| KeyError::Empty {
            path: path.to_owned(),
        })
    }

    /// The key that signs.
    pub fn signing(&self) -> &Key {
        &self.keys[0]
    }

    /// The key with this id, if held.
    pub fn get(&self, id: KeyId) -> Option<&Key> {
        self.keys.iter().find(|k| k.id == id)
    }

    /// Writes a new key file holding one fresh key, readable by its owner only (0400). Fails
    /// if the file exists.
    pub fn create_file(path: &Path) -> Result<Key, KeyError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let key = Key::generate()?;
        let io = |source| KeyError::Io {
            path: path.to_owned(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(path)
            .map_err(io)?;
        writeln!(
            file,
            "# Docket credential key (docket-authd signs with the first key, controllers accept \
             every key here).\n# Readable only by root and the controllers. Keep a copy where you \
             keep secrets.\n{}",
            key.to_hex()
        )
        .map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(key)
    }
}

/// Refuses a file others may read or change, or that neither root nor we own.
pub fn check_private(path: &Path, meta: &std::fs::Metadata) -> Result<(), KeyError> {
    let mode = meta.mode() & 0o7777;
    if mode & 0o007 != 0 || mode & 0o020 != 0 {
        return Err(KeyError::Insecure {
            path: path.to_owned(),
            mode,
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(KeyError::WrongOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            me,
        });
    }
    Ok(())
}

fn decode_hex(text: &str) -> Result<Vec<u8>, String> {
    if !text.len().is_multiple_of(2) {
        return Err("a key is an even number of hex digits".into());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(text.get(i..i + 2).unwrap_or(""), 16)
                .map_err(|_| format!("{:?} is not hex", text.get(i..i + 2).unwrap_or(text)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn keys_round_trip_through_a_private_file_and_the_first_one_signs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.key");
        let key = KeyRing::create_file(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        let ring = KeyRing::load(&path).unwrap();
        assert_eq!(ring.signing().id(), key.id());
        assert!(
            KeyRing::create_file(&path).is_err(),
            "never overwrites a key"
        );

        let other = Key::generate().unwrap();
        let text = format!("# two keys\n{}\n\n{}\n", other.to_hex(), key.to_hex());
        let ring = KeyRing::parse(&path, &text).unwrap();
        assert_eq!(ring.signing().id(), other.id());
        assert!(ring.get(key.id()).is_some());
        assert_ne!(key.id(), other.id());
    }

    #[test]
    fn files_others_can_read_or_write_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.key");
        KeyRing::create_file(&path).unwrap();
        for mode in [0o444, 0o404, 0o620, 0o602] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = KeyRing::load(&path).unwrap_err().to_string();
            assert!(e.contains("lets other users"), "{mode:o}: {e}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o440)).unwrap();
        KeyRing::load(&path).unwrap();
    }

    #[test]
    fn malformed_key_files_name_the_line() {
        let p = Path::new("k");
        let e = KeyRing::parse(p, "# only a comment\n").unwrap_err();
        assert!(e.to_string().contains("holds no key"), "{e}");
        let e = KeyRing::parse(p, "\nzz00\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("not hex"), "{e}");
        let e = KeyRing::parse(p, "abcd\n").unwrap_err().to_string();
        assert!(e.contains("too short"), "{e}");
        let e = KeyRing::parse(p, "abc\n").unwrap_err().to_string();
        assert!(e.contains("even number"), "{e}");
    }
}
