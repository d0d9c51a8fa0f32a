//! srun's own terminal under `--pty`: raw while the remote terminal is attached, so every
//! key (Ctrl-C, Ctrl-Z, arrows) travels to task 0's terminal and its line discipline acts on
//! it there, as with ssh; restored however srun ends. Its size is sent at launch and again
//! on every SIGWINCH.

use std::os::fd::AsFd;

use docket_proto::v1 as pb;
use rustix::termios::{OptionalActions, Termios, tcgetattr, tcgetwinsize, tcsetattr};

/// The size of srun's terminal (80x24 when standard input is not one).
pub fn size() -> pb::TerminalSize {
    match tcgetwinsize(std::io::stdin().as_fd()) {
        Ok(w) if w.ws_row > 0 && w.ws_col > 0 => pb::TerminalSize {
            rows: u32::from(w.ws_row),
            cols: u32::from(w.ws_col),
        },
        _ => pb::TerminalSize { rows: 24, cols: 80 },
    }
}

/// srun's terminal in raw mode until dropped; nothing when standard input is no terminal.
#[derive(Debug)]
pub struct RawMode {
    saved: Option<Termios>,
}

impl RawMode {
    pub fn enter() -> RawMode {
        let stdin = std::io::stdin();
        let Ok(saved) = tcgetattr(stdin.as_fd()) else {
            return RawMode { saved: None };
        };
        let mut raw = saved.clone();
        raw.make_raw();
        if tcsetattr(stdin.as_fd(), OptionalActions::Flush, &raw).is_err() {
            return RawMode { saved: None };
        }
        RawMode { saved: Some(saved) }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            let _ = tcsetattr(std::io::stdin().as_fd(), OptionalActions::Flush, saved);
        }
    }
}
