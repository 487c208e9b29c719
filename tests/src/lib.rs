//! airlock's end-to-end test suites and the peers they spawn.
//!
//! One module per area; the integration tests under `tests/tests/` drive them against real
//! transports and real processes. Their binaries (`src/bin/`): `airlock-test-peer` plays the
//! worker and the hostile local processes of the transport tests, `rogue-worker` the
//! protocol-level attacks (adversarial, chaos, lifecycle), `attack-worker` the escapes the
//! confinement tests show live unconfined, then refused, and `background-worker` a handler's
//! task left running between calls (the idle-wait tests).

pub mod attack;
pub mod background;
pub mod capture;
pub mod dynamic;
pub mod e2e;
pub mod support;
pub mod transport_suite;
