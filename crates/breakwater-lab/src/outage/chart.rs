//! `breakwater lab --png FILE`: the lab's time series as one page of
//! charts under a title naming the scenario and its parameters, one column
//! per mode (each row on the same y-scale in every column, so the columns
//! compare), the fault window shaded and labelled:
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

/// The chart every panel is drawn on: seconds across, 0 to `y` up (labelled
/// `y_desc` unless empty), whole-number ticks, its mesh drawn.
type Timeline<'a, 'b> = ChartContext<
    'a,
    BitMapBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

fn timeline<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    caption: &str,
    caption_size: u32,
    t_max: f64,
    y: f64,
    y_desc: &str,
) -> anyhow::Result<Timeline<'a, 'b>> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", caption_size))
        .margin(8)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..t_max, 0.0..y)
        .map_err(err)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_desc("seconds")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_label_formatter(&|v| format!("{v:.0}"));
    if !y_desc.is_empty() {
        mesh.y_desc(y_desc);
    }
    mesh.draw().map_err(err)?;
    Ok(chart)
}

/// The top of a y-axis holding `highest`: a little above it, and at least
/// 5, so a row of small counts gets whole-number ticks.
fn y_top(highest: f64) -> f64 {
    highest.max(5.0) * 1.1
}

/// The highest point of `lines`.
fn highest(lines: &[Line]) -> f64 {
    lines
        .iter()
        .flat_map(|(_, _, points)| points.iter().map(|p| p.1))
        .fold(0.0, f64::max)
}

/// Draws lines over time in `area` on a y-axis from 0 to `y`, the fault
/// window (if any) shaded and labelled.
fn line_chart(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    t_max: f64,
    y: f64,
    fault: Option<(f64, f64)>,
    lines: Vec<Line>,
) -> anyhow::Result<()> {
    let mut chart = timeline(area, caption, 18, t_max, y, "")?;
    if let Some((from, to)) = fault {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(from, 0.0), (to, y)],
                RGBColor(255, 225, 225).filled(),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                "fault",
                (from + (to - from) * 0.02, y * 0.97),
                ("sans-serif", 14).into_font().color(&RED),
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

/// The breaker's states, in the order the legend lists them.
const STATES: [(&str, &str); 4] = [
    ("closed", "closed"),
    ("ramping", "ramp"),
    ("half_open", "half-open"),
    ("open", "open"),
];

/// The breaker's state as a colour band along the bottom (explained by a
/// legend), and its concurrency limit on a y-axis from 0 to `y`.
fn breaker_chart(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    t_max: f64,
    y: f64,
    s: &[Sample],
) -> anyhow::Result<()> {
    let mut chart = timeline(area, caption, 15, t_max, y, "limit")?;
    for (state, label) in STATES {
        let color = state_color(state);
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
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
        .map_err(err)?
        .label("limit")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
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
    let root = BitMapBackend::new(path, (700 * modes.len() as u32, 1450)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(&report.headline(), ("sans-serif", 22))
        .map_err(err)?;
    let cells = root.split_evenly((5, modes.len()));
    // Every mode's lines of each row, first, so a row shares one y-scale.
    let rows: Vec<[Vec<Line>; 4]> = modes.iter().map(|mode| lines_of(mode)).collect();
    let row_top = |row: usize| y_top(rows.iter().map(|r| highest(&r[row])).fold(0.0, f64::max));
    let tops = [row_top(0), row_top(1), row_top(2), row_top(3)];
    let limit_top = modes
        .iter()
        .flat_map(|m| m.series.iter().map(|p| p.limit))
        .max()
        .unwrap_or(1) as f64
        * 1.25
        + 1.0;
    for (col, (mode, lines)) in modes.iter().zip(rows).enumerate() {
        let cell = |row: usize| &cells[row * modes.len() + col];
        let title = |what: &str| format!("{}: {what}", mode.mode.as_str());
        let [applied, sessions, backlog, dead] = lines;
        line_chart(
            cell(0),
            &title("applied per second"),
            t_max,
            tops[0],
            fault,
            applied,
        )?;
        line_chart(
            cell(1),
            &title("database sessions"),
            t_max,
            tops[1],
            fault,
            sessions,
        )?;
        let breaker = if mode.mode == super::Mode::Naive {
            "shadow breaker, dry run: never gates"
        } else {
            "breaker state and concurrency limit"
        };
        breaker_chart(cell(2), &title(breaker), t_max, limit_top, &mode.series)?;
        line_chart(
            cell(3),
            &title("queue backlog"),
            t_max,
            tops[2],
            fault,
            backlog,
        )?;
        line_chart(
            cell(4),
            &title("dead-lettered"),
            t_max,
            tops[3],
            fault,
            dead,
        )?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The lines of one mode's four line charts: applied per second, database
/// sessions, backlog, dead-lettered.
fn lines_of(mode: &ModeReport) -> [Vec<Line>; 4] {
    let s = &mode.series;
    let over_time = |value: fn(&Sample) -> u64| -> Vec<(f64, f64)> {
        s.iter().map(|p| (secs(p), value(p) as f64)).collect()
    };
    let r = rates(s);
    [
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
        vec![
            ("in use", BLUE, over_time(|p| p.connections_active)),
            ("waiting on a lock", RED, over_time(|p| p.lock_waiters)),
        ],
        vec![("backlog", BLUE, over_time(|p| p.backlog))],
        vec![("dead-lettered", BLUE, over_time(|p| p.dead_lettered))],
    ]
}
