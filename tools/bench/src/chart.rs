//! The PNG chart: throughput against the machine's limits, and end-to-end latency.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::error::BenchError;
use crate::report::Figures;

const FONTS: [&str; 2] =
    ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/dejavu/DejaVuSans.ttf"];
const RAW: RGBColor = RGBColor(150, 150, 150);
const OUTPOST: RGBColor = RGBColor(31, 119, 180);

/// Registers a system font for labels; without one the chart has bars only.
fn register_font() -> bool {
    for path in FONTS {
        if let Ok(bytes) = std::fs::read(path) {
            // The font lives as long as the process: plotters keeps a 'static reference.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

fn chart_error(e: impl std::fmt::Display) -> BenchError {
    BenchError::Chart(e.to_string())
}

/// Draws `figures` to `path` as a 1200×800 PNG.
pub(crate) fn draw(figures: &Figures, path: &Path) -> Result<(), BenchError> {
    let labels = register_font();
    let root = BitMapBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_error)?;
    let text = |size: u32| ("sans-serif", size).into_font().color(&BLACK);
    let (left, label_w, bar_max) = (20i32, 200i32, 820.0f64);

    // Throughput bars.
    let bars = figures.chart_bars();
    let top = 50;
    if labels {
        root.draw(&Text::new(
            "throughput per second (grey: machine limit, blue: Outpost)",
            (left, 15),
            text(20),
        ))
        .map_err(chart_error)?;
    }
    let max = bars.iter().map(|(_, _, v)| *v).fold(1.0, f64::max);
    for (i, (name, outpost, value)) in bars.iter().enumerate() {
        let y = top + i as i32 * 40;
        let w = ((value / max) * bar_max) as i32;
        let color = if *outpost { OUTPOST } else { RAW };
        root.draw(&Rectangle::new(
            [(left + label_w, y), (left + label_w + w.max(1), y + 28)],
            color.filled(),
        ))
        .map_err(chart_error)?;
        if labels {
            root.draw(&Text::new(name.clone(), (left, y + 6), text(16))).map_err(chart_error)?;
            root.draw(&Text::new(format!("{value:.0}"), (left + label_w + w + 6, y + 6), text(16)))
                .map_err(chart_error)?;
        }
    }

    // End-to-end latency: p50, p95, p99 per level.
    let top = top + bars.len() as i32 * 40 + 50;
    if labels {
        root.draw(&Text::new("end-to-end latency, ms (p50 / p95 / p99)", (left, top - 35), text(20)))
            .map_err(chart_error)?;
    }
    let max = figures.e2e.iter().map(|e| e.latency.p99).fold(1.0, f64::max);
    let shades = [RGBColor(44, 160, 44), RGBColor(255, 127, 14), RGBColor(214, 39, 40)];
    let mut y = top;
    for e in &figures.e2e {
        if labels {
            root.draw(&Text::new(
                format!("{} ({:.0}/s)", e.label, e.offered_per_second),
                (left, y + 20),
                text(16),
            ))
            .map_err(chart_error)?;
        }
        for (value, shade) in [e.latency.p50, e.latency.p95, e.latency.p99].into_iter().zip(shades) {
            let w = ((value / max) * bar_max) as i32;
            root.draw(&Rectangle::new(
                [(left + label_w, y), (left + label_w + w.max(1), y + 18)],
                shade.filled(),
            ))
            .map_err(chart_error)?;
            if labels {
                root.draw(&Text::new(format!("{value:.1}"), (left + label_w + w + 6, y + 2), text(14)))
                    .map_err(chart_error)?;
            }
            y += 20;
        }
        y += 14;
    }
    root.present().map_err(chart_error)
}
