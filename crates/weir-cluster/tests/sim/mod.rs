//! The simulation's parts.

pub mod link;
pub mod model;
pub mod object;
