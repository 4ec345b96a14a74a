//! The soak's chart: one panel per measure over the soak's time, the held snapshot's stage
//! between two grey lines.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::retention::Purge;
use super::{Soak, Window};
use crate::error::BenchError;

fn chart_error(e: impl std::fmt::Display) -> BenchError {
    BenchError::Chart(e.to_string())
}

const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(120, 120, 120),
];

/// One line of a panel: its name and a value per window. The lags are drawn at the end of the
/// window the events were created in, everything else when it was sampled.
type Line<'a> = (&'a str, fn(&Window) -> f64);

fn line(name: &str, value: fn(&Window) -> f64) -> Line<'_> {
    (name, value)
}

/// Draws `soak` to `path` as a 1200×2100 PNG.
pub(crate) fn draw(soak: &Soak, path: &Path) -> Result<(), BenchError> {
    // Without a font the panels would have no captions or legends: the run fails instead.
    if !crate::chart::register_font() {
        return Err(BenchError::Chart("no DejaVu Sans font for the soak chart's labels".into()));
    }
    let root = BitMapBackend::new(path, (1200, 2100)).into_drawing_area();
    root.fill(&WHITE).map_err(chart_error)?;
    let panels = root.split_evenly((7, 1));
    let floor = soak.floor.0.p99;
    let cleanup = if soak.windows.iter().any(|w| w.cleanup.history_length > 0) {
        line("InnoDB history list length", |w| w.cleanup.history_length as f64)
    } else {
        line("outbox dead rows", |w| w.cleanup.outbox_dead as f64)
    };
    let specs: [(String, Vec<Line<'_>>); 5] = [
        (
            format!(
                "lag of the events created in each 10 s (ms); raw floor's publish p99 at this rate: {floor:.1} ms"
            ),
            vec![
                line("publish p50", |w| w.publish.p50),
                line("publish p99", |w| w.publish.p99),
                line("consume p50", |w| w.consume.p50),
                line("consume p99", |w| w.consume.p99),
            ],
        ),
        (
            "relay statements per batch (ms)".into(),
            vec![
                line("claim p50", |w| w.claim.p50),
                line("claim p99", |w| w.claim.p99),
                line("mark p50", |w| w.mark.p50),
                line("mark p99", |w| w.mark.p99),
            ],
        ),
        (
            "what cleanup has not removed; unpublished backlog (rows)".into(),
            vec![
                cleanup,
                line("dedup dead rows", |w| w.cleanup.dedup_dead as f64),
                line("backlog", |w| w.backlog as f64),
            ],
        ),
        (
            "sizes (MiB)".into(),
            vec![
                line("outbox table", |w| w.sizes.outbox_table as f64 / 1_048_576.0),
                line("outbox indexes", |w| w.sizes.outbox_indexes as f64 / 1_048_576.0),
                line("dedup table", |w| w.sizes.dedup_table as f64 / 1_048_576.0),
                line("dedup indexes", |w| w.sizes.dedup_indexes as f64 / 1_048_576.0),
            ],
        ),
        (
            "CPU (cores)".into(),
            vec![
                line("order", |w| w.cpu[0]),
                line("relay", |w| w.cpu[1]),
                line("consumer", |w| w.cpu[2]),
                line("database server", |w| w.cpu[3]),
                line("whole machine", |w| w.cpu[4]),
            ],
        ),
    ];
    for (i, (area, (caption, lines))) in panels.iter().zip(specs).enumerate() {
        let x: fn(&Window) -> f64 = if i == 0 { |w| w.at } else { |w| w.sampled_at };
        let series = lines
            .iter()
            .map(|(name, f)| ((*name).to_owned(), soak.windows.iter().map(|w| (x(w), f(w))).collect()))
            .collect();
        panel(area, soak, &caption, series)?;
    }
    for (area, (caption, value)) in panels[5..].iter().zip(retention_specs()) {
        panel(area, soak, caption, retention_series(soak, value))?;
    }
    root.present().map_err(chart_error)
}

/// A retention panel: its caption and the value of each run it draws.
type RetentionPanel = (&'static str, fn(&Purge) -> f64);

/// The retention panels: a value of each run, drawn when the run ended.
fn retention_specs() -> [RetentionPanel; 2] {
    [
        ("retention: rows removed per run", |p| p.rows as f64),
        ("retention: time per run (ms)", |p| p.elapsed_ms),
    ]
}

/// One line per table of `value` of each of its runs.
fn retention_series(soak: &Soak, value: fn(&Purge) -> f64) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for purge in &soak.purges {
        let point = (purge.at, value(purge));
        match series.iter_mut().find(|(table, _)| *table == purge.table) {
            Some((_, points)) => points.push(point),
            None => series.push((purge.table.clone(), vec![point])),
        }
    }
    series
}

fn panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    soak: &Soak,
    caption: &str,
    series: Vec<(String, Vec<(f64, f64)>)>,
) -> Result<(), BenchError> {
    let x_max = soak.windows.iter().map(|w| w.sampled_at).fold(1.0, f64::max);
    let y_max =
        series.iter().flat_map(|(_, points)| points.iter().map(|p| p.1)).fold(0.0, f64::max).max(1e-3) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(25)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(chart_error)?;
    chart.configure_mesh().x_desc("s").draw().map_err(chart_error)?;
    for boundary in [soak.stage_seconds, soak.stage_seconds + soak.hold_seconds] {
        chart
            .draw_series(LineSeries::new(
                [(boundary, 0.0), (boundary, y_max)],
                RGBColor(180, 180, 180).stroke_width(2),
            ))
            .map_err(chart_error)?;
    }
    for (i, (name, points)) in series.into_iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(chart_error)?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(chart_error)
}
