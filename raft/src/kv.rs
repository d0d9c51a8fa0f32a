//! A small key-value [`StateMachine`], for the tests and the benchmark.
//!
//! Values are lists of strings: `Append` adds to a key's list, so a command applied twice
//! shows up twice, which is what an exactly-once check needs to see.

use std::collections::BTreeMap;
use std::io;

use serde::{Deserialize, Serialize};

use crate::machine::{ApplyContext, StateMachine};

/// A change to the map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvCommand {
    /// Appends `value` to the list under `key`.
    Append { key: String, value: String },
    /// Replaces the list under `key` with just `value`.
    Set { key: String, value: String },
    /// Removes `key`.
    Delete { key: String },
}

/// What a command answered: the list's length after it, and the log index it was applied at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvResponse {
    pub len: usize,
    pub index: u64,
}

/// The machine: an ordered map from key to list of values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvMachine {
    pub map: BTreeMap<String, Vec<String>>,
}

impl StateMachine for KvMachine {
    type Command = KvCommand;
    type Response = KvResponse;

    fn apply(&mut self, ctx: ApplyContext, command: KvCommand) -> KvResponse {
        let len = match command {
            KvCommand::Append { key, value } => {
                let list = self.map.entry(key).or_default();
                list.push(value);
                list.len()
            }
            KvCommand::Set { key, value } => {
                self.map.insert(key, vec![value]);
                1
            }
            KvCommand::Delete { key } => {
                self.map.remove(&key);
                0
            }
        };
        KvResponse {
            len,
            index: ctx.index,
        }
    }

    fn write_snapshot(&self, out: &mut dyn io::Write) -> io::Result<()> {
        postcard::to_io(&self.map, out).map_err(io::Error::other)?;
        Ok(())
    }

    fn restore(&mut self, input: &mut dyn io::Read) -> io::Result<()> {
        self.map = read_map(input)?;
        Ok(())
    }

    fn check_snapshot(input: &mut dyn io::Read) -> io::Result<()> {
        read_map(input).map(drop)
    }
}

/// The map a snapshot holds.
fn read_map(input: &mut dyn io::Read) -> io::Result<BTreeMap<String, Vec<String>>> {
    let mut bytes = Vec::new();
    input.read_to_end(&mut bytes)?;
    postcard::from_bytes(&bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("kv snapshot: {e}")))
}
