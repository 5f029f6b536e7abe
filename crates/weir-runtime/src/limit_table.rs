//! How a limit is declared: a [`limit_table!`](crate::limit_table!) names each limit once (its
//! flat name, default, range, unit and meaning, and the field that holds
//! it) and yields the struct, its specs, `Default`, and setting by name.
//!
//! Invariant owned here: a value reaches a limit field only through
//! [`LimitTable::set_limit`], which checks the name and the range first and
//! names both in its error; and the README's limits table is checked
//! against the specs ([`readme_disagreements`]), so the docs cannot drift
//! from the code.

use std::fmt;
use std::time::Duration;

/// How a limit is measured, for messages and docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Millis,
    Bytes,
    Count,
}

/// One configurable limit: its flat name, default, range and meaning.
#[derive(Clone, Copy, Debug)]
pub struct LimitSpec {
    pub name: &'static str,
    pub default: u64,
    pub min: u64,
    pub max: u64,
    pub unit: Unit,
    pub meaning: &'static str,
}

/// A limit name that Weir does not know, or a value outside its range.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitError {
    #[error("unknown limit `{name}` (known limits: {known})")]
    Unknown { name: String, known: String },
    #[error("limit `{name}` must be an integer from {min} to {max}, got `{value}`")]
    OutOfRange {
        name: &'static str,
        value: String,
        min: u64,
        max: u64,
    },
    #[error("`{0}` is not of the form NAME=VALUE")]
    Malformed(String),
}

/// A field that holds a limit: how the limit's number becomes the field's
/// value and back (milliseconds become a `Duration`).
pub trait LimitValue {
    fn from_limit(v: u64) -> Self;
    fn to_limit(&self) -> u64;
}

impl LimitValue for Duration {
    fn from_limit(v: u64) -> Self {
        Duration::from_millis(v)
    }
    fn to_limit(&self) -> u64 {
        self.as_millis() as u64
    }
}

impl LimitValue for u64 {
    fn from_limit(v: u64) -> Self {
        v
    }
    fn to_limit(&self) -> u64 {
        *self
    }
}

impl LimitValue for usize {
    fn from_limit(v: u64) -> Self {
        v as usize
    }
    fn to_limit(&self) -> u64 {
        *self as u64
    }
}

impl LimitValue for u32 {
    fn from_limit(v: u64) -> Self {
        v as u32
    }
    fn to_limit(&self) -> u64 {
        *self as u64
    }
}

/// A table of limits declared with [`limit_table!`](crate::limit_table!): what a configuration
/// reader needs to set limits of several tables by their flat names.
pub trait LimitTable {
    fn specs() -> &'static [LimitSpec];
    /// The current value of a limit, in its spec's unit.
    fn value(&self, name: &str) -> Option<u64>;
    /// Stores an already checked value; false for a name not in the table.
    fn store(&mut self, name: &str, value: u64) -> bool;

    /// Sets one limit by its flat name, checking the range.
    fn set_limit(&mut self, name: &str, value: &str) -> Result<(), LimitError> {
        let spec = Self::specs()
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| LimitError::Unknown {
                name: name.to_string(),
                known: known_names(Self::specs()),
            })?;
        let parsed = parse_value(value)
            .filter(|v| (spec.min..=spec.max).contains(v))
            .ok_or_else(|| LimitError::OutOfRange {
                name: spec.name,
                value: value.to_string(),
                min: spec.min,
                max: spec.max,
            })?;
        self.store(spec.name, parsed);
        Ok(())
    }
}

/// The names of `specs`, for an error message.
pub fn known_names(specs: &[LimitSpec]) -> String {
    specs.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

/// `e`, with an unknown name's list of known names covering every table of
/// `tables`: what a reader that sets several tables by flat name says.
pub fn unknown_among(e: LimitError, tables: &[&[LimitSpec]]) -> LimitError {
    match e {
        LimitError::Unknown { name, .. } => LimitError::Unknown {
            name,
            known: tables
                .iter()
                .map(|specs| known_names(specs))
                .collect::<Vec<_>>()
                .join(", "),
        },
        other => other,
    }
}

/// Splits a `NAME=VALUE` assignment, as given on the command line.
pub fn split_assignment(assignment: &str) -> Result<(&str, &str), LimitError> {
    assignment
        .split_once('=')
        .map(|(n, v)| (n.trim(), v.trim()))
        .ok_or_else(|| LimitError::Malformed(assignment.to_string()))
}

/// Declares a table of limits once: the struct and its fields, each
/// limit's spec (name, default, range, unit, meaning), `Default`, and
/// `set` / `apply` / `get` by flat name.
#[macro_export]
macro_rules! limit_table {
    (
        $(#[$smeta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                $field:ident : $ty:ty = $spec:literal {
                    default: $default:expr,
                    range: $min:expr, $max:expr,
                    unit: $unit:ident,
                    meaning: $meaning:literal $(,)?
                }
            ),* $(,)?
        }
    ) => {
        $(#[$smeta])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        $vis struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $name {
            /// Every limit of the table, in the order the README lists them.
            pub const SPECS: &'static [$crate::limit_table::LimitSpec] = &[
                $( $crate::limit_table::LimitSpec {
                    name: $spec,
                    default: $default,
                    min: $min,
                    max: $max,
                    unit: $crate::limit_table::Unit::$unit,
                    meaning: $meaning,
                }, )*
            ];

            /// Sets one limit by its flat name, checking the range.
            pub fn set(&mut self, name: &str, value: &str) -> Result<(), $crate::limit_table::LimitError> {
                $crate::limit_table::LimitTable::set_limit(self, name, value)
            }

            /// Applies one `NAME=VALUE` assignment.
            pub fn apply(&mut self, assignment: &str) -> Result<(), $crate::limit_table::LimitError> {
                let (name, value) = $crate::limit_table::split_assignment(assignment)?;
                self.set(name, value)
            }

            /// The current value of a limit by name, in its spec's unit.
            pub fn get(&self, name: &str) -> Option<u64> {
                $crate::limit_table::LimitTable::value(self, name)
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    $( $field: <$ty as $crate::limit_table::LimitValue>::from_limit($default), )*
                }
            }
        }

        impl $crate::limit_table::LimitTable for $name {
            fn specs() -> &'static [$crate::limit_table::LimitSpec] {
                Self::SPECS
            }
            fn value(&self, name: &str) -> Option<u64> {
                match name {
                    $( $spec => Some($crate::limit_table::LimitValue::to_limit(&self.$field)), )*
                    _ => None,
                }
            }
            fn store(&mut self, name: &str, value: u64) -> bool {
                match name {
                    $( $spec => {
                        self.$field = $crate::limit_table::LimitValue::from_limit(value);
                        true
                    } )*
                    _ => false,
                }
            }
        }
    };
}

/// Accepts plain integers, with `_` separators allowed for readability
/// (`1_048_576`).
fn parse_value(value: &str) -> Option<u64> {
    let digits: String = value.chars().filter(|c| *c != '_').collect();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// What the README's limits table says wrong about `specs`: each limit
/// must have a row `| `name` | default | min..=max | …`. Empty when the
/// README agrees with the code.
pub fn readme_disagreements(specs: &[LimitSpec], readme: &str) -> Vec<String> {
    specs
        .iter()
        .filter_map(|spec| {
            let start = format!("| `{}` | {}", spec.name, spec.default);
            let range = format!("{}..={}", spec.min, spec.max);
            let row = readme
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", spec.name)));
            match row {
                None => Some(format!("{}: no row", spec.name)),
                Some(row) if !row.starts_with(&start) || !row.contains(&range) => Some(format!(
                    "{}: the row should start `{start}` and say `{range}`: {row}",
                    spec.name
                )),
                Some(_) => None,
            }
        })
        .collect()
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unit::Millis => "ms",
            Unit::Bytes => "bytes",
            Unit::Count => "count",
        })
    }
}
