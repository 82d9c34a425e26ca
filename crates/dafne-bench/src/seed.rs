//! What every seed experiment hands to `dafne bench seeds`: the points of
//! its figure and its headline beside the paper's.
//!
//! The seeds' papers report one headline per experiment (a ratio such as
//! "unifier 1.94× normal", or a fitted constant such as "a = 0.77 µs per
//! page"). An experiment module measures the same quantity on this machine
//! and returns it as a [`Headline`] with the paper's figure beside it, plus
//! the curves behind it as a [`Figure`], which `dafne bench seeds` draws
//! (`dafne_bench::plot`) and tabulates in `docs/SEEDS.md`.

use serde::Serialize;

/// One curve of a figure: `(x, y)` points in x order.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A figure: curves over one x axis.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// File stem of the plot (`<id>.svg`), e.g. `unifier-cached`.
    pub id: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Draw the x axis on a log₂ scale (access sizes, client counts).
    pub log_x: bool,
    /// Draw the y axis on a log₁₀ scale (values spanning orders of
    /// magnitude, such as CPU per MiB from 4 KiB to 1 MiB requests).
    pub log_y: bool,
    pub series: Vec<Series>,
}

/// An experiment's headline: ours, measured now, beside the paper's.
#[derive(Debug, Clone, Serialize)]
pub struct Headline {
    /// What is compared, e.g. "unifier / normal, cached read at peak".
    pub quantity: String,
    /// Our value (a ratio, or a constant in `unit`).
    pub ours: f64,
    /// The paper's value of the same quantity (NaN where the paper gives
    /// no number for it).
    pub paper: f64,
    /// How the paper states it when a bare number would claim more
    /// precision than the paper has ("2–3×", "more than 2×", "slightly
    /// better"); shown instead of `paper`.
    pub paper_text: Option<String>,
    /// Unit of both values: "×" for ratios, or e.g. "µs/page".
    pub unit: String,
    /// Why ours differs from the paper's where it does (one sentence,
    /// written from what was measured: the transport, the machine).
    pub why: String,
}
