//! bench-plot draws every chart from a small synthetic sample set, and every image
//! docs/benchmarks.md shows exists. Root-free: no bench runs here.

use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("bench-plot-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn latencies(series: &[&str]) -> String {
    let mut s = String::from("series,ms\n");
    for (k, name) in series.iter().enumerate() {
        for i in 1..=150 {
            s.push_str(&format!("{name},{:.3}\n", (k + 1) as f64 * i as f64 * 0.37));
        }
    }
    s
}

fn bursts(names: &[&str]) -> String {
    let mut s = String::from("burst,start_ms,end_ms\n");
    for name in names {
        for i in 0..100 {
            let start = i as f64 * 2.5;
            s.push_str(&format!(
                "{name},{start:.3},{:.3}\n",
                start + 300.0 + i as f64
            ));
        }
    }
    s
}

fn write_samples(dir: &Path) {
    let files = [
        (
            "cni-add.csv",
            latencies(&["sequential: whole chain", "100 at once: whole chain"]),
        ),
        ("cni-burst.csv", bursts(&["100 at once: whole chain"])),
        (
            "ambient-add.csv",
            latencies(&["sequential: agent enroll", "100 at once: agent enroll"]),
        ),
        (
            "ambient-burst.csv",
            bursts(&["100 at once: whole chain", "100 at once: istio-cni alone"]),
        ),
        (
            "conn-cidrs.csv",
            "method,cidrs,p50_us,p90_us\nno rules at all (reference),0,5.5,6.0\n\
             ours: nft; one interval set,0,8.0,9.0\nours: nft; one interval set,10000,8.1,9.6\n\
             Istio-style nft; one rule per CIDR,0,8.3,9.0\nIstio-style nft; one rule per CIDR,10,9.0,9.9\n\
             Istio-style nft; one rule per CIDR,10000,167.0,176.8\n"
                .to_string(),
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

fn plot(samples: &Path, out: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bench-plot"))
        .arg(samples)
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn draws_every_chart_as_svg_with_its_labels() {
    let (samples, out) = (scratch("samples"), scratch("out"));
    write_samples(&samples);
    let run = plot(&samples, &out);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let expect = [
        ("bench-cni-add.svg", "latency of one ADD, ms (log scale)"),
        ("bench-cni-burst.svg", "time since the burst"),
        ("bench-ambient-add.svg", "sequential: agent enroll (n=150)"),
        ("bench-ambient-burst.svg", "100 at once: istio-cni alone"),
        ("bench-conn-cidrs.svg", "connection setup, p50 µs"),
    ];
    for (svg, label) in expect {
        let text = std::fs::read_to_string(out.join(svg)).unwrap();
        assert!(text.trim_start().starts_with("<svg"), "{svg}: not an SVG");
        assert!(text.trim_end().ends_with("</svg>"), "{svg}: not closed");
        assert!(text.contains(label), "{svg}: no {label:?}");
        assert!(text.len() < 100_000, "{svg}: {} bytes", text.len());
    }
    std::fs::remove_dir_all(&samples).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn bad_samples_are_an_error_not_a_panic() {
    let (samples, out) = (scratch("bad"), scratch("bad-out"));
    std::fs::write(samples.join("cni-add.csv"), "series,ms\nsequential,fast\n").unwrap();
    std::fs::write(samples.join("conn-cidrs.csv"), "wrong,header\n").unwrap();
    let run = plot(&samples, &out);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("\"fast\" is not a number"), "{stderr}");
    assert!(stderr.contains("expected \"method,cidrs"), "{stderr}");
    assert!(stderr.contains("bench-cni-burst.svg not drawn"), "{stderr}");
    std::fs::remove_dir_all(&samples).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
}

/// The images docs/benchmarks.md shows (`![...](path)`), relative to docs/.
fn images(markdown: &str) -> Vec<String> {
    markdown
        .split("![")
        .skip(1)
        .filter_map(|s| {
            let s = &s[s.find("](")? + 2..];
            Some(s[..s.find(')')?].to_string())
        })
        .collect()
}

#[test]
fn every_image_the_benchmarks_page_shows_exists() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let text = std::fs::read_to_string(docs.join("benchmarks.md")).unwrap();
    let imgs = images(&text);
    let missing: Vec<&String> = imgs.iter().filter(|p| !docs.join(p).is_file()).collect();
    assert!(
        missing.is_empty(),
        "docs/benchmarks.md shows missing images: {missing:?}"
    );
    // bench.sh writes the charts into docs/img; each one drawn is also shown.
    for e in std::fs::read_dir(docs.join("img"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("bench-") && name.ends_with(".svg") {
            assert!(
                imgs.contains(&format!("img/{name}")),
                "docs/img/{name} is not shown in docs/benchmarks.md"
            );
        }
    }
}
