//! The transport conformance suite against the socket transport, in both modes.

use airlock_tests::support::PeakAlloc;

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

mod inherited {
    use airlock_tests::transport_suite::InheritedFixture;
    airlock_tests::transport_suite!(InheritedFixture);
}

mod named {
    use airlock_tests::transport_suite::NamedFixture;
    airlock_tests::transport_suite!(NamedFixture);
}
