//! `--plot FILE.svg|.png`: fault/wsec against threads (or against cache lines for a cache-line
//! sweep), one line per mode, log scale; below it the ratio to `native` at each point.
//!
//! With both a thread and a cache-line sweep, the x axis is cache lines (the seed 003 table)
//! and there is one column of panels per thread count.

use crate::bench::{native_at, Row};
use crate::output::distinct;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

/// The font travels inside the binary, so plots look the same on any machine.
fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular());
        let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold());
    });
}

/// Colors that stay apart on white (Okabe-Ito): each base mode keeps its color in every
/// figure; variants take the rest in order.
const BASE_COLORS: [(&str, RGBColor); 6] = [
    ("native", RGBColor(0, 0, 0)),
    ("thp", RGBColor(230, 159, 0)),
    ("populate", RGBColor(86, 180, 233)),
    ("engine", RGBColor(0, 158, 115)),
    ("engine-cold", RGBColor(213, 94, 0)),
    ("floor", RGBColor(175, 175, 175)),
];
const VARIANT_COLORS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(204, 121, 167),
    RGBColor(120, 120, 120),
    RGBColor(140, 86, 75),
    RGBColor(117, 112, 179),
    RGBColor(166, 6, 40),
    RGBColor(128, 128, 0),
    RGBColor(0, 90, 90),
];

fn colors(modes: &[String]) -> Vec<RGBColor> {
    let mut next = 0;
    modes
        .iter()
        .map(|m| match BASE_COLORS.iter().find(|(n, _)| n == m) {
            Some((_, c)) => *c,
            None => {
                next += 1;
                VARIANT_COLORS[(next - 1) % VARIANT_COLORS.len()]
            }
        })
        .collect()
}

/// Legend entries placed in rows that fit `width` pixels: (row, x) of each.
fn legend_places(modes: &[String], width: i32) -> Vec<(i32, i32)> {
    let (mut row, mut x) = (0, 70);
    modes
        .iter()
        .map(|m| {
            let w = 32 + 9 * m.len() as i32 + 28;
            if x + w > width - 10 && x > 70 {
                row += 1;
                x = 70;
            }
            let at = (row, x);
            x += w;
            at
        })
        .collect()
}

/// What the figure shows; built from the rows so it can be checked without drawing.
#[derive(Debug, PartialEq)]
pub(crate) struct Layout {
    /// `threads` or `cache lines per page`.
    pub(crate) x_name: &'static str,
    /// The panel columns: (title, value of the other dimension).
    pub(crate) columns: Vec<(String, usize)>,
    /// Mode names, one line each.
    pub(crate) modes: Vec<String>,
    /// Whether a ratio row is drawn (a native row exists).
    pub(crate) ratios: bool,
}

pub(crate) fn layout(rows: &[Row]) -> Layout {
    let threads = distinct(rows.iter().map(|r| r.at.threads));
    let lines = distinct(rows.iter().map(|r| r.at.cachelines));
    let by_lines = lines.len() > 1;
    let columns = if by_lines {
        threads
            .iter()
            .map(|&t| (format!("{t} thread{}", if t == 1 { "" } else { "s" }), t))
            .collect()
    } else {
        vec![(
            format!(
                "{} cache line{} per page",
                lines[0],
                if lines[0] == 1 { "" } else { "s" }
            ),
            lines[0],
        )]
    };
    let modes = crate::output::modes(rows);
    Layout {
        x_name: if by_lines {
            "cache lines written per page"
        } else {
            "threads"
        },
        columns,
        modes,
        ratios: rows.iter().any(|r| r.mode.is_native()),
    }
}

impl Layout {
    fn by_lines(&self) -> bool {
        self.x_name.starts_with("cache")
    }

    /// (x, row) pairs of one mode in one column, by x.
    fn series<'a>(&self, rows: &'a [Row], mode: &str, column: usize) -> Vec<(f64, &'a Row)> {
        let mut v: Vec<(f64, &Row)> = rows
            .iter()
            .filter(|r| r.mode.name() == mode)
            .filter(|r| {
                if self.by_lines() {
                    r.at.threads == column
                } else {
                    r.at.cachelines == column
                }
            })
            .map(|r| {
                let x = if self.by_lines() { r.at.cachelines } else { r.at.threads };
                (x as f64, r)
            })
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }
}

/// Writes the plot; the format follows the file name.
pub(crate) fn write(path: &Path, title: &str, rows: &[Row]) -> Result<(), String> {
    if rows.is_empty() {
        return Err("--plot: no rows to plot".into());
    }
    fonts();
    let l = layout(rows);
    let size = (
        (560 * l.columns.len() as u32).max(900),
        if l.ratios { 900 } else { 560 },
    );
    let svg = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let err = |e: String| format!("--plot {}: {e}", path.display());
    if svg {
        let root = SVGBackend::new(path, size).into_drawing_area();
        draw(root, title, &l, rows).map_err(err)
    } else {
        let root = BitMapBackend::new(path, size).into_drawing_area();
        draw(root, title, &l, rows).map_err(err)
    }
}

/// One mode's line with a dot at each point.
fn line<DB: DrawingBackend, X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<X, Y>>,
    pts: Vec<(f64, f64)>,
    c: RGBColor,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    chart
        .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))
        .map_err(e)?;
    chart
        .draw_series(pts.iter().map(|p| Circle::new(*p, 4, c.filled())))
        .map_err(e)?;
    Ok(())
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, title: &str, l: &Layout, rows: &[Row]) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    // A long title gets a smaller font rather than running off the figure.
    let title_px = (root.dim_in_pixel().0 as f64 * 1.75 / title.chars().count().max(1) as f64).clamp(12.0, 22.0);
    let root = root.titled(title, ("sans-serif", title_px)).map_err(e)?;
    let palette = colors(&l.modes);
    let color = |mode: &str| palette[l.modes.iter().position(|m| m == mode).unwrap_or(0)];
    // One legend for the whole figure, in a strip of its own, so it never covers a line.
    let places = legend_places(&l.modes, root.dim_in_pixel().0 as i32);
    let legend_rows = places.last().map_or(1, |p| p.0 + 1);
    let (legend, body) = root.split_vertically(12 + 24 * legend_rows);
    for (mode, (row, x)) in l.modes.iter().zip(places) {
        let (c, y) = (color(mode), 18 + 24 * row);
        legend
            .draw(&PathElement::new(vec![(x, y), (x + 26, y)], c.stroke_width(3)))
            .map_err(e)?;
        legend.draw(&Circle::new((x + 13, y), 4, c.filled())).map_err(e)?;
        legend
            .draw(&Text::new(mode.clone(), (x + 32, y - 9), ("sans-serif", 15)))
            .map_err(e)?;
    }
    let panels = body.split_evenly((if l.ratios { 2 } else { 1 }, l.columns.len()));
    // Cache lines double (1, 2, 4 .. 64): the axis runs in log2 of them, labelled with the
    // counts. Threads count up: a plain axis.
    let by_lines = l.by_lines();
    let to_u = |x: f64| if by_lines { x.log2() } else { x };
    let us: Vec<f64> = rows
        .iter()
        .map(|r| to_u(if by_lines { r.at.cachelines } else { r.at.threads } as f64))
        .collect();
    let (umin, umax) = (
        us.iter().cloned().fold(f64::INFINITY, f64::min),
        us.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    );
    let (u0, u1) = (umin - 0.3, umax + 0.3);
    let x_labels = ((umax - umin) as usize + 2).min(17);
    let x_tick = move |u: &f64| {
        if (u - u.round()).abs() > 1e-6 {
            String::new()
        } else if by_lines {
            format!("{}", 2f64.powf(u.round()))
        } else {
            format!("{}", u.round())
        }
    };
    let rates: Vec<f64> = rows.iter().map(|r| r.fault_per_wsec).filter(|v| *v > 0.0).collect();
    let (y0, y1) = (
        rates.iter().cloned().fold(f64::INFINITY, f64::min) / 1.5,
        rates.iter().cloned().fold(0.0, f64::max) * 1.5,
    );
    // A log axis within one decade gets no labels of its own: 1, 2, 5 x 10^k keys instead.
    let keys: Vec<f64> = (2..10)
        .flat_map(|k| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(k)))
        .filter(|v| (y0..=y1).contains(v))
        .collect();
    let ratio_of = |r: &Row| native_at(rows, r.at).map(|n| r.fault_per_wsec / n.fault_per_wsec);
    let rmax = rows.iter().filter_map(ratio_of).fold(1.0, f64::max) * 1.15;
    let rate_tick = |v: &f64| {
        let (x, unit) = if *v >= 1e6 { (v / 1e6, "M") } else { (v / 1e3, "k") };
        if (x - x.round()).abs() < 1e-9 {
            format!("{x:.0}{unit}")
        } else {
            format!("{x:.1}{unit}")
        }
    };
    for (c, (col_title, col)) in l.columns.iter().enumerate() {
        let mut chart = ChartBuilder::on(&panels[c])
            .caption(format!("fault/wsec, {col_title} (log scale)"), ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(64)
            .build_cartesian_2d(u0..u1, (y0..y1).log_scale().with_key_points(keys.clone()))
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc(l.x_name)
            .y_desc("faults per wall second")
            .x_labels(x_labels)
            .x_label_formatter(&x_tick)
            .y_label_formatter(&rate_tick)
            .light_line_style(TRANSPARENT)
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(e)?;
        for mode in &l.modes {
            let pts: Vec<(f64, f64)> = l
                .series(rows, mode, *col)
                .iter()
                .map(|(x, r)| (to_u(*x), r.fault_per_wsec))
                .collect();
            line(&mut chart, pts, color(mode))?;
        }
        if !l.ratios {
            continue;
        }
        let mut chart = ChartBuilder::on(&panels[l.columns.len() + c])
            .caption(format!("relative to native, {col_title}"), ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(64)
            .build_cartesian_2d(u0..u1, 0.0..rmax)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc(l.x_name)
            .y_desc("fault/wsec over native")
            .x_labels(x_labels)
            .x_label_formatter(&x_tick)
            .y_label_formatter(&|v: &f64| {
                // Steps of 0.5 or 0.2 on a short axis need their decimal.
                if (v - v.round()).abs() < 1e-9 {
                    format!("{v:.0}x")
                } else {
                    format!("{v:.1}x")
                }
            })
            .light_line_style(TRANSPARENT)
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(e)?;
        chart
            .draw_series(LineSeries::new(vec![(u0, 1.0), (u1, 1.0)], BLACK.stroke_width(2)))
            .map_err(e)?;
        for mode in l.modes.iter().filter(|m| *m != "native") {
            let pts: Vec<(f64, f64)> = l
                .series(rows, mode, *col)
                .iter()
                .filter_map(|(x, r)| ratio_of(r).map(|q| (to_u(*x), q)))
                .collect();
            line(&mut chart, pts, color(mode))?;
        }
    }
    root.present().map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::row;

    #[test]
    fn layout_follows_the_sweep() {
        let threads = vec![
            row("native", 1, 1, 1.0),
            row("engine", 1, 1, 0.1),
            row("native", 2, 1, 0.6),
            row("engine", 2, 1, 0.1),
        ];
        let l = layout(&threads);
        assert_eq!(l.x_name, "threads");
        assert_eq!(l.columns, vec![("1 cache line per page".to_string(), 1)]);
        assert_eq!(l.modes, ["native", "engine"]);
        assert!(l.ratios);
        assert_eq!(
            l.series(&threads, "engine", 1).iter().map(|p| p.0).collect::<Vec<_>>(),
            [1.0, 2.0]
        );

        let both: Vec<Row> = [1, 2]
            .iter()
            .flat_map(|&t| [1, 8, 64].map(|c| row("thp", t, c, 0.5)))
            .collect();
        let l = layout(&both);
        assert_eq!(l.x_name, "cache lines written per page");
        assert_eq!(l.columns.iter().map(|c| c.1).collect::<Vec<_>>(), [1, 2]);
        assert!(!l.ratios, "no native row: no ratio panels");
        assert_eq!(
            l.series(&both, "thp", 2).iter().map(|p| p.0).collect::<Vec<_>>(),
            [1.0, 8.0, 64.0]
        );
    }

    #[test]
    fn every_base_mode_and_eight_variants_get_distinct_colors() {
        let mut modes: Vec<String> = BASE_COLORS.iter().map(|(n, _)| n.to_string()).collect();
        modes.extend((0..8).map(|i| format!("engine:max_order={i}")));
        let mut c: Vec<(u8, u8, u8)> = colors(&modes).iter().map(|c| (c.0, c.1, c.2)).collect();
        c.sort_unstable();
        c.dedup();
        assert_eq!(c.len(), 14);
    }

    #[test]
    fn base_modes_keep_their_colors_and_the_legend_wraps() {
        let modes: Vec<String> = ["engine", "engine:pool=off", "native", "engine:max_order=3"]
            .map(String::from)
            .to_vec();
        let c = colors(&modes);
        assert_eq!((c[0], c[2]), (BASE_COLORS[3].1, BASE_COLORS[0].1));
        assert_eq!((c[1], c[3]), (VARIANT_COLORS[0], VARIANT_COLORS[1]));
        let wide = legend_places(&modes, 2000);
        assert!(wide.iter().all(|p| p.0 == 0), "{wide:?}");
        let narrow = legend_places(&modes, 400);
        assert_eq!(
            narrow.iter().map(|p| p.0).collect::<Vec<_>>(),
            [0, 0, 1, 2],
            "{narrow:?}"
        );
        assert!(narrow.iter().all(|p| p.1 == 70 || p.1 < 400));
    }

    #[test]
    fn writes_png_and_svg_files() {
        let rows: Vec<Row> = [1, 2]
            .iter()
            .flat_map(|&t| {
                [1, 8, 64].into_iter().flat_map(move |c| {
                    [
                        row("native", t, c, 1.0),
                        row("engine", t, c, 0.1 * c as f64 / 8.0 + 0.05),
                    ]
                })
            })
            .collect();
        let dir = std::env::temp_dir().join(format!("zerofault-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["p.png", "p.svg"] {
            let path = dir.join(name);
            write(&path, "test", &rows).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            if name.ends_with("png") {
                assert_eq!(&bytes[1..4], b"PNG");
            } else {
                let s = String::from_utf8(bytes).unwrap();
                assert!(
                    s.starts_with("<svg") && s.contains("relative to native") && s.contains("engine"),
                    "{s:.200}"
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
