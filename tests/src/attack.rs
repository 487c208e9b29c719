//! The method the `attack-worker` serves: one escape attempt per call, named by the request,
//! answered `Ok(evidence)` if the attempt worked and a remote error naming the errno if not.

use airlock_protocol::Method;

/// `attack(name, argument)`: see `src/bin/attack-worker.rs` for the names.
#[derive(Debug)]
pub struct Attack;

impl Method for Attack {
    const NAME: &'static str = "attack";
    type Request = (String, String);
    type Response = String;
}

/// Argument passed to the attack worker to skip its own seccomp allowlist, so a test sees
/// what the host's layers alone refuse (as for a worker written in another language).
pub const NO_SELF_FILTER: &str = "--no-self-filter";
