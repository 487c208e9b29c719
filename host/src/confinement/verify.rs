//! The host's check, from outside, that a worker runs under what was asked: it reads
//! `/proc/<pid>/status` and the namespace links itself and never takes the worker's word.
//!
//! Checked before the first call: `Uid`/`Gid` (never 0 when confined; the identity the host
//! mapped), `NoNewPrivs: 1`, `Seccomp: 2` with at least the host's filters, empty `CapEff`,
//! `CapPrm` (and `CapBnd` in namespaces), `PPid` (the keeper, so the pid names the process the
//! keeper created), and every namespace link different from the host's. After the `Hello`,
//! whether the worker added its own allowlist (`Seccomp_filters` above the host's).

use super::error::ConfinementError;
use super::namespaces::CHECKED_NAMESPACES;
use super::report::ConfinementReport;

/// The fields of `/proc/<pid>/status` the checks read.
#[derive(Debug, Default)]
struct Status {
    ppid: Option<u32>,
    uids: Vec<u32>,
    gids: Vec<u32>,
    no_new_privs: Option<u32>,
    seccomp: Option<u32>,
    seccomp_filters: Option<u32>,
    cap_eff: Option<u64>,
    cap_prm: Option<u64>,
    cap_bnd: Option<u64>,
}

fn read_status(path: &str) -> Result<Status, ConfinementError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfinementError::Verification {
        check: "/proc/<pid>/status",
        expected: "readable".into(),
        found: e.to_string(),
    })?;
    let mut status = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let number = || value.parse::<u32>().ok();
        let hex = || u64::from_str_radix(value, 16).ok();
        let list = || {
            value
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect::<Vec<u32>>()
        };
        match key {
            "PPid" => status.ppid = number(),
            "Uid" => status.uids = list(),
            "Gid" => status.gids = list(),
            "NoNewPrivs" => status.no_new_privs = number(),
            "Seccomp" => status.seccomp = number(),
            "Seccomp_filters" => status.seccomp_filters = number(),
            "CapEff" => status.cap_eff = hex(),
            "CapPrm" => status.cap_prm = hex(),
            "CapBnd" => status.cap_bnd = hex(),
            _ => {}
        }
    }
    Ok(status)
}

fn mismatch(
    check: &'static str,
    expected: impl ToString,
    found: impl std::fmt::Debug,
) -> ConfinementError {
    ConfinementError::Verification {
        check,
        expected: expected.to_string(),
        found: format!("{found:?}"),
    }
}

/// Checks the worker `pid` (child of `keeper`, or the host's own child when `keeper` is
/// `None`) against `expected`, and returns what was found.
pub(crate) fn verify_spawned(
    pid: u32,
    keeper: Option<u32>,
    expected: &ConfinementReport,
) -> Result<ConfinementReport, ConfinementError> {
    let status = read_status(&format!("/proc/{pid}/status"))?;
    if let Some(keeper) = keeper {
        if status.ppid != Some(keeper) {
            return Err(mismatch("PPid", keeper, status.ppid));
        }
    }
    if status.uids.len() != 4 || status.uids.iter().any(|u| *u != expected.uid || *u == 0) {
        return Err(mismatch("Uid", expected.uid, &status.uids));
    }
    if status.gids.first() == Some(&0) {
        return Err(mismatch("Gid", "not 0", &status.gids));
    }
    if status.no_new_privs != Some(1) {
        return Err(mismatch("NoNewPrivs", 1, status.no_new_privs));
    }
    if expected.seccomp_filters > 0
        && (status.seccomp != Some(2)
            || status.seccomp_filters.unwrap_or(0) < expected.seccomp_filters)
    {
        return Err(mismatch(
            "Seccomp_filters",
            format!("mode 2, at least {}", expected.seccomp_filters),
            (status.seccomp, status.seccomp_filters),
        ));
    }
    if status.cap_eff != Some(0) || status.cap_prm != Some(0) {
        return Err(mismatch(
            "CapEff/CapPrm",
            "0",
            (status.cap_eff, status.cap_prm),
        ));
    }
    if expected.namespaces {
        if status.cap_bnd != Some(0) {
            return Err(mismatch("CapBnd", "0", status.cap_bnd));
        }
        for ns in CHECKED_NAMESPACES {
            let ours = std::fs::read_link(format!("/proc/self/ns/{ns}"));
            let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}"));
            match (ours, theirs) {
                (Ok(ours), Ok(theirs)) if ours != theirs => {}
                (ours, theirs) => {
                    return Err(ConfinementError::Verification {
                        check: "namespace",
                        expected: format!("a {ns} namespace other than the host's ({ours:?})"),
                        found: format!("{theirs:?}"),
                    })
                }
            }
        }
    }
    Ok(ConfinementReport {
        pid,
        seccomp_filters: status.seccomp_filters.unwrap_or(0),
        ..expected.clone()
    })
}

/// Whether the worker runs under the host's own seccomp filter, as verified at its spawn: the
/// policy installed it (not `none()`, nor a `best_effort()` that went without it) and the
/// worker carries at least its filters. Filters the host itself runs under (a container's)
/// count for nothing here: they may allow what the host's denies.
///
/// Callers write their own frames, and look for their answers, only on the pipes of such a
/// worker: it cannot hold a pipe's lock inside the kernel for as long as it likes, as the
/// filter denies `userfaultfd` (a read into a page whose fault nobody serves) and answers
/// `splice`, `tee`, `vmsplice` and `sendfile` `ENOSYS` (a copy it makes slow still holds one
/// for seconds: SECURITY.md). Any other worker's pipes are written by the writer task alone.
pub(crate) fn runs_the_hosts_filter(report: &ConfinementReport) -> bool {
    report.mode != super::ConfinementMode::None
        && !report.missing.contains(&super::Feature::Seccomp)
        && report.seccomp_filters >= report.inherited_filters + super::seccomp::HOST_FILTERS
}

/// After the worker's `Hello`: records whether it installed its own allowlist, and refuses
/// it if the policy requires one and it did not. Its own is any filter beyond those it was
/// started under: the ones its host's spawning thread ran under (a container's) and the
/// host's own, where they were installed.
pub(crate) fn verify_worker_filter(
    report: &mut ConfinementReport,
    required: bool,
) -> Result<(), ConfinementError> {
    if report.mode == super::ConfinementMode::None {
        return Ok(());
    }
    let status = read_status(&format!("/proc/{}/status", report.pid))?;
    let filters = status.seccomp_filters.unwrap_or(0);
    let hosts = if report.missing.contains(&super::Feature::Seccomp) {
        0
    } else {
        super::seccomp::HOST_FILTERS
    };
    let started_under = report.inherited_filters + hosts;
    report.seccomp_filters = filters;
    report.worker_filter = filters > started_under;
    if required && !report.worker_filter {
        return Err(mismatch(
            "Seccomp_filters",
            format!(
                "more than the {started_under} it was started under (the host's {hosts} and \
                 {} its host's thread ran under): the worker's own allowlist",
                report.inherited_filters
            ),
            filters,
        ));
    }
    Ok(())
}

/// How many seccomp filters the calling thread runs under (its `Seccomp_filters`): on the
/// thread that forks a worker, what the worker inherits before the host adds its own.
pub(crate) fn filters_of_this_thread() -> Result<u32, ConfinementError> {
    Ok(read_status("/proc/thread-self/status")?
        .seccomp_filters
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confinement::{ConfinementMode, Feature};

    fn report(mode: ConfinementMode, filters: u32, missing: Vec<Feature>) -> ConfinementReport {
        ConfinementReport {
            mode,
            seccomp_filters: filters,
            missing,
            ..ConfinementReport::unconfined(2, 65534)
        }
    }

    /// Only a worker the host's own filter was installed on, and verified on, has its pipes
    /// read and written by callers: filters it inherited (the host's container's) say nothing
    /// of `splice` or `userfaultfd`.
    #[test]
    fn only_a_worker_under_the_hosts_own_filter_has_its_pipes_used_by_callers() {
        let host = crate::confinement::seccomp::HOST_FILTERS;
        let strict = ConfinementMode::Strict;
        assert!(runs_the_hosts_filter(&report(strict, host, Vec::new())));
        assert!(runs_the_hosts_filter(&report(strict, host + 1, Vec::new())));
        // Unconfined, or best effort without the filter, under a container's filters.
        let none = report(ConfinementMode::None, host + 1, Vec::new());
        assert!(!runs_the_hosts_filter(&none));
        let without = report(strict, host + 1, vec![Feature::Seccomp]);
        assert!(!runs_the_hosts_filter(&without));
        assert!(!runs_the_hosts_filter(&report(
            strict,
            host - 1,
            Vec::new()
        )));
        // Under a container's filter, the host's own must come on top of it.
        let inherited = |filters| ConfinementReport {
            inherited_filters: 1,
            ..report(strict, filters, Vec::new())
        };
        assert!(!runs_the_hosts_filter(&inherited(host)));
        assert!(runs_the_hosts_filter(&inherited(host + 1)));
    }
}
