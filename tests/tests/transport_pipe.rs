//! The transport conformance suite against the pipe transport, over real OS pipes.

use airlock_tests::support::PeakAlloc;
use airlock_tests::transport_suite::PipeFixture;

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

airlock_tests::transport_suite!(PipeFixture);
