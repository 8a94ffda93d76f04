//! A process's own resource use from /proc, for the benchmarks and the daemon's cost tests.

use std::fs;

/// A `/proc/PID/status` value in kB (`VmRSS:`, `VmHWM:`, ...); 0 when the process or the key
/// is gone.
pub fn status_kb(pid: u32, key: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The process's CPU time (utime + stime), in seconds (10 ms ticks).
#[track_caller]
pub fn cpu_s(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process's stat");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0 // USER_HZ
}

/// How many descriptors the process holds open; 0 when it is gone.
pub fn open_fds(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}
