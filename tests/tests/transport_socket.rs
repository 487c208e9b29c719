//! The transport conformance suite against the socket transport, in both modes.

use airlock_test_support::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

mod inherited {
    use airlock_tests::transport_suite::InheritedFixture;
    airlock_tests::transport_suite!(InheritedFixture);
}

mod named {
    use airlock_tests::transport_suite::NamedFixture;
    airlock_tests::transport_suite!(NamedFixture);
}
