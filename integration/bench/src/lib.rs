//! What the bench binaries share: their raw samples, which `bench-plot` draws as the charts of
//! docs/benchmarks.md.

pub mod samples;
