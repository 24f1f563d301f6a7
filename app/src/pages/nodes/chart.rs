//! GPU telemetry as sparklines: samples in, SVG path data and a one-line summary out. No
//! DOM and no clock, so the server and the browser draw exactly the same thing (hydration
//! depends on it) and the drawing is unit-tested.
//!
//! A metric the driver could not give (`None`) is a gap in the line, never a zero.

use chrono::DateTime;
use tessera_domain::cluster::GpuPoint;

/// The sparkline's drawing area in SVG user units; the `<svg>` stretches it to its box.
pub const WIDTH: f64 = 240.0;
pub const HEIGHT: f64 = 40.0;
/// Keeps a line at 0 % or 100 % from being cut in half by the edge.
const INSET: f64 = 3.0;

/// Memory in use as a percentage of the GPU's memory, where both are known.
pub fn memory_pct(p: &GpuPoint) -> Option<f64> {
    match (p.memory_used_mib, p.memory_total_mib) {
        (Some(used), Some(total)) if total > 0 => Some(used as f64 * 100.0 / total as f64),
        _ => None,
    }
}

/// Whole-GPU utilization as a percentage, where the driver gives it.
pub fn utilization_pct(p: &GpuPoint) -> Option<f64> {
    p.utilization_pct.map(f64::from)
}

/// SVG path data for one percentage (0–100, clamped) of `points` (oldest first), drawn
/// from the first sample's time at x = 0 to the last one's at x = [`WIDTH`]. Each run of
/// known values is its own subpath; a lone value becomes a dot (`h0` with round caps).
/// Empty when the metric is never known.
pub fn percent_path(points: &[GpuPoint], metric: impl Fn(&GpuPoint) -> Option<f64>) -> String {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return String::new();
    };
    let span = (last.at_unix_ms - first.at_unix_ms) as f64;
    let x = |at: i64| {
        if span > 0.0 {
            (at - first.at_unix_ms) as f64 * WIDTH / span
        } else {
            WIDTH
        }
    };
    let y = |pct: f64| INSET + (1.0 - pct.clamp(0.0, 100.0) / 100.0) * (HEIGHT - 2.0 * INSET);
    let mut path = Vec::new();
    let mut run = 0usize;
    for p in points {
        match metric(p) {
            Some(v) => {
                let cmd = if run == 0 { 'M' } else { 'L' };
                path.push(format!("{cmd}{:.1} {:.1}", x(p.at_unix_ms), y(v)));
                run += 1;
            }
            None => {
                if run == 1 {
                    path.push("h0".to_owned());
                }
                run = 0;
            }
        }
    }
    if run == 1 {
        path.push("h0".to_owned());
    }
    path.join(" ")
}

/// The smallest and largest known value of a metric over `points`.
pub fn min_max(
    points: &[GpuPoint],
    metric: impl Fn(&GpuPoint) -> Option<f64>,
) -> Option<(f64, f64)> {
    points
        .iter()
        .filter_map(metric)
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// What the chart covers, for its tooltip: "10 min, 09:41–09:51 UTC (60 samples) · memory
/// 3–40 % · utilization 0–50 %". `utilization_missing` says why utilization has no line.
pub fn summary(points: &[GpuPoint], utilization_missing: &str) -> String {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return "No samples".to_owned();
    };
    let clock = |ms: i64| {
        DateTime::from_timestamp_millis(ms)
            .map(|t| t.format("%H:%M:%S").to_string())
            .unwrap_or_default()
    };
    let samples = match points.len() {
        1 => "1 sample".to_owned(),
        n => format!("{n} samples"),
    };
    let range = |name: &str, metric: fn(&GpuPoint) -> Option<f64>, missing: &str| match min_max(
        points, metric,
    ) {
        Some((lo, hi)) => format!("{name} {lo:.0}–{hi:.0} %"),
        None => format!("{name} {missing}"),
    };
    format!(
        "{}, {}–{} UTC ({samples}) · {} · {}",
        duration((last.at_unix_ms - first.at_unix_ms).max(0)),
        clock(first.at_unix_ms),
        clock(last.at_unix_ms),
        range("memory", memory_pct, "unavailable"),
        range("utilization", utilization_pct, utilization_missing),
    )
}

/// `610_000` ms → "10 min"; `40_000` → "40 s".
pub fn duration(ms: i64) -> String {
    let secs = ms / 1000;
    if secs < 120 {
        format!("{secs} s")
    } else {
        format!("{} min", (secs + 30) / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(at_s: i64, used: Option<u64>, util: Option<u32>) -> GpuPoint {
        GpuPoint {
            at_unix_ms: 1_700_000_000_000 + at_s * 1000,
            memory_used_mib: used,
            memory_total_mib: Some(1000),
            temperature_c: Some(40),
            power_mw: Some(100_000),
            utilization_pct: util,
            mig_devices: 0,
            mig_processes: 0,
        }
    }

    #[test]
    fn a_series_spans_the_width_oldest_left_and_full_at_the_top() {
        let points = [
            point(0, Some(0), Some(100)),
            point(10, Some(500), Some(50)),
            point(20, Some(1000), Some(0)),
        ];
        assert_eq!(
            percent_path(&points, memory_pct),
            "M0.0 37.0 L120.0 20.0 L240.0 3.0"
        );
        assert_eq!(
            percent_path(&points, utilization_pct),
            "M0.0 3.0 L120.0 20.0 L240.0 37.0"
        );
    }

    #[test]
    fn unknown_values_are_gaps_not_zeros() {
        let points = [
            point(0, Some(500), None),
            point(10, Some(500), None),
            point(20, None, None),
            point(30, Some(1000), None),
            point(40, None, None),
        ];
        assert_eq!(
            percent_path(&points, memory_pct),
            "M0.0 20.0 L60.0 20.0 M180.0 3.0 h0"
        );
        assert_eq!(percent_path(&points, utilization_pct), "");
        assert_eq!(min_max(&points, utilization_pct), None);
    }

    #[test]
    fn time_not_sample_index_sets_x_and_values_are_clamped() {
        // A missed report leaves a wider step; a value over 100 % stays inside the box.
        let mut points = vec![point(0, Some(0), None), point(30, Some(0), None)];
        points.push(point(40, Some(2000), None));
        assert_eq!(
            percent_path(&points, memory_pct),
            "M0.0 37.0 L180.0 37.0 L240.0 3.0"
        );
    }

    #[test]
    fn a_single_sample_is_a_dot_at_the_right_edge() {
        let points = [point(0, Some(250), Some(75))];
        assert_eq!(percent_path(&points, memory_pct), "M240.0 28.5 h0");
        assert_eq!(percent_path(&[], memory_pct), "");
    }

    #[test]
    fn the_summary_gives_time_range_and_extremes() {
        let points: Vec<GpuPoint> = (0..60)
            .map(|i| point(i * 10, Some(100 + 5 * i as u64), None))
            .collect();
        assert_eq!(
            summary(&points, "n/a (MIG on)"),
            "10 min, 22:13:20–22:23:10 UTC (60 samples) · memory 10–40 % · utilization n/a (MIG on)"
        );
        let one = [point(0, None, Some(42))];
        assert_eq!(
            summary(&one, "unavailable"),
            "0 s, 22:13:20–22:13:20 UTC (1 sample) · memory unavailable · utilization 42–42 %"
        );
        assert_eq!(summary(&[], "unavailable"), "No samples");
    }
}
