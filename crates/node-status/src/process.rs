//! The `process_*` metrics Prometheus' Go client registers by default (Istio's daemon exports
//! them), read from `/proc/self` at each scrape: CPU time, resident and virtual memory and its
//! limit, open and maximum file descriptors, start time, the network namespace's IP octets. A
//! value that cannot be read is left out.

use crate::metrics::header;

/// Fields of `/proc/self/stat` after the command (which may hold spaces and parentheses).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().collect())
}

fn sysconf(name: libc::c_int) -> Option<f64> {
    // SAFETY: sysconf only reads a configuration value.
    let v = unsafe { libc::sysconf(name) };
    (v > 0).then_some(v as f64)
}

/// `btime` of `/proc/stat`: boot time, seconds since the epoch.
fn boot_time(proc_stat: &str) -> Option<f64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of "Max open files" in `/proc/self/limits`.
fn max_fds(limits: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    soft.parse().ok()
}

/// The soft limit of "Max address space" in `/proc/self/limits`; `unlimited` is Go's
/// `^uint64(0)`, as Prometheus' Go client reports it.
fn max_address_space(limits: &str) -> Option<f64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    match line["Max address space".len()..]
        .split_whitespace()
        .next()?
    {
        "unlimited" => Some(u64::MAX as f64),
        soft => soft.parse().ok(),
    }
}

/// `IpExt`'s `InOctets` and `OutOctets` in `/proc/self/net/netstat` (the process's network
/// namespace: with `hostNetwork`, the node's), as Prometheus' Go client reads them.
fn ip_octets(netstat: &str) -> Option<(f64, f64)> {
    let mut ip_ext = netstat.lines().filter(|l| l.starts_with("IpExt:"));
    let (names, values) = (ip_ext.next()?, ip_ext.next()?);
    let field = |want: &str| {
        let i = names.split_whitespace().position(|n| n == want)?;
        values.split_whitespace().nth(i)?.parse().ok()
    };
    Some((field("InOctets")?, field("OutOctets")?))
}

/// `process_virtual_memory_max_bytes` and the network pair, from `/proc/self/limits` and
/// `/proc/self/net/netstat`.
fn limits_and_network(
    limits: &str,
    netstat: &str,
) -> Vec<(&'static str, &'static str, &'static str, f64)> {
    let mut out = Vec::new();
    if let Some(v) = max_address_space(limits) {
        out.push((
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
            "gauge",
            v,
        ));
    }
    if let Some((rx, tx)) = ip_octets(netstat) {
        out.push((
            "process_network_receive_bytes_total",
            "Number of bytes received by the process over the network.",
            "counter",
            rx,
        ));
        out.push((
            "process_network_transmit_bytes_total",
            "Number of bytes sent by the process over the network.",
            "counter",
            tx,
        ));
    }
    out
}

/// The values, by name, from the texts of `/proc/self/stat`, `/proc/stat` and `/proc/self/limits`.
fn values(
    stat: &str,
    proc_stat: &str,
    limits: &str,
    fds: Option<usize>,
) -> Vec<(&'static str, &'static str, &'static str, f64)> {
    let mut out = Vec::new();
    let tck = sysconf(libc::_SC_CLK_TCK).unwrap_or(100.0);
    let page = sysconf(libc::_SC_PAGESIZE).unwrap_or(4096.0);
    // Fields counted from 3 (state) in proc(5): utime 14, stime 15, starttime 22, vsize 23, rss 24.
    let f = stat_fields(stat).unwrap_or_default();
    let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok());
    if let (Some(u), Some(s)) = (num(14), num(15)) {
        out.push((
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            "counter",
            (u + s) / tck,
        ));
    }
    if let Some(n) = fds {
        out.push((
            "process_open_fds",
            "Number of open file descriptors.",
            "gauge",
            n as f64,
        ));
    }
    if let Some(m) = max_fds(limits) {
        out.push((
            "process_max_fds",
            "Maximum number of open file descriptors.",
            "gauge",
            m,
        ));
    }
    if let Some(v) = num(23) {
        out.push((
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            "gauge",
            v,
        ));
    }
    if let Some(r) = num(24) {
        out.push((
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            "gauge",
            r * page,
        ));
    }
    if let (Some(start), Some(boot)) = (num(22), boot_time(proc_stat)) {
        out.push((
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            "gauge",
            boot + start / tck,
        ));
    }
    out
}

/// Renders the families (Prometheus' Go client's names and help texts).
pub fn render(out: &mut String) {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let fds = std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count());
    let limits = read("/proc/self/limits");
    let mut all = values(&read("/proc/self/stat"), &read("/proc/stat"), &limits, fds);
    all.extend(limits_and_network(&limits, &read("/proc/self/net/netstat")));
    for (name, help, kind, v) in all {
        header(out, name, help, kind);
        out.push_str(&format!("{name} {v}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_texts() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 4 0 1000 8192000 300 18446744073709551615";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        let v = values(stat, "cpu 1 2\nbtime 1700000000\n", limits, Some(7));
        let get = |n: &str| v.iter().find(|x| x.0 == n).map(|x| x.3);
        let tck = sysconf(libc::_SC_CLK_TCK).unwrap_or(100.0);
        let page = sysconf(libc::_SC_PAGESIZE).unwrap_or(4096.0);
        assert_eq!(get("process_cpu_seconds_total"), Some(300.0 / tck));
        assert_eq!(get("process_open_fds"), Some(7.0));
        assert_eq!(get("process_max_fds"), Some(1024.0));
        assert_eq!(get("process_virtual_memory_bytes"), Some(8192000.0));
        assert_eq!(get("process_resident_memory_bytes"), Some(300.0 * page));
        assert_eq!(
            get("process_start_time_seconds"),
            Some(1700000000.0 + 1000.0 / tck)
        );
        assert!(values("garbage", "", "", None).is_empty());
        let limits = format!(
            "{limits}Max address space         unlimited            unlimited            bytes\n"
        );
        let netstat =
            "TcpExt: A B\nTcpExt: 1 2\nIpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 1234 5678\n";
        let more = limits_and_network(&limits, netstat);
        let get = |n: &str| more.iter().find(|x| x.0 == n).map(|x| x.3);
        assert_eq!(
            get("process_virtual_memory_max_bytes"),
            Some(u64::MAX as f64)
        );
        assert_eq!(get("process_network_receive_bytes_total"), Some(1234.0));
        assert_eq!(get("process_network_transmit_bytes_total"), Some(5678.0));
        assert!(limits_and_network("", "").is_empty());
        let mut s = String::new();
        render(&mut s);
        for n in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
            "process_virtual_memory_bytes",
            "process_virtual_memory_max_bytes",
            "process_network_receive_bytes_total",
        ] {
            assert!(s.contains(&format!("\n{n} ")), "{n}: {s}");
        }
    }
}
