//! Daily bar charts for the usage page: values in, SVG geometry and axis labels out. No DOM
//! and no clock, so the server and the browser draw exactly the same thing (hydration
//! depends on it) and the drawing is unit-tested.
//!
//! Values are the integers the report carries (minor units of money, milli-GPU-seconds);
//! the axis steps are "nice" numbers (1, 2 or 5 × 10ⁿ) of a display unit (one minor unit,
//! a hundredth of a GPU-hour), so the labels read 0, 5.00, 10.00, … and never 3.33.

/// The chart's drawing area in SVG user units; the `<svg>` scales it to its box.
pub const WIDTH: f64 = 720.0;
pub const HEIGHT: f64 = 240.0;
/// Room for the value labels on the left and the day labels below.
pub const LEFT: f64 = 64.0;
pub const RIGHT: f64 = 8.0;
pub const TOP: f64 = 12.0;
pub const BOTTOM: f64 = 28.0;
/// Intervals on the value axis (gridlines = this + 1).
const STEPS: i64 = 4;
/// At most this many day labels under the bars.
const MAX_DAY_LABELS: usize = 12;

/// The value axis: from 0 to `top` in `STEPS` equal steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Axis {
    pub step: i64,
    pub top: i64,
}

impl Axis {
    /// The smallest nice axis that holds `max` (raw units), with steps a nice number of
    /// `unit`s (raw units per display unit). An all-zero series still gets a unit axis.
    pub fn new(max: i64, unit: i64) -> Axis {
        let unit = unit.max(1);
        let units = ceil_div(max.max(0), unit);
        let step_units = nice_ceil(ceil_div(units, STEPS).max(1));
        let step = step_units.saturating_mul(unit);
        Axis {
            step,
            top: step.saturating_mul(STEPS),
        }
    }

    /// The values of the gridlines, 0 first.
    pub fn ticks(&self) -> Vec<i64> {
        (0..=STEPS).map(|i| i * self.step).collect()
    }

    /// The y coordinate of `value` (clamped to the axis).
    pub fn y(&self, value: i64) -> f64 {
        let frac = if self.top > 0 {
            (value.clamp(0, self.top) as f64) / (self.top as f64)
        } else {
            0.0
        };
        TOP + (1.0 - frac) * plot_height()
    }
}

/// `a / b` rounded up, for `a ≥ 0` and `b > 0`.
fn ceil_div(a: i64, b: i64) -> i64 {
    a / b + i64::from(a % b != 0)
}

/// The smallest 1, 2 or 5 × 10ⁿ at or above `n` (`n ≥ 1`).
pub fn nice_ceil(n: i64) -> i64 {
    let mut magnitude = 1i64;
    loop {
        for m in [1, 2, 5] {
            let candidate = m * magnitude;
            if candidate >= n {
                return candidate;
            }
        }
        match magnitude.checked_mul(10) {
            Some(next) => magnitude = next,
            None => return n,
        }
    }
}

pub fn plot_width() -> f64 {
    WIDTH - LEFT - RIGHT
}

pub fn plot_height() -> f64 {
    HEIGHT - TOP - BOTTOM
}

/// One bar in SVG user units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bar {
    pub x: f64,
    pub y: f64,
    pub width: f64,
    pub height: f64,
}

/// The bar of day `index` of `days` for `value`. `share` is the part of the day's slot
/// the bar takes (0–1), centred in it: a wide bar and a narrower one drawn over it make
/// an overlay.
pub fn bar(index: usize, days: usize, value: i64, axis: &Axis, share: f64) -> Bar {
    let slot = plot_width() / days.max(1) as f64;
    let width = slot * share.clamp(0.05, 1.0);
    let x = LEFT + slot * index as f64 + (slot - width) / 2.0;
    let y = axis.y(value);
    Bar {
        x,
        y,
        width,
        height: (TOP + plot_height() - y).max(0.0),
    }
}

/// The x coordinate of the middle of day `index`'s slot.
pub fn slot_center(index: usize, days: usize) -> f64 {
    let slot = plot_width() / days.max(1) as f64;
    LEFT + slot * (index as f64 + 0.5)
}

/// Which days get a label: every k-th, so that at most [`MAX_DAY_LABELS`] show, always
/// the first.
pub fn labelled_days(days: usize) -> impl Iterator<Item = usize> {
    let every = days.div_ceil(MAX_DAY_LABELS).max(1);
    (0..days).step_by(every)
}

/// `2026-11-03` → `Nov 3`; anything else as is.
pub fn day_label(key: &str) -> String {
    chrono::NaiveDate::parse_from_str(key, "%Y-%m-%d")
        .map(|d| d.format("%b %-d").to_string())
        .unwrap_or_else(|_| key.to_owned())
}

/// A coordinate for an SVG attribute: one decimal, no trailing noise.
pub fn coord(v: f64) -> String {
    format!("{v:.1}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_numbers_are_one_two_or_five_times_a_power_of_ten() {
        let got: Vec<i64> = [1, 2, 3, 5, 6, 11, 20, 21, 499, 501]
            .into_iter()
            .map(nice_ceil)
            .collect();
        assert_eq!(got, vec![1, 2, 5, 5, 10, 20, 20, 50, 500, 1000]);
    }

    #[test]
    fn the_axis_holds_the_maximum_in_nice_display_steps() {
        // 12.34 USD in cents: steps of 5.00, top 20.00.
        assert_eq!(
            Axis::new(1234, 1),
            Axis {
                step: 500,
                top: 2000
            }
        );
        // 1.5 GPU-hours in milli-GPU-seconds, display unit a hundredth of an hour:
        // steps of 0.50 h.
        let centi_hour = 36_000;
        let a = Axis::new(5_400_000, centi_hour);
        assert_eq!(a.step, 50 * centi_hour);
        assert_eq!(a.ticks().len(), 5);
        assert!(a.top >= 5_400_000);
        // Nothing at all: still an axis, never a division by zero.
        assert_eq!(Axis::new(0, 1), Axis { step: 1, top: 4 });
    }

    #[test]
    fn bars_stand_on_the_baseline_and_reach_their_value() {
        let axis = Axis { step: 25, top: 100 };
        let full = bar(0, 4, 100, &axis, 1.0);
        assert_eq!(full.x, LEFT);
        assert_eq!(full.y, TOP);
        assert_eq!(full.height, plot_height());
        assert_eq!(full.width, plot_width() / 4.0);
        let half = bar(3, 4, 50, &axis, 0.5);
        assert_eq!(half.y + half.height, TOP + plot_height());
        assert_eq!(half.height, plot_height() / 2.0);
        // Narrower, centred in the last slot.
        assert_eq!(half.x + half.width / 2.0, slot_center(3, 4));
        let none = bar(1, 4, 0, &axis, 0.7);
        assert_eq!(none.height, 0.0);
    }

    #[test]
    fn long_periods_label_every_few_days() {
        assert_eq!(labelled_days(5).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        let month: Vec<usize> = labelled_days(30).collect();
        assert_eq!(month, vec![0, 3, 6, 9, 12, 15, 18, 21, 24, 27]);
        assert!(labelled_days(400).count() <= MAX_DAY_LABELS);
        assert_eq!(day_label("2026-11-03"), "Nov 3");
        assert_eq!(day_label("odd"), "odd");
    }
}
