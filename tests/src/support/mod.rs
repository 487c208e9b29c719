//! Helpers shared by the suites, the test peer binary and the benchmarks.

mod child_fd;
mod frames;
mod no_user_namespaces;
mod nobody;
mod runtime;
mod scenarios;

pub use child_fd::pass_socket_fd;
pub use frames::{hello_frame, pattern, raw_frame};
pub use no_user_namespaces::run_without_user_namespaces;
pub use nobody::{setpriv, AS_NOBODY};
pub use runtime::current_thread_runtime;
pub use scenarios::{ENDED_BY_THE_DEADLINE, STRIKES_AT_A_CALL, SURVIVABLE};
