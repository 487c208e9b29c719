//! The rogue worker attacks a real host, one test per scenario (`SECURITY.md` maps each to the
//! invariant it pins).
//!
//! Every test is self-proving. It first shows that its attack
//! is live: the rogue's own log (`ROGUE_LOG`: every write it made, every frame it received)
//! proves the hostile bytes really went out and were aimed at the victim call (its id, its
//! method), or a plain decoder is shown to misbehave on the identical bytes. Only then does it
//! assert the host's outcome: the exact `CallError` / `LostReason` / `ViolationCode`, the
//! worker SIGKILLed and reaped (its pid gone from `/proc`), a fresh worker (`ROGUE_ONCE` makes
//! the replacement honest) answering the next call correctly, and no allocation beyond the
//! budgets.
//!
//! Allocation is measured with the counting allocator (`CountingAlloc`): the largest single
//! allocation made while the host handles the attack. The tests run on a current-thread
//! runtime, so the host's supervisor, reader and writer tasks all run on the thread being
//! measured.
//!
//! The whole suite runs once per transport (`pipe`, `socket_inherited`, `socket_named`): the
//! rogue finds its channel the way the real worker does, so each attack crosses each
//! transport's framing and the host's handling of it.

use airlock_test_support::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

mod pipe {
    const TRANSPORT: airlock_host::TransportChoice = airlock_host::TransportChoice::Pipe;
    include!("adversarial/suite.rs");
}

mod socket_inherited {
    const TRANSPORT: airlock_host::TransportChoice = airlock_host::TransportChoice::SocketInherited;
    include!("adversarial/suite.rs");
}

mod socket_named {
    const TRANSPORT: airlock_host::TransportChoice = airlock_host::TransportChoice::SocketNamed;
    include!("adversarial/suite.rs");
}
