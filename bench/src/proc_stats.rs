//! What the kernel counts, read from `/proc`: for a process, minor page faults (for the bulk
//! rows), CPU time (for the pipelined rows) and the resident set with its peak (for the host's
//! peak-RSS row); for the machine, the CPU time a hypervisor gave to other guests (how noisy a
//! run was).

use crate::links::Error;

/// Minor page faults of the whole process `pid` (`None`: this one) so far, from field 10
/// (`minflt`) of `/proc/<pid>/stat`. Every thread's faults count.
pub fn minor_faults(pid: Option<u32>) -> Result<u64, Error> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".into(),
    };
    let stat = std::fs::read_to_string(&path)?;
    // The command name (field 2) is in parentheses and may hold spaces or ')': the fields
    // after it start behind the last ')'. From there, `minflt` is the eighth.
    let (_, rest) = stat
        .rsplit_once(')')
        .ok_or_else(|| format!("{path}: no command name"))?;
    let minflt = rest
        .split_ascii_whitespace()
        .nth(7)
        .ok_or_else(|| format!("{path}: too few fields"))?;
    Ok(minflt.parse()?)
}

/// CPU time the whole process `pid` (`None`: this one) has run so far, in nanoseconds: the sum
/// over its threads of the first field of `/proc/<pid>/task/<tid>/schedstat` (time on a CPU,
/// to the nanosecond, where `/proc/<pid>/stat` counts 10 ms ticks). A thread that exits
/// between two readings takes its time with it, so measure processes whose threads live on.
pub fn cpu_nanos(pid: Option<u32>) -> Result<u64, Error> {
    let tasks = match pid {
        Some(pid) => format!("/proc/{pid}/task"),
        None => "/proc/self/task".into(),
    };
    let mut total = 0u64;
    for task in std::fs::read_dir(&tasks)? {
        let path = task?.path().join("schedstat");
        // A thread that ended since the directory was listed has nothing more to add.
        let Ok(stat) = std::fs::read_to_string(&path) else {
            continue;
        };
        let on_cpu = stat
            .split_ascii_whitespace()
            .next()
            .ok_or_else(|| format!("{}: empty", path.display()))?;
        total += on_cpu.parse::<u64>()?;
    }
    Ok(total)
}

/// This process's resident set now and its peak, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Resident {
    /// `VmRSS`.
    pub now: u64,
    /// `VmHWM`: the most resident since the process started or [`reset_peak`] last ran.
    pub peak: u64,
}

/// This process's resident set, from `/proc/self/status`.
pub fn resident() -> Result<Resident, Error> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> Result<u64, Error> {
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().strip_suffix("kB"))
            .ok_or_else(|| format!("/proc/self/status: no {name}"))?;
        Ok(kib.trim().parse::<u64>()? * 1024)
    };
    Ok(Resident {
        now: field("VmRSS:")?,
        peak: field("VmHWM:")?,
    })
}

/// Lowers this process's `VmHWM` to its current resident set (`5` to `/proc/self/clear_refs`,
/// Linux 4.0 and later), so a peak measured next belongs to what runs next.
pub fn reset_peak() -> Result<(), Error> {
    std::fs::write("/proc/self/clear_refs", "5")?;
    Ok(())
}

/// The machine's CPU time so far, summed over its CPUs, in clock ticks: all of it, and the
/// part a hypervisor ran other guests in while this one wanted to run (`steal`), from the
/// `cpu` line of `/proc/stat`.
#[derive(Clone, Copy, Debug)]
pub struct CpuTicks {
    /// Every field of the line: user, nice, system, idle, iowait, irq, softirq, steal.
    pub total: u64,
    /// The eighth field.
    pub steal: u64,
}

impl CpuTicks {
    /// Reads them now.
    pub fn now() -> Result<Self, Error> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let line = stat
            .lines()
            .find(|l| l.starts_with("cpu "))
            .ok_or("/proc/stat: no cpu line")?;
        let fields: Vec<u64> = line
            .split_ascii_whitespace()
            .skip(1)
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        Ok(Self {
            total: fields.iter().sum(),
            steal: fields.get(7).copied().unwrap_or(0),
        })
    }

    /// The share of the CPUs' time stolen since `earlier`, in percent.
    pub fn stolen_since(self, earlier: Self) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        let steal = self.steal.saturating_sub(earlier.steal);
        if total == 0 {
            return 0.0;
        }
        steal as f64 * 100.0 / total as f64
    }
}
