//! Who is calling.
//!
//! Every request carries the caller's login name in the `x-docket-user` metadata entry. How
//! that name is proven across the network (munge-style credentials, mTLS) comes later; the
//! checks that use it live in docket-core from the start: a user acts on their own jobs, an
//! admin (a user flagged admin in state) or the operator on anyone's. `root` is the operator,
//! as it is to Slurm.

use docket_core::{Actor, UserName};
use tonic::{Request, Status};

/// The metadata entry naming the caller.
pub const USER_HEADER: &str = "x-docket-user";

/// The actor `request` speaks for, or PERMISSION_DENIED/INVALID_ARGUMENT saying what is wrong.
pub fn caller<T>(request: &Request<T>) -> Result<Actor, Status> {
    let Some(value) = request.metadata().get(USER_HEADER) else {
        return Err(Status::unauthenticated(format!(
            "no caller identity: set the {USER_HEADER} metadata entry to your login name"
        )));
    };
    let name = value
        .to_str()
        .map_err(|_| Status::invalid_argument(format!("{USER_HEADER}: not printable ASCII")))?;
    if name == "root" {
        return Ok(Actor::Operator);
    }
    let user: UserName = name
        .parse()
        .map_err(|e| Status::invalid_argument(format!("{USER_HEADER}: {e}")))?;
    Ok(Actor::User(user))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(user: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(u) = user {
            r.metadata_mut().insert(USER_HEADER, u.parse().unwrap());
        }
        r
    }

    #[test]
    fn callers_are_users_root_is_the_operator_and_no_name_is_refused() {
        assert_eq!(
            caller(&with(Some("alice"))).unwrap(),
            Actor::User("alice".parse().unwrap())
        );
        assert_eq!(caller(&with(Some("root"))).unwrap(), Actor::Operator);
        let e = caller(&with(None)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(e.message().contains(USER_HEADER));
        let e = caller(&with(Some("bad name!"))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
