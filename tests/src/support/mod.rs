//! Helpers shared by the suites, the test peer binary and the benchmarks.

mod child_fd;
mod frames;
mod nobody;
mod scenarios;

pub use child_fd::pass_socket_fd;
pub use frames::{hello_frame, pattern, raw_frame};
pub use nobody::{setpriv, AS_NOBODY};
pub use scenarios::{ENDED_BY_THE_DEADLINE, STRIKES_AT_A_CALL, SURVIVABLE};
