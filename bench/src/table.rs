//! Results: per-repetition samples, their medians and ranges, the ratio of each airlock row to
//! the baselines measured beside it, and the three ways they are written out (the printed
//! table, `target/airlock-bench.json`, `BENCHMARKS.md`).

use serde::{Deserialize, Serialize};

/// What a row's numbers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unit {
    /// Microseconds per operation: lower is better.
    Micros,
    /// Milliseconds per operation: lower is better.
    Millis,
    /// Thousands of calls per second: higher is better.
    KiloPerSec,
    /// Gigabytes per second: higher is better.
    GigaBytesPerSec,
    /// Mebibytes (a peak resident set): lower is better.
    MiB,
    /// A count per call (page faults, allocations, bytes allocated): lower is better.
    PerCall,
    /// CPUs kept busy: CPU time over wall time, across the processes measured.
    Cpus,
}

impl Unit {
    fn label(self) -> &'static str {
        match self {
            Unit::Micros => "µs",
            Unit::Millis => "ms",
            Unit::KiloPerSec => "k/s",
            Unit::GigaBytesPerSec => "GB/s",
            Unit::MiB => "MiB",
            Unit::PerCall => "per call",
            Unit::Cpus => "CPUs",
        }
    }
}

/// One measured series: a name and its samples, one per repetition.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Series {
    /// What was measured.
    pub name: String,
    /// One figure per repetition, in the row's unit.
    pub samples: Vec<f64>,
}

impl Series {
    /// An empty series named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            samples: Vec::new(),
        }
    }

    /// The median of the samples (the mean of the middle two for an even count).
    pub fn median(&self) -> f64 {
        let mut sorted = self.samples.clone();
        sorted.sort_by(f64::total_cmp);
        match sorted.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => sorted[n / 2],
            n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        }
    }

    fn min(&self) -> f64 {
        self.samples.iter().copied().fold(f64::INFINITY, f64::min)
    }

    fn max(&self) -> f64 {
        self.samples
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max)
    }

    fn figure(&self) -> String {
        format!(
            "{} ({}–{})",
            number(self.median()),
            number(self.min()),
            number(self.max())
        )
    }
}

/// A row: airlock's series and the baselines measured in the same repetitions.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// What the row measures, e.g. `small call, pinned, pipe`.
    pub name: String,
    /// The unit of every series in the row.
    pub unit: Unit,
    /// airlock's own figures.
    pub airlock: Series,
    /// Baselines, each measured interleaved with `airlock`.
    pub baselines: Vec<Series>,
    /// A row that could not be measured says why instead (`python3` missing...).
    pub skipped: Option<String>,
}

impl Row {
    /// A row with no samples yet.
    pub fn new(name: impl Into<String>, unit: Unit, airlock: &str, baselines: &[&str]) -> Self {
        Self {
            name: name.into(),
            unit,
            airlock: Series::new(airlock),
            baselines: baselines.iter().map(|b| Series::new(*b)).collect(),
            skipped: None,
        }
    }

    /// airlock's median over the baseline's, as "× baseline" (for throughput, a figure above
    /// 1 is airlock ahead; for times, below 1 is).
    pub fn ratio(&self, baseline: &Series) -> f64 {
        self.airlock.median() / baseline.median()
    }
}

/// A ratio as the table shows it; "–" where it has no value (a baseline of zero faults).
fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}×")
    } else {
        "–".into()
    }
}

fn number(x: f64) -> String {
    if !x.is_finite() {
        "–".into()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// The rows as a Markdown table (one line per airlock-and-baseline pair), the form both the
/// terminal and `BENCHMARKS.md` get.
pub fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| measure | unit | airlock median (min–max) | baseline | baseline median (min–max) | ratio |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for row in rows {
        if let Some(why) = &row.skipped {
            out.push_str(&format!(
                "| {} | {} | skipped: {why} | | | |\n",
                row.name,
                row.unit.label()
            ));
            continue;
        }
        let airlock = format!("{}: {}", row.airlock.name, row.airlock.figure());
        if row.baselines.is_empty() {
            out.push_str(&format!(
                "| {} | {} | {airlock} | | | |\n",
                row.name,
                row.unit.label()
            ));
        }
        for (i, baseline) in row.baselines.iter().enumerate() {
            let (name, shown) = if i == 0 {
                (row.name.as_str(), airlock.as_str())
            } else {
                ("", "")
            };
            out.push_str(&format!(
                "| {name} | {} | {shown} | {} | {} | {} |\n",
                row.unit.label(),
                baseline.name,
                baseline.figure(),
                ratio(row.ratio(baseline))
            ));
        }
    }
    out
}

/// Where, when and how a run was made.
pub struct Run {
    /// The CPU model, its count and the kernel.
    pub machine: String,
    /// The command that made the run.
    pub command: &'static str,
    /// The day (UTC).
    pub date: String,
    /// The share of the CPUs' time, in percent, that the hypervisor gave to other guests while
    /// the run wanted it (`steal` in `/proc/stat`): how much of the run's noise came from
    /// neighbours on a shared machine.
    pub stolen: f64,
}

impl Run {
    /// The line the generated part of `BENCHMARKS.md` starts with.
    pub fn markdown(&self) -> String {
        format!(
            "Measured {} on {} with `{}`. While it ran, the hypervisor gave {:.0}% of the \
             CPUs' time to other guests (steal, `/proc/stat`).",
            self.date, self.machine, self.command, self.stolen
        )
    }
}

/// The rows as JSON (written by hand: a flat schema of strings and numbers needs no library).
pub fn json(rows: &[Row], run: &Run) -> String {
    fn series(s: &Series) -> String {
        let samples: Vec<String> = s.samples.iter().map(|x| format!("{x}")).collect();
        format!(
            "{{\"name\":{},\"median\":{},\"samples\":[{}]}}",
            quoted(&s.name),
            finite(s.median()),
            samples.join(",")
        )
    }
    let rows: Vec<String> = rows
        .iter()
        .map(|row| {
            let baselines: Vec<String> = row
                .baselines
                .iter()
                .map(|b| {
                    format!(
                        "{{\"series\":{},\"ratio\":{}}}",
                        series(b),
                        finite(row.ratio(b))
                    )
                })
                .collect();
            format!(
                "{{\"name\":{},\"unit\":{},\"skipped\":{},\"airlock\":{},\"baselines\":[{}]}}",
                quoted(&row.name),
                quoted(row.unit.label()),
                row.skipped.as_deref().map_or("null".into(), quoted),
                series(&row.airlock),
                baselines.join(",")
            )
        })
        .collect();
    format!(
        "{{\"machine\":{},\"command\":{},\"date\":{},\"steal_percent\":{},\"rows\":[{}]}}\n",
        quoted(&run.machine),
        quoted(run.command),
        quoted(&run.date),
        finite(run.stolen),
        rows.join(",\n")
    )
}

fn finite(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
