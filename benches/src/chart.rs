//! The SVG chart: per operation, throughput and p50/p99 latency against requests in flight,
//! one line per backend (means over rounds).

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

use crate::report::{series, Point, Row};

/// Draws `rows` for `backends` into an SVG file at `path`.
pub fn draw(path: &Path, title: &str, rows: &[Row], backends: &[&str]) -> anyhow::Result<()> {
    let mut ops: Vec<&str> = Vec::new();
    for r in rows {
        if !ops.contains(&r.op.as_str()) {
            ops.push(&r.op);
        }
    }
    if ops.is_empty() {
        return Ok(());
    }
    let height = 60 + 320 * u32::try_from(ops.len()).unwrap_or(1);
    let root = SVGBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let root = root
        .titled(title, ("sans-serif", 22))
        .map_err(|e| anyhow!("{e}"))?;
    let areas = root.split_evenly((ops.len(), 2));
    for (i, op) in ops.iter().enumerate() {
        let lines: Vec<(usize, Vec<Point>)> = backends
            .iter()
            .enumerate()
            .map(|(k, b)| (k, series(rows, op, b)))
            .collect();
        let all = || lines.iter().flat_map(|(_, p)| p.iter());
        let x = |p: &Point| p.in_flight as f64;
        let x_max = all().map(x).fold(1.0, f64::max) * 1.5;
        let tput_max = all().map(|p| p.per_sec).fold(1.0, f64::max) * 1.15;
        let lat_min = all().map(|p| p.p50_ms).fold(f64::MAX, f64::min).max(0.01) / 1.5;
        let lat_max = all().map(|p| p.p99_ms).fold(0.1, f64::max) * 1.5;

        let mut tput = ChartBuilder::on(&areas[2 * i])
            .caption(format!("{op}: throughput"), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(65)
            .build_cartesian_2d((0.7f64..x_max).log_scale(), 0f64..tput_max)
            .map_err(|e| anyhow!("{e}"))?;
        tput.configure_mesh()
            .light_line_style(WHITE)
            .x_desc("requests in flight")
            .y_desc("ops/s")
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (k, points) in &lines {
            let color = Palette99::pick(*k).to_rgba();
            let xy: Vec<(f64, f64)> = points.iter().map(|p| (x(p), p.per_sec)).collect();
            tput.draw_series(LineSeries::new(xy.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow!("{e}"))?
                .label(backends[*k])
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            tput.draw_series(xy.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| anyhow!("{e}"))?;
        }
        tput.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow!("{e}"))?;

        let mut lat = ChartBuilder::on(&areas[2 * i + 1])
            .caption(
                format!("{op}: latency (p50 solid, p99 dashed)"),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(65)
            .build_cartesian_2d((0.7f64..x_max).log_scale(), (lat_min..lat_max).log_scale())
            .map_err(|e| anyhow!("{e}"))?;
        lat.configure_mesh()
            .light_line_style(WHITE)
            .x_desc("requests in flight")
            .y_desc("ms")
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        for (k, points) in &lines {
            let color = Palette99::pick(*k).to_rgba();
            let p50: Vec<(f64, f64)> = points.iter().map(|p| (x(p), p.p50_ms)).collect();
            let p99: Vec<(f64, f64)> = points.iter().map(|p| (x(p), p.p99_ms)).collect();
            lat.draw_series(LineSeries::new(p50.clone(), color.stroke_width(2)))
                .map_err(|e| anyhow!("{e}"))?
                .label(format!("{} p50", backends[*k]))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            lat.draw_series(DashedLineSeries::new(p99, 6, 4, color.stroke_width(2)))
                .map_err(|e| anyhow!("{e}"))?;
            lat.draw_series(p50.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| anyhow!("{e}"))?;
        }
        lat.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::stats::Run;

    #[test]
    fn draws_an_svg_with_every_backend() {
        let run = |per_sec: f64| Run {
            ops: 1,
            per_sec,
            p50: Duration::from_millis(2),
            p99: Duration::from_millis(9),
            max: Duration::from_millis(9),
            cut: false,
        };
        let rows: Vec<Row> = [1usize, 8, 64]
            .iter()
            .map(|&c| Row {
                op: "acquire".into(),
                in_flight: c,
                round: 0,
                runs: vec![
                    ("etcd".into(), run(100.0 * c as f64)),
                    ("proxy".into(), run(80.0 * c as f64)),
                ],
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chart.svg");
        draw(&path, "test", &rows, &["etcd", "proxy"]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("acquire: throughput"));
        assert!(svg.contains("proxy p50"));
    }
}
