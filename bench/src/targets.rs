//! The performance targets, each checked against the rows of this run (ratios of medians
//! measured side by side; absolute times are not targets on a shared machine).

use crate::table::{Row, Series};

/// One target: a ratio of two series of one row, and the bound it must keep.
struct Target {
    what: &'static str,
    row: &'static str,
    /// The series on top of the ratio (`None`: the row's airlock series).
    over: Option<&'static str>,
    /// The series under it.
    under: &'static str,
    /// The ratio must be at most this (`at_most`) or at least it.
    bound: f64,
    at_most: bool,
}

const TARGETS: &[Target] = &[
    Target {
        what: "small call, pinned: faster than ipc-channel's typed round trip",
        row: "small call, pinned, pipe, current-thread host",
        over: None,
        under: "ipc-channel typed",
        bound: 1.0,
        at_most: true,
    },
    Target {
        what: "small call, pinned: ≤ 1.8× a raw blocking pipe",
        row: "small call, pinned, pipe, current-thread host",
        over: None,
        under: "raw blocking pipe",
        bound: 1.8,
        at_most: true,
    },
    Target {
        what: "small call, unpinned, low-latency mode off: ≤ 1.5× a raw blocking pipe",
        row: "small call, unpinned, pipe, current-thread host",
        over: None,
        under: "raw blocking pipe",
        bound: 1.5,
        at_most: true,
    },
    Target {
        what: "pipelined, 256 in flight: ≥ 0.6× raw pipelined echo",
        row: "pipelined, 256 in flight, one worker, 2-thread host",
        over: None,
        under: "raw pipelined echo, one write per message",
        bound: 0.6,
        at_most: false,
    },
    Target {
        what: "a Pool of 2 on a 2-thread runtime: ≥ 1.5× one worker",
        row: "pipelined, 256 in flight, Pool of 2, 2-thread host",
        over: None,
        under: "one worker (Host::call)",
        bound: 1.5,
        at_most: false,
    },
    Target {
        what: "bulk 16 MiB: ≥ 0.8× raw store-and-forward echo",
        row: "bulk echo, 16 MiB body",
        over: None,
        under: "raw pipe, store and forward",
        bound: 0.8,
        at_most: false,
    },
    Target {
        what: "spawn to ready (strict): ≤ 1.5× a raw spawn",
        row: "spawn to ready",
        over: None,
        under: "raw spawn to first byte",
        bound: 1.5,
        at_most: true,
    },
    Target {
        what: "spawn to ready (none): ≤ 1.5× a raw spawn",
        row: "spawn to ready",
        over: Some("Confinement::none()"),
        under: "raw spawn to first byte",
        bound: 1.5,
        at_most: true,
    },
    Target {
        what: "a Pool spawns its workers concurrently: Pool of 4 < 4 spawns in a row",
        row: "spawn a Pool of 4 to ready",
        over: None,
        under: "4 Host spawns one after another",
        bound: 1.0,
        at_most: true,
    },
    Target {
        what: "codec: ≤ 1.10× plain postcard",
        row: "codec, decode a 100k-row table",
        over: None,
        under: "postcard::from_bytes",
        bound: 1.10,
        at_most: true,
    },
    Target {
        what: "faster than Python multiprocessing + pickle (pinned)",
        row: "small call, pinned, pipe, current-thread host",
        over: None,
        under: "Python multiprocessing Pipe + pickle",
        bound: 1.0,
        at_most: true,
    },
    Target {
        what: "faster than Python multiprocessing + pickle (unpinned)",
        row: "small call, unpinned, pipe, current-thread host",
        over: None,
        under: "Python multiprocessing Pipe + pickle",
        bound: 1.0,
        at_most: true,
    },
];

fn find<'a>(row: &'a Row, name: Option<&str>) -> Option<&'a Series> {
    match name {
        None => Some(&row.airlock),
        Some(name) => std::iter::once(&row.airlock)
            .chain(&row.baselines)
            .find(|s| s.name == name),
    }
}

/// The targets as a Markdown list, each marked met, not met, or not measured.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from("Targets (ratios of medians from this run):\n\n");
    for target in TARGETS {
        let ratio = rows
            .iter()
            .find(|r| r.name == target.row && r.skipped.is_none())
            .and_then(|row| Some((find(row, target.over)?, find(row, Some(target.under))?)))
            .map(|(over, under)| over.median() / under.median());
        let line = match ratio {
            Some(r) if r.is_finite() => {
                let met = if target.at_most {
                    r <= target.bound
                } else {
                    r >= target.bound
                };
                format!(
                    "- {}: {:.2}× — **{}**\n",
                    target.what,
                    r,
                    if met { "met" } else { "not met" }
                )
            }
            _ => format!("- {}: not measured in this run\n", target.what),
        };
        out.push_str(&line);
    }
    out
}
