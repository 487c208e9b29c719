//! What the `rogue-worker` binary can be told to do.

/// Every `rogue-worker` scenario that strikes at a call, and so can be ordered mid-session
/// through its `misbehave` method (`rogue-worker chaos`). Left out: `frame_before_hello`,
/// `no_hello` and `wrong_version` strike at the handshake, which a chaos worker is already
/// past; and `setsid_grandchild` leaves a process outside the worker's group by design (a
/// stated residual), which a no-process-left check would rightly report.
pub const STRIKES_AT_A_CALL: &[&str] = &[
    // codec
    "return_len_bomb",
    "header_len_bomb",
    "deep_nesting",
    "invalid_utf8",
    "bad_enum_tag",
    "trailing_bytes",
    "wrong_type_body",
    // framing
    "frame_over_cap",
    "stall_prefix",
    "dribble",
    "garbage_between_frames",
    "eof_mid_frame",
    // correlation
    "random_id",
    "predictable_id",
    "swapped_name",
    "double_return",
    "progress_after_return",
    "replay_return",
    "echo_call",
    "progress_flood",
    // errors
    "fail_huge_message",
    "fail_escape_sequences",
    "fail_forbidden_kind",
    // process
    "exit_mid_call",
    "hang",
    "ignore_cancel",
    "close_write_side",
    "fork_grandchild",
    "stderr_flood",
    "never_read",
];

/// The scenarios in [`STRIKES_AT_A_CALL`] that never answer the call they strike at (a stalled
/// or dribbled frame, a handler that hangs or ignores the `Cancel`, a channel never read): only
/// the call's deadline ends them. Every other strike answers at once, with its lie.
pub const ENDED_BY_THE_DEADLINE: &[&str] = &[
    "stall_prefix",
    "dribble",
    "hang",
    "ignore_cancel",
    "never_read",
];

/// The one scenario in [`STRIKES_AT_A_CALL`] that a worker survives: it floods its stderr,
/// which the host bounds and drops, and then answers honestly.
pub const SURVIVABLE: &str = "stderr_flood";

#[cfg(test)]
mod tests {
    use super::*;

    /// A misspelt name would give a strike that never answers the long deadline of one that
    /// answers at once.
    #[test]
    fn the_strikes_ended_by_the_deadline_are_strikes_at_a_call() {
        for scenario in ENDED_BY_THE_DEADLINE.iter().chain([&SURVIVABLE]) {
            assert!(STRIKES_AT_A_CALL.contains(scenario), "{scenario}");
        }
    }
}
