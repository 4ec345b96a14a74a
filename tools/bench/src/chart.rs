//! The PNG chart: throughput against the machine's limits, and end-to-end latency against
//! offered load.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::error::BenchError;
use crate::figures::Figures;

const FONTS: [&str; 2] =
    ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/dejavu/DejaVuSans.ttf"];
const HEIGHT: u32 = 1000;
const RAW: RGBColor = RGBColor(150, 150, 150);
const IDEMPOST: RGBColor = RGBColor(31, 119, 180);

/// Registers a system font for labels; without one the chart has bars only.
pub(crate) fn register_font() -> bool {
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

/// Draws `figures` to `path` as a 1200×1000 PNG.
pub(crate) fn draw(figures: &Figures, path: &Path) -> Result<(), BenchError> {
    let labels = register_font();
    let root = BitMapBackend::new(path, (1200, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_error)?;
    let text = |size: u32| ("sans-serif", size).into_font().color(&BLACK);
    let (left, label_w, bar_max) = (20i32, 200i32, 820.0f64);

    // Throughput bars.
    let bars = figures.chart_bars();
    let top = 50;
    if labels {
        root.draw(&Text::new(
            "throughput per second (grey: machine limit, blue: Idempost)",
            (left, 15),
            text(20),
        ))
        .map_err(chart_error)?;
    }
    let max = bars.iter().map(|(_, _, v)| *v).fold(1.0, f64::max);
    for (i, (name, idempost, value)) in bars.iter().enumerate() {
        let y = top + i as i32 * 40;
        let w = ((value / max) * bar_max) as i32;
        let color = if *idempost { IDEMPOST } else { RAW };
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

    // End-to-end latency against offered load: p50, p95, p99 per level.
    let top = (top + bars.len() as i32 * 40 + 20).min(HEIGHT as i32 - 300);
    let area = root.margin(top, 10, 10, 10);
    let mut levels: Vec<_> = figures.e2e.iter().filter(|e| e.latency.samples > 0).collect();
    levels.sort_by(|a, b| a.offered_per_second.total_cmp(&b.offered_per_second));
    let x_max = levels.iter().map(|e| e.offered_per_second).fold(1.0, f64::max) * 1.05;
    let y_max = levels.iter().map(|e| e.latency.p99).fold(1.0, f64::max) * 1.1;
    let mut builder = ChartBuilder::on(&area);
    if labels {
        builder
            .caption("end-to-end latency (ms) against offered load (orders/s)", ("sans-serif", 20))
            .x_label_area_size(35)
            .y_label_area_size(60);
    }
    let mut chart = builder.build_cartesian_2d(0.0..x_max, 0.0..y_max).map_err(chart_error)?;
    if labels {
        chart.configure_mesh().x_desc("offered load, orders/s").y_desc("ms").draw().map_err(chart_error)?;
    }
    let shades =
        [("p50", RGBColor(44, 160, 44)), ("p95", RGBColor(255, 127, 14)), ("p99", RGBColor(214, 39, 40))];
    for (i, (name, shade)) in shades.into_iter().enumerate() {
        let points: Vec<(f64, f64)> = levels
            .iter()
            .map(|e| {
                let value = [e.latency.p50, e.latency.p95, e.latency.p99][i];
                (e.offered_per_second, value)
            })
            .collect();
        let series =
            chart.draw_series(LineSeries::new(points.clone(), shade.stroke_width(2))).map_err(chart_error)?;
        if labels {
            series
                .label(name)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], shade.stroke_width(2)));
        }
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 4, shade.filled())))
            .map_err(chart_error)?;
    }
    if labels {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(chart_error)?;
    }
    root.present().map_err(chart_error)
}
