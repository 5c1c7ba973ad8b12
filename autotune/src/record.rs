//! Tuning records: the outcome of one search (winner and every candidate's score, time and verdict), and its
//! readable table for `KILN_DUMP` and `kiln cache ls -v`.
//!
//! Owns: the record's shape and its (serde) payload form. Deliberately not: how a record is stored
//! ([`Store`](crate::Store)) or produced ([`search`](crate::search())).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::key::TuneKey;

/// One candidate's line in a search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// The candidate config's name.
    pub config: String,
    /// The cost model's score (higher is better).
    #[serde(with = "any_f64")]
    pub score: f64,
    /// Median measured time; `None` when it was not timed.
    pub time_ns: Option<u64>,
    /// `Some(false)`: its output disagreed with the reference (or verification errored); `None`: not checked.
    pub verified: Option<bool>,
    /// Why it was not timed, why it failed, or how many reps were timed.
    pub note: Option<String>,
}

/// The result of tuning one key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneRecord {
    pub key: TuneKey,
    /// The winning config's name.
    pub winner: String,
    /// The mode it was tuned in (`off`, `fast`, `full`).
    pub mode: String,
    /// The dims it was actually measured at (a bucket's upper bound, or a user's batch hint).
    pub tuned_dims: Vec<(String, u64)>,
    /// Every candidate, best score first.
    pub trials: Vec<Trial>,
}

impl TuneRecord {
    /// Whether this record answers a lookup made in `mode`: it was tuned in that mode or a more thorough one. A
    /// record from `off` (the model's pick, nothing timed) is searched again by `fast`, and one from `fast` by
    /// `full` (`kiln tune`), so a quick run never stops a later, more careful one from tuning; a record is never
    /// re-raced by its own mode or a lighter one, so warm starts stay deterministic. An unknown mode serves
    /// nothing but `off`.
    pub fn serves(&self, mode: crate::Mode) -> bool {
        mode == crate::Mode::Off || crate::Mode::parse(&self.mode).is_some_and(|m| m >= mode)
    }

    /// The winner's trial, if the record names one that it lists.
    pub fn winner_trial(&self) -> Option<&Trial> {
        self.trials.iter().find(|t| t.config == self.winner)
    }

    /// A fixed-width table: a header line naming the key and mode, then one row per candidate (`*` marks the
    /// winner): config | score | median µs | verified | note.
    pub fn table(&self) -> String {
        let dims = |d: &[(String, u64)]| d.iter().map(|(n, s)| format!("{n}={s}")).collect::<Vec<_>>().join(" ");
        let mut out = format!(
            "{} {} | {} | {} | epilogue {} | mode {} | tuned at {} | winner {}\n",
            self.key.op,
            dims(&self.key.dims),
            self.key.dtypes,
            self.key.layout,
            self.key.epilogue,
            self.mode,
            dims(&self.tuned_dims),
            self.winner
        );
        let header = ["", "config", "score", "median µs", "verified", "note"];
        let rows: Vec<[String; 6]> = self
            .trials
            .iter()
            .map(|t| {
                [
                    if t.config == self.winner { "*" } else { "" }.to_string(),
                    t.config.clone(),
                    format!("{:.3}", t.score),
                    t.time_ns.map_or_else(|| "-".to_string(), |ns| format!("{:.3}", ns as f64 / 1e3)),
                    match t.verified {
                        Some(true) => "yes",
                        Some(false) => "FAILED",
                        None => "-",
                    }
                    .to_string(),
                    t.note.clone().unwrap_or_default(),
                ]
            })
            .collect();
        let mut widths = header.map(|h| h.chars().count());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        // Text columns align left, numbers right, so digits line up.
        let right = [false, false, true, true, false, false];
        let mut line = |cells: [&str; 6]| {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let w = widths[i];
                let sep = match i {
                    0 => "",
                    1 => " ",
                    _ => "  ",
                };
                if right[i] {
                    let _ = write!(text, "{sep}{cell:>w$}");
                } else {
                    let _ = write!(text, "{sep}{cell:<w$}");
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(header);
        for row in &rows {
            line([&row[0], &row[1], &row[2], &row[3], &row[4], &row[5]]);
        }
        out
    }
}

/// Scores may be non-finite (a cost model can say `-inf` for "never"); JSON cannot hold those as numbers, and a
/// record that is written but cannot be read back would be re-tuned forever. They travel as strings instead.
mod any_f64 {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        match *x {
            x if x.is_finite() => s.serialize_f64(x),
            x if x.is_nan() => s.serialize_str("NaN"),
            x if x > 0.0 => s.serialize_str("inf"),
            _ => s.serialize_str("-inf"),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Number(x) => Ok(x),
            Repr::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(D::Error::custom(format!("not a score: {other:?}"))),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> TuneRecord {
        let trial = |config: &str, score, time_ns, verified, note: Option<&str>| Trial {
            config: config.into(),
            score,
            time_ns,
            verified,
            note: note.map(Into::into),
        };
        TuneRecord {
            key: TuneKey {
                op: "gemm".into(),
                dims: vec![("m".into(), 1024), ("n".into(), 64)],
                dtypes: "f32".into(),
                layout: "row,row".into(),
                epilogue: "none".into(),
                device: "0123456789abcdef".into(),
                candidates: 7,
            },
            winner: "tile_8x8".into(),
            mode: "fast".into(),
            tuned_dims: vec![("m".into(), 1024), ("n".into(), 64)],
            trials: vec![
                trial("tile_16x4", 9.5, None, Some(false), Some("verification failed: max error 3.0")),
                trial("tile_8x8", 9.0, Some(123_456), Some(true), Some("3 reps")),
                trial("tile_4x4", f64::NEG_INFINITY, None, None, Some("not timed: outside top 2")),
            ],
        }
    }

    #[test]
    fn table_marks_the_winner_and_aligns_columns() {
        let table = record().table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 5, "{table}");
        assert!(lines[0].contains("winner tile_8x8") && lines[0].contains("m=1024"), "{table}");
        assert!(lines[1].contains("config") && lines[1].contains("median µs"), "{table}");
        assert!(lines[3].starts_with("* tile_8x8"), "{table}");
        assert!(lines[3].contains("123.456") && lines[3].contains("yes"), "{table}");
        assert!(lines[2].contains("FAILED") && lines[4].contains("-inf"), "{table}");
        // The score column is right-aligned: every score ends at the same character position.
        let end = |l: &str, s: &str| l.find(s).map(|i| l[..i + s.len()].chars().count());
        assert_eq!(end(lines[2], "9.500"), end(lines[3], "9.000"));
    }

    #[test]
    fn json_round_trip_keeps_non_finite_scores() {
        let mut rec = record();
        rec.trials[0].score = f64::INFINITY;
        rec.trials[1].score = 0.1 + 0.2;
        let text = serde_json::to_string(&rec).expect("a record always serializes");
        let back: TuneRecord = serde_json::from_str(&text).expect("and reads back");
        assert_eq!(back, rec);
        rec.trials[0].score = f64::NAN;
        let text = serde_json::to_string(&rec).expect("NaN serializes as a string");
        let back: TuneRecord = serde_json::from_str(&text).expect("and reads back");
        assert!(back.trials[0].score.is_nan());
        assert_eq!(back.winner_trial().map(|t| t.time_ns), Some(Some(123_456)));
    }

    #[test]
    fn a_record_serves_its_own_mode_and_lighter_ones() {
        use crate::Mode;
        let mut r = record();
        for (made, off, fast, full) in
            [("off", true, false, false), ("fast", true, true, false), ("full", true, true, true)]
        {
            r.mode = made.into();
            assert_eq!([r.serves(Mode::Off), r.serves(Mode::Fast), r.serves(Mode::Full)], [off, fast, full], "{made}");
        }
        r.mode = "turbo".into();
        assert!(r.serves(Mode::Off) && !r.serves(Mode::Fast));
    }
}
