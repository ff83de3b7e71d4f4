//! The process-wide Prometheus registry: CSI call histograms (upstream names
//! and buckets), module metrics, and the standard `process_*` families.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::compat;

/// The metrics registry could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot install the metrics recorder: {0}")]
pub struct MetricsError(String);

/// Renders every metric of the process.
#[derive(Clone)]
pub struct Metrics {
    handle: PrometheusHandle,
}

static INSTALLED: OnceLock<Metrics> = OnceLock::new();

/// Writes metric families of its own into the exposition (families whose
/// series come and go with objects, which the recorder cannot remove).
pub type TextSource = std::sync::Arc<dyn Fn(&mut String) + Send + Sync>;

static TEXT_SOURCES: std::sync::Mutex<Vec<TextSource>> = std::sync::Mutex::new(Vec::new());

/// Adds `source` to every later [`Metrics::render`].
pub fn add_text_source(source: TextSource) {
    TEXT_SOURCES.lock().unwrap_or_else(|e| e.into_inner()).push(source);
}

impl Metrics {
    /// Installs the global recorder once; later calls return the same one.
    pub fn install() -> Result<Metrics, MetricsError> {
        if let Some(m) = INSTALLED.get() {
            return Ok(m.clone());
        }
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(compat::metrics::OPERATIONS_SECONDS.to_string()),
                compat::metrics::OPERATIONS_SECONDS_BUCKETS,
            )
            .map_err(|e| MetricsError(e.to_string()))?
            .set_buckets_for_metric(
                Matcher::Full(crate::compat::workqueue::QUEUE_DURATION.to_string()),
                crate::compat::workqueue::DURATION_BUCKETS,
            )
            .map_err(|e| MetricsError(e.to_string()))?
            .set_buckets_for_metric(
                Matcher::Full(crate::compat::workqueue::WORK_DURATION.to_string()),
                crate::compat::workqueue::DURATION_BUCKETS,
            )
            .map_err(|e| MetricsError(e.to_string()))?
            .install_recorder()
            .map_err(|e| MetricsError(e.to_string()))?;
        metrics::describe_histogram!(
            compat::metrics::OPERATIONS_SECONDS,
            metrics::Unit::Seconds,
            compat::metrics::OPERATIONS_SECONDS_HELP
        );
        let m = Metrics { handle };
        Ok(INSTALLED.get_or_init(|| m).clone())
    }

    /// Prometheus text exposition of everything.
    pub fn render(&self) -> String {
        let mut text = self.handle.render();
        let sources = TEXT_SOURCES.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for source in sources {
            source(&mut text);
        }
        process::append(&mut text);
        text
    }

    /// Drains histogram buffers; call every few seconds.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }
}

/// `process_*` metrics as the Prometheus client libraries define them, read
/// from `/proc/self` at scrape time.
mod process {
    use std::fmt::Write as _;

    fn stat_fields() -> Option<Vec<String>> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the parenthesised command name, which may contain spaces.
        let after = stat.rsplit_once(')')?.1;
        Some(after.split_whitespace().map(String::from).collect())
    }

    fn boot_time() -> Option<u64> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
    }

    fn max_fds() -> Option<u64> {
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok().map(|(soft, _)| soft)
    }

    pub(super) fn append(out: &mut String) {
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096) as f64;
        let mut put = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n");
        };
        // Field indices are 1-based in proc(5); the slice starts at field 3 (state).
        if let Some(f) = stat_fields() {
            let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok());
            if let (Some(utime), Some(stime)) = (num(14), num(15)) {
                put(
                    "process_cpu_seconds_total",
                    "counter",
                    "Total user and system CPU time spent in seconds.",
                    (utime + stime) / ticks,
                );
            }
            if let Some(vsize) = num(23) {
                put("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", vsize);
            }
            if let Some(rss) = num(24) {
                put("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", rss * page);
            }
            if let (Some(start), Some(btime)) = (num(22), boot_time()) {
                put(
                    "process_start_time_seconds",
                    "gauge",
                    "Start time of the process since unix epoch in seconds.",
                    btime as f64 + start / ticks,
                );
            }
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            put("process_open_fds", "gauge", "Number of open file descriptors.", dir.count() as f64);
        }
        if let Some(max) = max_fds() {
            put("process_max_fds", "gauge", "Maximum number of open file descriptors.", max as f64);
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn process_families_are_present_and_numeric() {
            let mut out = String::new();
            super::append(&mut out);
            for name in [
                "process_cpu_seconds_total",
                "process_resident_memory_bytes",
                "process_start_time_seconds",
                "process_open_fds",
            ] {
                let line = out
                    .lines()
                    .find(|l| l.starts_with(&format!("{name} ")))
                    .unwrap_or_else(|| panic!("{name} missing:\n{out}"));
                let v: f64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("numeric value");
                assert!(v >= 0.0);
            }
            let rss: f64 = out
                .lines()
                .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
                .and_then(|v| v.parse().ok())
                .expect("rss");
            assert!(rss > 100_000.0, "a running test process has more than 100 kB resident: {rss}");
        }
    }
}
