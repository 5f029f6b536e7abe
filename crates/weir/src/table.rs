//! What an operator reads at a terminal: the list commands' aligned
//! tables (`weir actors list`, `weir processes list`, `weir apps list`),
//! with sizes in binary units, moments relative to now and digests cut to
//! their first [`SHORT_DIGEST`] hex digits. Their `--json` prints the
//! server's answer whole instead, for scripts; nothing here is parsed back.
//!
//! Invariant owned here: what a guest chose (a timer's reason, a key, how
//! its process ended) reaches the operator's terminal as text, never as a
//! command to it: every cell and fact goes through [`shown`], which writes
//! control characters and bidirectional overrides as escapes.

use std::fmt::Write as _;

/// Hex digits of a digest a table shows: as many as `git log --oneline`
/// shows of a commit plus five, enough to tell apart the handful of
/// versions a server holds, short enough for a row.
pub const SHORT_DIGEST: usize = 12;

/// Spaces between two columns.
const GAP: usize = 2;

/// True for a character a terminal may act on instead of showing it: a
/// C0 or C1 control (escape sequences, bells, a line's end) or DEL, and
/// the marks that reorder what follows them on the line.
fn acts(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` as a terminal should show it: each character it would act on
/// written as its escape (`\u{1b}`).
pub fn shown(text: &str) -> String {
    if !text.chars().any(acts) {
        return text.to_string();
    }
    text.chars()
        .map(|c| {
            if acts(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// JSON text as a terminal should show it: the characters it would act on
/// that JSON lets through as they are (C1 controls, DEL, bidirectional
/// marks) written as `\uXXXX`, which a JSON reader reads back the same.
pub fn shown_json(json: &str) -> String {
    if !json.chars().any(acts) {
        return json.to_string();
    }
    json.chars()
        .map(|c| {
            if acts(c) && c != '\n' {
                format!("\\u{:04x}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A table: a header row, rows of cells, and which columns are numbers
/// (aligned right).
pub struct Table {
    headers: Vec<&'static str>,
    numeric: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Columns by header; a header ending in `>` is a number column
    /// (aligned right), the `>` not shown.
    pub fn new(headers: &[&'static str]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.trim_end_matches('>')).collect(),
            numeric: headers.iter().map(|h| h.ends_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    /// A row; each cell is [`shown`] as a terminal should.
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells.iter().map(|c| shown(c)).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, one line per row after the header, each line
    /// without trailing spaces.
    pub fn render(&self) -> String {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain([self.headers[i].len()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.headers.len()).map(width).collect();
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        for cells in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    line.push_str(&" ".repeat(GAP));
                }
                let pad = widths[i] - cell.chars().count();
                if self.numeric[i] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

/// A size in bytes, in binary units with one decimal past KiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A moment (ms since the Unix epoch) relative to `now_ms`: `in 59s`,
/// `3m ago`, in the largest whole unit.
pub fn relative(at_ms: i64, now_ms: i64) -> String {
    let delta = at_ms - now_ms;
    let span = span(delta.unsigned_abs() / 1000);
    if delta >= 0 {
        format!("in {span}")
    } else {
        format!("{span} ago")
    }
}

/// Whole seconds in their largest unit (`59s`, `4m`, `3h`, `12d`).
fn span(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// `1 actor`, `2 actors`, `2 processes`.
pub fn count(n: usize, noun: &str) -> String {
    match (n, noun.ends_with('s')) {
        (1, _) => format!("1 {noun}"),
        (_, true) => format!("{n} {noun}es"),
        (_, false) => format!("{n} {noun}s"),
    }
}

/// Now, ms since the Unix epoch (the clock the server's timers are set by).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `sha256:…` cut to its algorithm's first [`SHORT_DIGEST`] hex digits;
/// anything else (a label an operator gave a version) as it is.
pub fn short_digest(digest: &str) -> String {
    match digest.strip_prefix("sha256:") {
        Some(hex) if hex.len() > SHORT_DIGEST && hex.is_ascii() => hex[..SHORT_DIGEST].to_string(),
        _ => digest.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_text_left_and_numbers_right_with_no_trailing_space() {
        let mut t = Table::new(&["NAME", "SIZE>", "NOTE"]);
        t.row(vec!["a".into(), "1".into(), String::new()]);
        t.row(vec!["longer".into(), "1234".into(), "x".into()]);
        assert_eq!(
            t.render(),
            "NAME    SIZE  NOTE\n\
             a          1\n\
             longer  1234  x\n"
        );
    }

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.0 KiB");
        assert_eq!(bytes(26_944), "26.3 KiB");
        assert_eq!(bytes(1_376_256), "1.3 MiB");
        assert_eq!(bytes(34_359_738_368), "32.0 GiB");
        assert_eq!(bytes(u64::MAX), "16384.0 PiB");
    }

    #[test]
    fn moments_are_relative_in_their_largest_whole_unit() {
        assert_eq!(relative(59_999, 0), "in 59s");
        assert_eq!(relative(60_000, 0), "in 1m");
        assert_eq!(relative(0, 3_600_000), "1h ago");
        assert_eq!(relative(3 * 86_400_000, 0), "in 3d");
        assert_eq!(relative(0, 0), "in 0s");
    }

    #[test]
    fn digests_are_cut_and_labels_kept() {
        assert_eq!(
            short_digest("sha256:6db19a4e192ff3ac98d379c04e6ff93b"),
            "6db19a4e192f"
        );
        assert_eq!(short_digest("v3"), "v3");
    }
}
