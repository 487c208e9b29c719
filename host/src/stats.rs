//! Counters a host keeps about its calls and workers, with per-method counts and latencies.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use airlock_protocol::ViolationCode;

use crate::CallError;

/// Most distinct method names *named at run time* ([`Host::call_value`](crate::Host::call_value))
/// a host keeps apart in [`HostStats::methods`]: 32. A dynamic call can name any method, so
/// without a cap a caller passing names through from its own input could grow the table
/// without bound; calls to names beyond the cap are counted in [`HostStats::other_methods`].
/// A method named in the program ([`Method::NAME`](crate::Method::NAME)) is always kept apart:
/// the program's code bounds how many there are.
///
/// Memory: a host counts calls in a few shards, one per thread that makes calls (4 at most),
/// so that callers on different threads share no lock; each shard keeps a latency histogram
/// (1.3 KiB) for each method its threads called. A host's stats take at most 4 × (the
/// program's methods called + 32) × 1.3 KiB.
pub const MAX_DYNAMIC_METHODS: usize = 32;

/// A snapshot of a host's counters.
///
/// Several snapshots add up with [`merge`](Self::merge) (a [`Pool`](crate::Pool)'s total is
/// made that way): every count is a sum and every latency histogram is merged bucket by
/// bucket, so a total's percentiles are those of all its calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Calls begun.
    pub calls_started: u64,
    /// Calls that returned a response.
    pub calls_ok: u64,
    /// Calls that failed, by kind.
    pub calls_failed: FailureCounts,
    /// Protocol violations, by code.
    pub violations: BTreeMap<ViolationCode, u64>,
    /// Workers started after the first.
    pub restarts: u64,
    /// Calls in flight now.
    pub in_flight: u64,
    /// Worker stderr lines not relayed because they came faster than the rate limit. (Lines
    /// over the length limit are relayed, cut, and marked `[truncated]`.)
    pub stderr_lines_dropped: u64,
    /// Calls that ended, by method name: how many, and how long they took. Every method named
    /// in the program has its own entry; methods named at run time have one each for the
    /// first [`MAX_DYNAMIC_METHODS`] names, and the rest are counted in
    /// [`other_methods`](Self::other_methods).
    pub methods: BTreeMap<String, MethodStats>,
    /// Calls to methods named at run time beyond the first [`MAX_DYNAMIC_METHODS`] names.
    pub other_methods: MethodStats,
}

impl HostStats {
    /// Adds `other`'s counts to these: every counter is summed, and histograms are merged
    /// bucket by bucket (entries of [`methods`](Self::methods) by name).
    ///
    /// ```
    /// use airlock_host::HostStats;
    /// let mut total = HostStats::default();
    /// let one = HostStats { calls_started: 2, calls_ok: 1, ..HostStats::default() };
    /// total.merge(&one);
    /// total.merge(&one);
    /// assert_eq!((total.calls_started, total.calls_ok), (4, 2));
    /// ```
    pub fn merge(&mut self, other: &HostStats) {
        self.calls_started += other.calls_started;
        self.calls_ok += other.calls_ok;
        self.calls_failed.merge(&other.calls_failed);
        for (code, count) in &other.violations {
            *self.violations.entry(*code).or_default() += count;
        }
        self.restarts += other.restarts;
        self.in_flight += other.in_flight;
        self.stderr_lines_dropped += other.stderr_lines_dropped;
        for (name, method) in &other.methods {
            self.methods.entry(name.clone()).or_default().merge(method);
        }
        self.other_methods.merge(&other.other_methods);
    }
}

/// Failed calls by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FailureCounts {
    /// The handler reported an error.
    pub remote: u64,
    /// The deadline passed.
    pub timeout: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// The worker was lost.
    pub worker_lost: u64,
    /// The response did not decode.
    pub decode: u64,
    /// Refused locally (overloaded, too large, encode failure).
    pub refused: u64,
    /// The host was shut down.
    pub shutdown: u64,
}

impl FailureCounts {
    /// All failed calls, whatever their kind.
    pub fn total(&self) -> u64 {
        let Self {
            remote,
            timeout,
            cancelled,
            worker_lost,
            decode,
            refused,
            shutdown,
        } = self;
        remote + timeout + cancelled + worker_lost + decode + refused + shutdown
    }

    fn merge(&mut self, other: &FailureCounts) {
        self.remote += other.remote;
        self.timeout += other.timeout;
        self.cancelled += other.cancelled;
        self.worker_lost += other.worker_lost;
        self.decode += other.decode;
        self.refused += other.refused;
        self.shutdown += other.shutdown;
    }
}

/// One method's calls: how many ended, how, and how long the answered ones took.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MethodStats {
    /// Calls that returned a response.
    pub ok: u64,
    /// Calls that failed, for any reason (the handler's error, a timeout, a lost worker, a
    /// cancellation, a refusal, a shutdown).
    pub failed: u64,
    /// How long the calls the worker answered took (a response, or the handler's own error,
    /// [`CallError::Remote`]): from the call's start, before its request is encoded, to when
    /// the host accepted the worker's answer (the clock read of the reader's turn that took
    /// its frame, or, for a large response decoded outside the connection's lock, the end of
    /// that decode). Other failures are counted in [`failed`](Self::failed) but not timed: a
    /// timeout is not a latency.
    pub latency: LatencyHistogram,
}

impl MethodStats {
    /// Calls that ended: `ok + failed`.
    pub fn calls(&self) -> u64 {
        self.ok + self.failed
    }

    fn merge(&mut self, other: &MethodStats) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.latency.merge(&other.latency);
    }

    fn record(&mut self, outcome: Result<(), &CallError>, elapsed: Duration) {
        match outcome {
            Ok(()) => self.ok += 1,
            Err(_) => self.failed += 1,
        }
        if matches!(outcome, Ok(()) | Err(CallError::Remote(_))) {
            self.latency.record(elapsed);
        }
    }
}

/// Sub-buckets per power of two, as a power of two: 4, so a bucket is at most a quarter of
/// its lower edge wide.
const SUB_BITS: u32 = 2;
const SUB_BUCKETS: u64 = 1 << SUB_BITS;
/// Durations from 2^`TOP_OCTAVE` µs (about 12.7 days) up share the last bucket.
const TOP_OCTAVE: u32 = 40;
/// Exact buckets for 0–3 µs, four per power of two from 4 µs to 2^40 µs, and one above.
const BUCKETS: usize = (SUB_BUCKETS * (TOP_OCTAVE as u64 - 1)) as usize + 1;
const OVERFLOW_BUCKET: usize = BUCKETS - 1;

/// A latency histogram with fixed logarithmic buckets, small enough to keep one per method.
///
/// **Resolution:** durations are counted in whole microseconds, exactly up to 7 µs, then in
/// four buckets per power of two (8–9 µs, 10–11 µs, 12–13 µs, 14–15 µs, 16–19 µs, ...), up to
/// 2^40 µs (about 12.7 days), above which all share one bucket. A percentile is reported as
/// the top of the bucket holding it, but never above the largest duration recorded, so it is
/// never below the true percentile and less than 1.25 times it. [`max`](Self::max) is exact
/// (to the microsecond).
///
/// It is 157 counters (1.3 KiB), whatever the number of calls.
///
/// ```
/// use std::time::Duration;
/// use airlock_host::LatencyHistogram;
///
/// let none = LatencyHistogram::default();
/// assert_eq!(none.p50(), None);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: Box<[u64; BUCKETS]>,
    count: u64,
    max_micros: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: Box::new([0; BUCKETS]),
            count: 0,
            max_micros: 0,
        }
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.count)
            .field("p50", &self.p50())
            .field("p90", &self.p90())
            .field("p99", &self.p99())
            .field("max", &self.max())
            .finish()
    }
}

impl LatencyHistogram {
    /// How many durations were recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The median, `None` if nothing was recorded.
    pub fn p50(&self) -> Option<Duration> {
        self.percentile(0.50)
    }

    /// The 90th percentile, `None` if nothing was recorded.
    pub fn p90(&self) -> Option<Duration> {
        self.percentile(0.90)
    }

    /// The 99th percentile, `None` if nothing was recorded.
    pub fn p99(&self) -> Option<Duration> {
        self.percentile(0.99)
    }

    /// The longest duration recorded (exact to the microsecond), `None` if nothing was.
    pub fn max(&self) -> Option<Duration> {
        (self.count > 0).then(|| Duration::from_micros(self.max_micros))
    }

    /// The duration at `quantile` (0.0–1.0; outside that, or NaN, it is held to the nearer
    /// end, NaN to 0.0): the top of the bucket that holds the `ceil(quantile × count)`-th
    /// shortest duration (at least the first), but never above [`max`](Self::max). `None` if
    /// nothing was recorded.
    pub fn percentile(&self, quantile: f64) -> Option<Duration> {
        if self.count == 0 {
            return None;
        }
        let quantile = if quantile.is_nan() {
            0.0
        } else {
            quantile.clamp(0.0, 1.0)
        };
        // Exact for any count below 2^53; `as` saturates, and the clamp keeps it a rank.
        let rank = ((quantile * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (bucket, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let top = bucket_top(bucket).min(self.max_micros);
                return Some(Duration::from_micros(top));
            }
        }
        // The counts sum to `count`, so the loop returned; this is the same answer.
        self.max()
    }

    /// Adds every duration of `other` to this histogram.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine += theirs;
        }
        self.count += other.count;
        self.max_micros = self.max_micros.max(other.max_micros);
    }

    pub(crate) fn record(&mut self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket_of(micros)] += 1;
        self.count += 1;
        self.max_micros = self.max_micros.max(micros);
    }
}

/// The bucket of a duration of `micros` µs.
fn bucket_of(micros: u64) -> usize {
    if micros < SUB_BUCKETS {
        return micros as usize;
    }
    let octave = micros.ilog2();
    if octave >= TOP_OCTAVE {
        return OVERFLOW_BUCKET;
    }
    let sub = (micros >> (octave - SUB_BITS)) & (SUB_BUCKETS - 1);
    (SUB_BUCKETS * u64::from(octave - SUB_BITS + 1) + sub) as usize
}

/// The longest duration, in µs, that falls in `bucket`.
fn bucket_top(bucket: usize) -> u64 {
    if bucket < SUB_BUCKETS as usize {
        return bucket as u64;
    }
    if bucket >= OVERFLOW_BUCKET {
        return u64::MAX;
    }
    let bucket = bucket as u64;
    let shift = bucket / SUB_BUCKETS - 1;
    let sub = bucket % SUB_BUCKETS;
    ((SUB_BUCKETS + sub + 1) << shift) - 1
}

/// Shards of a host's call outcomes: each thread records into one of its own, so callers on
/// a runtime's threads share no lock or cache line to count a call. Each shard keeps a
/// histogram per method its threads called (1.3 KiB each), so a method costs at most this
/// many of them per host.
const SHARDS: usize = 4;

/// The shard this thread records into, picked round-robin the first time it records.
fn shard_of_this_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    // A thread ending (its thread-locals gone) still counts its calls, in the first shard.
    SHARD.try_with(|shard| *shard).unwrap_or(0)
}

/// One shard's counts: the outcomes, and the calls of each method its threads made.
#[derive(Debug, Default)]
struct ShardCounts {
    ok: u64,
    failed: FailureCounts,
    /// Keyed by the name as [`MethodNames::admit`] gave it: a `Method::NAME`, or a name given
    /// at run time and admitted under the cap.
    methods: BTreeMap<Cow<'static, str>, MethodStats>,
    /// Calls to names given at run time beyond the cap.
    other: MethodStats,
}

impl ShardCounts {
    fn count(&mut self, outcome: Result<(), &CallError>) {
        let failed = &mut self.failed;
        let counter = match OutcomeKind::of(outcome) {
            OutcomeKind::Ok => &mut self.ok,
            OutcomeKind::Remote => &mut failed.remote,
            OutcomeKind::Timeout => &mut failed.timeout,
            OutcomeKind::Cancelled => &mut failed.cancelled,
            OutcomeKind::WorkerLost => &mut failed.worker_lost,
            OutcomeKind::Decode => &mut failed.decode,
            OutcomeKind::Refused => &mut failed.refused,
            OutcomeKind::Shutdown => &mut failed.shutdown,
        };
        *counter += 1;
    }
}

/// A shard on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard(Mutex<ShardCounts>);

/// Which method names a host keeps apart, bounded: see [`MAX_DYNAMIC_METHODS`]. Asked only
/// the first time a shard sees a name (and for every call to a name beyond the cap).
#[derive(Debug, Default)]
struct MethodNames {
    /// `Method::NAME`s called so far: a name given at run time that is one of them shares its
    /// entry without counting against the cap.
    typed: BTreeSet<&'static str>,
    /// Names given at run time, kept apart: at most `MAX_DYNAMIC_METHODS`.
    dynamic: BTreeSet<String>,
}

impl MethodNames {
    /// The key to count `method` under, or `None` for [`HostStats::other_methods`]. A
    /// `Borrowed` name is a `Method::NAME`, always kept apart; an `Owned` one was given at run
    /// time, and is kept apart if it is a `Method::NAME` already called, or one of the first
    /// `MAX_DYNAMIC_METHODS` such names.
    // `&Cow`, not `&str`: whether the name is the program's own decides the cap.
    #[allow(clippy::ptr_arg)]
    fn admit(&mut self, method: &Cow<'static, str>) -> Option<Cow<'static, str>> {
        match method {
            Cow::Borrowed(name) => {
                self.typed.insert(name);
            }
            Cow::Owned(name) => {
                let known =
                    self.typed.contains(name.as_str()) || self.dynamic.contains(name.as_str());
                if !known {
                    if self.dynamic.len() >= MAX_DYNAMIC_METHODS {
                        return None;
                    }
                    self.dynamic.insert(name.clone());
                }
            }
        }
        Some(method.clone())
    }
}

/// How a call ended, as counted: `Ok`, or the [`FailureCounts`] field its failure counts in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OutcomeKind {
    Ok,
    Remote,
    Timeout,
    Cancelled,
    WorkerLost,
    Decode,
    Refused,
    Shutdown,
}

impl OutcomeKind {
    fn of(outcome: Result<(), &CallError>) -> Self {
        match outcome {
            Ok(()) => Self::Ok,
            Err(CallError::Remote(_)) => Self::Remote,
            Err(CallError::Timeout) => Self::Timeout,
            Err(CallError::Cancelled) => Self::Cancelled,
            Err(CallError::WorkerLost(_)) => Self::WorkerLost,
            Err(CallError::Decode(_)) => Self::Decode,
            Err(CallError::Shutdown) => Self::Shutdown,
            Err(
                CallError::Encode(_)
                | CallError::TooLarge { .. }
                | CallError::Overloaded { .. }
                | CallError::InvalidMethodName,
            ) => Self::Refused,
        }
    }

    /// The name traces give it: `ok`, or the name of its [`FailureCounts`] field.
    fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Remote => "remote",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::WorkerLost => "worker_lost",
            Self::Decode => "decode",
            Self::Refused => "refused",
            Self::Shutdown => "shutdown",
        }
    }
}

/// How a call ended, for its trace: `ok`, or the name of the [`FailureCounts`] field its
/// failure counts in (`remote`, `timeout`, `cancelled`, `worker_lost`, `decode`, `refused`,
/// `shutdown`).
pub(crate) fn outcome_name(outcome: Result<(), &CallError>) -> &'static str {
    OutcomeKind::of(outcome).name()
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) started: AtomicU64,
    /// Calls' outcomes and latencies, per thread.
    shards: [Shard; SHARDS],
    names: Mutex<MethodNames>,
    pub(crate) restarts: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) stderr_dropped: Arc<AtomicU64>,
    /// The current worker's last stderr lines, for a failed spawn's error.
    pub(crate) stderr_tail: Arc<crate::stderr::StderrTail>,
    pub(crate) violations: Mutex<BTreeMap<ViolationCode, u64>>,
    /// The current worker's pid as the host sees it (0: none running).
    pub(crate) worker_pid: std::sync::atomic::AtomicU32,
}

impl Counters {
    /// Counts a call's outcome, under its method, with how long it took, in this thread's
    /// shard: one lock that callers on other threads do not take. A `Borrowed` name is a
    /// `Method::NAME`; an `Owned` one was given at run time (see [`MAX_DYNAMIC_METHODS`]).
    #[allow(clippy::ptr_arg)]
    pub(crate) fn record(
        &self,
        method: &Cow<'static, str>,
        outcome: Result<(), &CallError>,
        elapsed: Duration,
    ) {
        let Some(Shard(shard)) = self.shards.get(shard_of_this_thread()) else {
            return;
        };
        let Ok(mut shard) = shard.lock() else {
            return;
        };
        shard.count(outcome);
        // A name this shard knows is found without copying it or asking `names`.
        if let Some(stats) = shard.methods.get_mut(method.as_ref()) {
            stats.record(outcome, elapsed);
            return;
        }
        let admitted = match self.names.lock() {
            Ok(mut names) => names.admit(method),
            Err(_) => return,
        };
        let stats = match admitted {
            Some(name) => shard.methods.entry(name).or_default(),
            None => &mut shard.other,
        };
        stats.record(outcome, elapsed);
    }

    pub(crate) fn violation(&self, code: ViolationCode) {
        if let Ok(mut map) = self.violations.lock() {
            *map.entry(code).or_default() += 1;
        }
    }

    /// The counters now, the shards added up (each shard is read under its lock, one after
    /// another).
    pub(crate) fn snapshot(&self) -> HostStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut stats = HostStats {
            calls_started: get(&self.started),
            violations: self
                .violations
                .lock()
                .map(|m| m.clone())
                .unwrap_or_default(),
            restarts: get(&self.restarts),
            in_flight: get(&self.in_flight),
            stderr_lines_dropped: get(&self.stderr_dropped),
            ..HostStats::default()
        };
        for Shard(shard) in &self.shards {
            let Ok(shard) = shard.lock() else {
                continue;
            };
            stats.calls_ok += shard.ok;
            stats.calls_failed.merge(&shard.failed);
            for (name, method) in &shard.methods {
                stats
                    .methods
                    .entry(name.to_string())
                    .or_default()
                    .merge(method);
            }
            stats.other_methods.merge(&shard.other);
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_duration_lands_in_a_bucket_whose_top_is_within_a_quarter_of_it() {
        let mut samples: Vec<u64> = (0..5_000).collect();
        samples.extend((0..TOP_OCTAVE).flat_map(|octave| {
            let base = 1u64 << octave;
            [base - 1, base, base + 1, base + base / 3, 2 * base - 1]
        }));
        for micros in samples {
            let bucket = bucket_of(micros);
            assert!(bucket < OVERFLOW_BUCKET, "{micros} µs");
            let top = bucket_top(bucket);
            assert!(top >= micros, "{micros} µs: top {top}");
            assert!(
                top * 4 < micros * 5 || top == micros,
                "{micros} µs: top {top} is more than 1.25× it"
            );
            if bucket > 0 {
                assert!(
                    bucket_top(bucket - 1) < micros,
                    "{micros} µs: an earlier bucket (top {}) would hold it",
                    bucket_top(bucket - 1)
                );
            }
        }
        assert_eq!(bucket_of(1 << TOP_OCTAVE), OVERFLOW_BUCKET);
        assert_eq!(bucket_of(u64::MAX), OVERFLOW_BUCKET);
        assert_eq!(bucket_top(OVERFLOW_BUCKET - 1), (1 << TOP_OCTAVE) - 1);
    }

    #[test]
    fn percentiles_are_ordered_never_below_the_truth_and_capped_by_the_max() {
        let mut histogram = LatencyHistogram::default();
        // 1..=1000 ms: the true p50, p90 and p99 are 500, 900 and 990 ms.
        for millis in 1..=1000 {
            histogram.record(Duration::from_millis(millis));
        }
        assert_eq!(histogram.count(), 1000);
        let truth = [(0.5, 500), (0.9, 900), (0.99, 990), (1.0, 1000)];
        for (quantile, millis) in truth {
            let reported = histogram.percentile(quantile).unwrap();
            let exact = Duration::from_millis(millis);
            assert!(reported >= exact, "p{quantile}: {reported:?} < {exact:?}");
            assert!(
                reported < exact.mul_f64(1.25),
                "p{quantile}: {reported:?} is more than 1.25× {exact:?}"
            );
        }
        let (p50, p90, p99, max) = (
            histogram.p50().unwrap(),
            histogram.p90().unwrap(),
            histogram.p99().unwrap(),
            histogram.max().unwrap(),
        );
        assert!(p50 <= p90 && p90 <= p99 && p99 <= max);
        assert_eq!(max, Duration::from_millis(1000));
        assert_eq!(histogram.percentile(f64::NAN), histogram.percentile(0.0));
        assert_eq!(histogram.percentile(7.0), Some(max));
    }

    #[test]
    fn merged_histograms_report_the_percentiles_of_all_their_durations() {
        let (mut fast, mut slow) = (LatencyHistogram::default(), LatencyHistogram::default());
        for _ in 0..90 {
            fast.record(Duration::from_millis(2));
        }
        for _ in 0..10 {
            slow.record(Duration::from_millis(300));
        }
        fast.merge(&slow);
        assert_eq!(fast.count(), 100);
        assert!(fast.p50().unwrap() < Duration::from_millis(3));
        assert!(fast.p90().unwrap() < Duration::from_millis(3));
        assert!(fast.p99().unwrap() >= Duration::from_millis(300));
        assert_eq!(fast.max(), Some(Duration::from_millis(300)));
    }

    #[test]
    fn dynamic_method_names_beyond_the_cap_are_counted_as_other() {
        let counters = Counters::default();
        let typed: Cow<'static, str> = Cow::Borrowed("typed");
        for i in 0..MAX_DYNAMIC_METHODS + 10 {
            let name: Cow<'static, str> = Cow::Owned(format!("dynamic-{i}"));
            counters.record(&name, Ok(()), Duration::from_millis(1));
            // A name seen again keeps its own entry, cap or not.
            counters.record(&Cow::Owned("dynamic-0".into()), Ok(()), Duration::ZERO);
        }
        // A method named in the program is kept apart even once the cap is reached.
        counters.record(&typed, Err(&CallError::Timeout), Duration::from_secs(1));
        let stats = counters.snapshot();
        assert_eq!(stats.methods.len(), MAX_DYNAMIC_METHODS + 1);
        assert_eq!(stats.other_methods.ok, 10);
        assert_eq!(
            stats.methods["dynamic-0"].ok,
            MAX_DYNAMIC_METHODS as u64 + 11
        );
        let typed = &stats.methods["typed"];
        assert_eq!((typed.ok, typed.failed), (0, 1));
        assert_eq!(typed.latency.count(), 0, "a timeout is counted, not timed");
        assert_eq!(stats.calls_failed.timeout, 1);
    }

    #[test]
    fn counts_from_many_threads_add_up_and_the_cap_holds_across_them() {
        let counters = Counters::default();
        let threads = 2 * SHARDS;
        std::thread::scope(|scope| {
            for t in 0..threads {
                let counters = &counters;
                scope.spawn(move || {
                    for i in 0..1000u64 {
                        let outcome = if i % 10 == 0 {
                            Err(&CallError::Cancelled)
                        } else {
                            Ok(())
                        };
                        counters.record(&Cow::Borrowed("typed"), outcome, Duration::from_micros(i));
                    }
                    // Ten names of its own per thread: more names in all than the cap.
                    for i in 0..10 {
                        let name = Cow::Owned(format!("dynamic-{t}-{i}"));
                        counters.record(&name, Ok(()), Duration::ZERO);
                    }
                });
            }
        });
        let stats = counters.snapshot();
        let typed = &stats.methods["typed"];
        let calls = 1000 * threads as u64;
        assert_eq!((typed.ok, typed.failed), (calls * 9 / 10, calls / 10));
        assert_eq!(typed.latency.count(), calls * 9 / 10);
        assert_eq!(typed.latency.max(), Some(Duration::from_micros(999)));
        // The cap is the host's, not a shard's.
        assert_eq!(stats.methods.len(), MAX_DYNAMIC_METHODS + 1);
        assert_eq!(
            stats.other_methods.ok,
            10 * threads as u64 - MAX_DYNAMIC_METHODS as u64
        );
        assert_eq!(stats.calls_ok, calls * 9 / 10 + 10 * threads as u64);
        assert_eq!(stats.calls_failed.cancelled, calls / 10);
    }

    #[test]
    fn a_name_given_at_run_time_that_a_typed_call_used_shares_its_entry_outside_the_cap() {
        let counters = Counters::default();
        counters.record(&Cow::Borrowed("echo"), Ok(()), Duration::ZERO);
        for i in 0..MAX_DYNAMIC_METHODS {
            counters.record(&Cow::Owned(format!("dynamic-{i}")), Ok(()), Duration::ZERO);
        }
        // On another thread, whose shard has not seen the name, as on this one.
        std::thread::spawn({
            let counters = Arc::new(counters);
            move || {
                counters.record(&Cow::Owned("echo".into()), Ok(()), Duration::ZERO);
                counters.record(&Cow::Owned("echo".into()), Ok(()), Duration::ZERO);
                let stats = counters.snapshot();
                assert_eq!(stats.methods["echo"].ok, 3);
                assert_eq!(stats.other_methods.calls(), 0);
                assert_eq!(stats.methods.len(), MAX_DYNAMIC_METHODS + 1);
            }
        })
        .join()
        .unwrap();
    }
}
