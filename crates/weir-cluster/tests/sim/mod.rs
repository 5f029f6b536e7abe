//! The simulation's parts.

pub mod model;
