//! `breakwater lab --png FILE`: the lab's time series as one page of
//! charts, one column per mode, the fault window shaded:
//!
//! 1. applied per second, hot order and unrelated orders;
//! 2. database sessions waiting on a lock, and in use;
//! 3. the breaker's state as a colour band, with the concurrency limit;
//! 4. the queue's backlog;
//! 5. dead-lettered messages.
//!
//! Text is drawn with a TrueType font read at run time (DejaVu Sans from
//! Debian's `fonts-dejavu-core`, or `BREAKWATER_CHART_FONT`).

use std::path::Path;

use anyhow::{Context, anyhow};
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use super::report::{LabReport, ModeReport, Sample};

const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart failed: {e:?}")
}

fn load_font() -> anyhow::Result<()> {
    let path = std::env::var("BREAKWATER_CHART_FONT")
        .ok()
        .or_else(|| {
            FONT_CANDIDATES
                .iter()
                .find(|p| Path::new(p).exists())
                .map(|p| (*p).to_owned())
        })
        .context(
            "no TrueType font for the chart: install Debian's fonts-dejavu-core \
             or set BREAKWATER_CHART_FONT to a .ttf file",
        )?;
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read font {path}"))?;
    // plotters keeps registered fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{path} is not a usable TrueType font"))?;
    Ok(())
}

fn secs(s: &Sample) -> f64 {
    s.t_ms as f64 / 1000.0
}

/// Applied per second between consecutive samples: (hot, unrelated).
fn rates(series: &[Sample]) -> Vec<(f64, f64, f64)> {
    series
        .windows(2)
        .map(|w| {
            let dt = ((w[1].t_ms - w[0].t_ms) as f64 / 1000.0).max(0.001);
            (
                secs(&w[1]),
                w[1].applied_hot.saturating_sub(w[0].applied_hot) as f64 / dt,
                w[1].applied_unrelated
                    .saturating_sub(w[0].applied_unrelated) as f64
                    / dt,
            )
        })
        .collect()
}

fn state_color(state: &str) -> RGBColor {
    match state {
        "closed" => RGBColor(120, 200, 120),
        "ramping" => RGBColor(240, 210, 80),
        "half_open" => RGBColor(250, 150, 60),
        "open" => RGBColor(220, 60, 60),
        _ => RGBColor(200, 200, 200),
    }
}

/// One line of a chart: its legend, colour and points.
type Line = (&'static str, RGBColor, Vec<(f64, f64)>);

/// Draws lines over time in `area`, the fault window (if any) shaded, y
/// from 0 to a little above the highest point.
fn line_chart(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    t_max: f64,
    fault: Option<(f64, f64)>,
    lines: Vec<Line>,
) -> anyhow::Result<()> {
    let y = lines
        .iter()
        .flat_map(|(_, _, points)| points.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(25)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..t_max, 0.0..y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .draw()
        .map_err(err)?;
    if let Some((from, to)) = fault {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(from, 0.0), (to, y)],
                RGBColor(255, 225, 225).filled(),
            )))
            .map_err(err)?;
    }
    let labelled = lines.len() > 1;
    for (label, color, points) in lines {
        let series = chart
            .draw_series(LineSeries::new(points, &color))
            .map_err(err)?;
        if labelled {
            series
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
        }
    }
    if labelled {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// The breaker's state as a colour band along the bottom, and its limit.
fn breaker_chart(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    t_max: f64,
    s: &[Sample],
) -> anyhow::Result<()> {
    let y = s.iter().map(|p| p.limit).max().unwrap_or(1) as f64 + 1.0;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(25)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..t_max, 0.0..y)
        .map_err(err)?;
    chart.configure_mesh().draw().map_err(err)?;
    chart
        .draw_series(s.windows(2).map(|w| {
            Rectangle::new(
                [(secs(&w[0]), 0.0), (secs(&w[1]), y * 0.15)],
                state_color(w[0].state).filled(),
            )
        }))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            s.iter().map(|p| (secs(p), f64::from(p.limit))),
            &BLACK,
        ))
        .map_err(err)?;
    Ok(())
}

/// Writes the page.
pub fn write_png(report: &LabReport, path: &Path) -> anyhow::Result<()> {
    load_font()?;
    let modes: Vec<&ModeReport> = report.modes.values().collect();
    anyhow::ensure!(!modes.is_empty(), "no mode ran: nothing to draw");
    let t_max = modes
        .iter()
        .flat_map(|m| m.series.last())
        .map(secs)
        .fold(1.0, f64::max);
    // The poison scenario injects no fault: nothing to shade.
    let fault = (report.scenario != super::Scenario::Poison).then(|| {
        (
            report.params.fault_at as f64,
            (report.params.fault_at + report.params.fault_secs) as f64,
        )
    });
    let root = BitMapBackend::new(path, (700 * modes.len() as u32, 1400)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let cells = root.split_evenly((5, modes.len()));
    for (col, mode) in modes.iter().enumerate() {
        let cell = |row: usize| &cells[row * modes.len() + col];
        let title = |what: &str| format!("{}: {what}", mode.mode.as_str());
        let s = &mode.series;
        let over_time = |value: fn(&Sample) -> u64| -> Vec<(f64, f64)> {
            s.iter().map(|p| (secs(p), value(p) as f64)).collect()
        };
        let r = rates(s);
        line_chart(
            cell(0),
            &title("applied per second"),
            t_max,
            fault,
            vec![
                (
                    "unrelated orders",
                    BLUE,
                    r.iter().map(|p| (p.0, p.2)).collect(),
                ),
                (
                    "hot order 1042",
                    RED,
                    r.iter().map(|p| (p.0, p.1)).collect(),
                ),
            ],
        )?;
        line_chart(
            cell(1),
            &title("database sessions"),
            t_max,
            fault,
            vec![
                ("in use", BLUE, over_time(|p| p.connections_active)),
                ("waiting on a lock", RED, over_time(|p| p.lock_waiters)),
            ],
        )?;
        let breaker = if mode.mode == super::Mode::Naive {
            "shadow breaker, dry run: never gates (green closed, red open)"
        } else {
            "breaker (green closed, yellow ramp, orange half-open, red open) and limit"
        };
        breaker_chart(cell(2), &title(breaker), t_max, s)?;
        line_chart(
            cell(3),
            &title("queue backlog"),
            t_max,
            fault,
            vec![("backlog", BLUE, over_time(|p| p.backlog))],
        )?;
        line_chart(
            cell(4),
            &title("dead-lettered"),
            t_max,
            fault,
            vec![("dead-lettered", BLUE, over_time(|p| p.dead_lettered))],
        )?;
    }
    root.present().map_err(err)?;
    Ok(())
}
