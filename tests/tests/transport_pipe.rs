//! The transport conformance suite against the pipe transport, over real OS pipes.

use airlock_test_support::CountingAlloc;
use airlock_tests::transport_suite::PipeFixture;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

airlock_tests::transport_suite!(PipeFixture);
