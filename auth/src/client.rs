//! Asking the local signer for a credential (what `docket`, `sbatch` and friends do before
//! every request).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::time::Duration;

use crate::signer::GREETING;

/// Why no credential was had.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(
        "cannot reach the credential signer at {path}: {source} (is docket-authd running? set \
         DOCKET_AUTH_SOCKET if it listens elsewhere)"
    )]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("the credential signer at {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("the credential signer refused: {0}")]
    Refused(String),
    #[error("the credential signer answered something else: {0:?}")]
    Garbled(String),
}

/// A fresh credential for this process's user from the signer at `socket`.
pub fn fetch(socket: &Path, timeout: Duration) -> Result<String, FetchError> {
    let path = socket.display().to_string();
    let mut stream =
        std::os::unix::net::UnixStream::connect(socket).map_err(|source| FetchError::Connect {
            path: path.clone(),
            source,
        })?;
    let io = |source| FetchError::Io {
        path: path.clone(),
        source,
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    stream
        .write_all(format!("{GREETING}\n").as_bytes())
        .map_err(io)?;
    let mut line = String::new();
    BufReader::new(stream.take(64 << 10))
        .read_line(&mut line)
        .map_err(io)?;
    let line = line.trim_end();
    if let Some(token) = line.strip_prefix("ok ") {
        Ok(token.to_owned())
    } else if let Some(why) = line.strip_prefix("error ") {
        Err(FetchError::Refused(why.to_owned()))
    } else {
        Err(FetchError::Garbled(line.chars().take(200).collect()))
    }
}
