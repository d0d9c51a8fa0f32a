//! The names of the gRPC metadata Docket's services and clients exchange, written once.

/// A request's credential (docket-authd's or munge's), the only proof of who sends it.
pub const CREDENTIAL: &str = "x-docket-credential";

/// On a refusal from a replica that does not lead: the leader's address, so that a client
/// (the commands, an agent) sends the call there instead.
pub const LEADER: &str = "x-docket-leader";

/// A claim of who sends a request, which early builds believed. Nothing reads it any more:
/// the attack tests send it, with another user's name, to show that it changes nothing.
pub const CLAIMED_USER: &str = "x-docket-user";
