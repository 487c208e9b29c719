//! airlock's end-to-end test suites and the peers they spawn.
//!
//! One module per area; the integration tests under `tests/tests/` drive them against real
//! transports and real processes. The `airlock-test-peer` binary (`src/bin/`) plays the worker
//! and the hostile local processes in those tests.

pub mod attack;
pub mod capture;
pub mod dynamic;
pub mod e2e;
pub mod support;
pub mod transport_suite;
